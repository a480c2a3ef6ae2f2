"""tunekit's ops, one module each: params, candidates, the tunable op and the public function."""

from .silu import silu, swish

__all__ = ["silu", "swish"]
