"""The tunable-op runtime, after ONNX Runtime's and PyTorch's TunableOp: candidates behind one call
(``candidate``), their inputs and signature (``params``), kernel configurations as values
(``config``), the tunable op and its cached call (``tunable_op``, ``fast_path``), the choice
(``screen`` -> ``find_fastest`` -> ``host_time``), timing, numerics, settings (``context``), the
results store (``entries``, ``results``, ``stores``, ``validators``), the registry and ``explain``.

It imports nothing else of tunekit: backends, ops and everything above build on it.
"""

from .candidate import Candidate, FunctionCandidate, as_candidate, candidate
from .config import Config
from .context import TuningSettings, configure, current, reload_environment, tuning
from .errors import ResultsImportError, TunekitWarning
from .explain import Explanation, explain
from .find_fastest import TuningReport, find_fastest
from .params import OpParams, clone_exact, empty_exact, make_trial
from .registry import all_ops, get_op, register
from .stores import results_store
from .tunable_op import Resolution, TunableOp

__all__ = [
    "Candidate", "FunctionCandidate", "as_candidate", "candidate", "Config",
    "TuningSettings", "configure", "current", "reload_environment", "tuning",
    "ResultsImportError", "TunekitWarning", "Explanation", "explain", "TuningReport", "find_fastest",
    "OpParams", "clone_exact", "empty_exact", "make_trial", "all_ops", "get_op", "register",
    "results_store", "Resolution", "TunableOp",
]
