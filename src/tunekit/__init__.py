"""tunekit: fast, tunable GPU operators for PyTorch.

Each op has several candidate implementations; on the first call with a new input signature the
runtime times the candidates that support it and agree with the default numerically, stores the
fastest in a results file, and runs it from then on. See ``docs/architecture.md``.

Drop-in use in existing PyTorch code: ``tunekit.nn`` (torch's modules, tunekit's forward) and
``tunekit.patch()`` (torch's functions and module forwards rerouted, undoably).

The package, by layer (each imports only from the layers before it): ``tunable`` (the runtime),
``backends`` (building and launching kernels), ``kernels`` (sources), ``ops`` (one module per op),
``torch_compat`` (modules, patch), ``offline`` and ``bench``, and ``cli``.
"""

import sys as _sys

from ._version import __version__
from .backends import cache as _backend_cache, env as _backend_env
from .ops import *  # noqa: F403  every op's public functions: silu, swish, gelu, logsumexp, ... (ops/__init__.py)
from .ops import __all__ as _op_functions
from .offline import distributed
from .torch_compat import nn
from .torch_compat.patch import Patch, patch
from .tunable import (
    Explanation,
    TunekitWarning,
    TuningSettings,
    configure,
    current as settings,
    explain,
    results_store,
    tuning,
)
from .tunable.context import exit_if_command as _exit_if_command

_sys.modules[__name__ + ".nn"] = nn  # ``import tunekit.nn`` / ``from tunekit.nn import SiLU``, as torch.nn

__all__ = [*_op_functions, "tuning", "settings", "configure", "explain", "results_store", "nn", "patch", "Patch",
           "distributed", "Explanation", "TuningSettings", "TunekitWarning", "__version__"]

try:  # the backends' variables (read at a kernel's first load or launch) are checked now, on any machine
    _backend_env.check_switches()
    _backend_cache.cache_root()
except _backend_env.SettingError as _error:
    _exit_if_command(_error)
    raise

distributed.enable_from_environment()  # TUNEKIT_DISTRIBUTED=1: rank 0 decides for every rank
