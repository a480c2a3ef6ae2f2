"""tunekit's ops, one module (or small package) each: params, candidates, tunable ops, public
functions, autograd, ``torch.library`` custom ops, drop-in modules and patch targets together
(``ops/silu.py`` is the simplest; ``ops/_shared/`` holds what several ops use).

Adding an op is its module plus its line below: the import names its family (an
:class:`~tunekit.ops._shared.family.OpFamily`) and public functions, and :data:`FAMILIES` lists it.
``tunekit`` exports the functions, ``tunekit.nn`` the modules, ``tunekit.patch()`` the patch targets.
"""

from .silu import FAMILY as SILU, silu, silu_backward, swish  # noqa: F401
from .gelu import FAMILY as GELU, gelu, gelu_backward  # noqa: F401
from .logsumexp import FAMILY as LOGSUMEXP, logsumexp, logsumexp_backward  # noqa: F401
from .rms_norm import FAMILY as RMS_NORM, rms_norm, rms_norm_backward  # noqa: F401
from .gemm import FAMILY as GEMM, addmm, addmm_, baddbmm, bmm, linear, linear_act, matmul, mm  # noqa: F401

from ..backends import stored_hashes
from ..tunable import validators

validators.use_op_hashes(stored_hashes.candidate_hashes)  # each op's candidate hashes kept between processes

#: every op family, in the order ``tunekit.patch()`` applies them
FAMILIES = (SILU, GELU, LOGSUMEXP, RMS_NORM, GEMM)

#: op name -> its torch.library custom op (``torch.ops.tunekit.<name>`` is the same op)
CUSTOM_OPS = {name: op for family in FAMILIES for name, op in family.custom_ops.items()}

#: the public functions (``tunekit.<name>``)
__all__ = [name for family in FAMILIES for name in family.functions]
