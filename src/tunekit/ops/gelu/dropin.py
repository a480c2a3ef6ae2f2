"""gelu in code you did not write: the drop-in :class:`GELU` module (``tunekit.nn.GELU``) and the
``tunekit.patch()`` replacements of ``F.gelu`` and ``nn.GELU.forward``."""

from __future__ import annotations

import torch

from .op import approximation, gelu, gelu_op
from .._shared import routing

__all__ = ["GELU", "routed_gelu", "patched_functional", "patched_forward"]

_gelu_ = torch._C._nn.gelu_


def routed_gelu(x: torch.Tensor, approximate: str, inplace: bool = False, out=None) -> torch.Tensor:
    """:func:`gelu` for a call routed from torch's entry points (``ops/silu.py``'s ``routed_silu``)."""
    if out is None and not inplace:
        y = gelu_op.fast_call(x, approximate)
        if y is not None:
            return y
    state = routing.state
    state.inside = True
    try:
        return gelu(x, approximate=approximate, inplace=inplace, out=out)
    finally:
        state.inside = False


class GELU(torch.nn.GELU):
    """``torch.nn.GELU(approximate="none")`` whose forward runs :func:`tunekit.gelu` where tunekit
    gives torch's results (``ops/_shared/routing.py``), torch's own forward for any other input.

    ``inplace=True`` (keyword only, not in torch's module; torch has ``torch._C._nn.gelu_``) writes
    the result into the input, as ``SiLU(inplace=True)`` does, saving an allocation where the
    input is not needed afterwards. The default keeps torch's constructor, repr and behaviour.
    """

    #: the default for instances unpickled from before the attribute existed
    inplace: bool = False

    def __init__(self, approximate: str = "none", *, inplace: bool = False) -> None:
        super().__init__(approximate)
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        approximate, inplace = self.approximate, self.inplace
        if approximation(approximate) and type(inplace) is bool and routing.takes(input):
            return routed_gelu(input, approximate, inplace)
        if inplace:
            return _gelu_(input, approximate=approximate)
        return super().forward(input)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return f"{text}, inplace=True" if self.inplace else text


def patched_functional(attr):
    """``F.gelu``'s replacement: ``F.gelu(input, *, approximate='none', out=None)`` as torch binds it
    (a positional ``approximate`` reaches torch, which refuses it)."""
    def gelu(*args, **kwargs):
        if attr.users:
            if len(args) == 1 and not kwargs:
                x, approximate, out = args[0], "none", None
            elif len(args) == 1 and len(kwargs) == 1 and "approximate" in kwargs:  # F.gelu(x, approximate="tanh")
                x, approximate, out = args[0], kwargs["approximate"], None  # (bind's general walk: ~2 us more)
            else:
                bound = routing.bind(args, kwargs, ("input",), ("approximate", "out"),
                                     {"approximate": "none", "out": None}) or {}
                x, approximate, out = bound.get("input"), bound.get("approximate"), bound.get("out")
            if approximation(approximate) and routing.takes(x):
                return routed_gelu(x, approximate, out=out)
        return attr.original(*args, **kwargs)
    return gelu


def patched_forward(attr):
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs:
            approximate = self.approximate
            if approximation(approximate) and routing.takes(args[0]):
                return routed_gelu(args[0], approximate)
        return attr.original(self, *args, **kwargs)
    return forward
