"""tunekit: fast, tunable GPU operators for PyTorch.

Each op has several candidate implementations; on the first call with a new input signature the
runtime times the candidates that support it and agree with the default numerically, stores the
fastest in a results file, and runs it from then on. See ``docs/architecture.md``.

Drop-in use in existing PyTorch code: ``tunekit.nn.SiLU`` / ``tunekit.nn.GELU`` (torch's modules,
tunekit's forward) and ``tunekit.patch()`` (torch's functions and module forwards rerouted, undoably).
"""

__version__ = "0.1.0"

from .ops import gelu, gelu_backward, logsumexp, logsumexp_backward, silu, silu_backward, swish
from . import library  # noqa: F401  registers torch.ops.tunekit.* (torch.compile support)
from . import distributed
from . import nn
from .patch import Patch, patch  # the function shadows the submodule's name: import tunekit.patch's names from it
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

__all__ = ["silu", "swish", "silu_backward", "gelu", "gelu_backward", "logsumexp", "logsumexp_backward", "tuning", "settings", "configure", "explain", "results_store",
           "nn", "patch", "Patch", "distributed", "Explanation", "TuningSettings", "TunekitWarning", "__version__"]

distributed.enable_from_environment()  # TUNEKIT_DISTRIBUTED=1: rank 0 decides for every rank
