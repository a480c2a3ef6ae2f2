"""tunekit's ops, one module each: params, candidates, the tunable ops and the public functions."""

from .gelu import gelu, gelu_backward
from .logsumexp import logsumexp, logsumexp_backward
from .silu import silu, silu_backward, swish

__all__ = ["silu", "swish", "silu_backward", "gelu", "gelu_backward", "logsumexp", "logsumexp_backward"]
