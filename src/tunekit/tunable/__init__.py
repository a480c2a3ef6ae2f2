"""The tunable-op runtime: candidates, params, the tunable op, settings, results, timing, numerics."""

from .candidate import Candidate, FunctionCandidate, as_candidate, candidate
from .context import TuningSettings, configure, current, reload_environment, tuning
from .errors import ResultsImportError, TunekitWarning
from .explain import Explanation, explain
from .find_fastest import TuningReport, find_fastest
from .params import OpParams, clone_exact, empty_exact, make_trial
from .registry import all_ops, get_op, register
from .stores import results_store
from .tunable_op import Resolution, TunableOp

__all__ = [
    "Candidate", "FunctionCandidate", "as_candidate", "candidate",
    "TuningSettings", "configure", "current", "reload_environment", "tuning",
    "ResultsImportError", "TunekitWarning", "Explanation", "explain", "TuningReport", "find_fastest",
    "OpParams", "clone_exact", "empty_exact", "make_trial", "all_ops", "get_op", "register",
    "results_store", "Resolution", "TunableOp",
]
