"""silu (swish): ``y = x * sigmoid(x)``, as ``torch.nn.functional.silu``.

Candidates (this file registers them; kernels live in ``tunekit/kernels/<backend>/``):

- ``torch_silu`` (default): PyTorch's fused kernel. Runs any input.
- ``torch_x_sigmoid``: the composite ``x * sigmoid(x)``: two kernels and a temporary, the seeds'
  "torch" baseline; kept as a candidate so tuning shows why it loses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tunable.params import OpParams, tensor_key, tensor_signature
from ..tunable.registry import register
from ..tunable.tunable_op import TunableOp

__all__ = ["SiluParams", "silu", "swish", "silu_op"]

_silu = torch._C._nn.silu


class SiluParams(OpParams):
    """``x`` in, ``out`` written. ``out`` None: the candidate allocates; ``out is x``: in place."""

    op_name = "silu"
    inputs = ("x",)
    outputs = ("out",)
    __slots__ = ("x", "out")

    def __init__(self, x: torch.Tensor, out: torch.Tensor | None = None):
        self.x = x
        self.out = out

    def cache_key(self):
        x, out = self.x, self.out
        tail = None if out is None else "inplace" if out is x else tensor_key(out)
        return (x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.device, tail)

    def signature(self) -> str:
        x, out = self.x, self.out
        if out is None:
            dest = "new"
        elif out is x:
            dest = "inplace"
        else:
            dest = tensor_signature(out, shape_matters=False)
        return f"x={tensor_signature(x, shape_matters=False)} out={dest} {x.device.type}"

    def new_outputs(self):
        return {"out": torch.empty_like(self.x)}


def torch_silu(p: SiluParams) -> torch.Tensor:
    """PyTorch's own fused kernel (autograd-aware when no ``out`` is given)."""
    if p.out is None:
        return _silu(p.x)  # F.silu without its Python wrapper (the binding still honours __torch_function__)
    if p.out is p.x:
        return F.silu(p.x, inplace=True)
    return _silu(p.x, out=p.out)


def torch_x_sigmoid(p: SiluParams) -> torch.Tensor:
    """``x * sigmoid(x)``: two kernels and a full-size temporary."""
    if p.out is None:
        return p.x * torch.sigmoid(p.x)
    return torch.mul(p.x, torch.sigmoid(p.x), out=p.out)


def _check_out(x: torch.Tensor, out: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"tunekit.silu: out must be a tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"tunekit.silu: out must match x in shape, dtype and device: x is {x.dtype}{list(x.shape)} "
                         f"on {x.device}, out is {out.dtype}{list(out.shape)} on {out.device}")
    if out.numel() > 1 and any(st == 0 and sz > 1 for sz, st in zip(out.shape, out.stride())):
        raise ValueError("tunekit.silu: out has overlapping elements (an expanded tensor) and cannot be written")
    if out is not x and out.numel() and x.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        same = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
        if not same and _overlaps(x, out):
            raise ValueError("tunekit.silu: out partially overlaps x; pass inplace=True or a separate tensor")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    def span(t):
        n = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + n * t.element_size()
    a0, a1 = span(a)
    b0, b1 = span(b)
    return a0 < b1 and b0 < a1


def make_params(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> SiluParams:
    """Validate the public arguments into params."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tunekit.silu: x must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"tunekit.silu: x must be a floating-point tensor, got {x.dtype}")
    if inplace:
        if out is not None:
            raise ValueError("tunekit.silu: pass either out= or inplace=True, not both")
        if x.numel() > 1 and any(st == 0 and sz > 1 for sz, st in zip(x.shape, x.stride())):
            raise ValueError("tunekit.silu: cannot work in place on an expanded tensor (overlapping elements)")
        out = x
    elif out is not None:
        _check_out(x, out)
        if out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.numel():
            out = x  # the same memory: an in-place call
    return SiluParams(x, out)


def make_example(shape, dtype=torch.float32, device="cpu") -> SiluParams:
    return SiluParams(torch.randn(shape, dtype=dtype, device=device))


silu_op = register(TunableOp("silu", SiluParams, make_params=make_params, make_example=make_example))
silu_op.add(torch_silu, default=True)
silu_op.add(torch_x_sigmoid)


def silu(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """``x * sigmoid(x)``, element by element, by the fastest correct candidate for these inputs.

    Same results and semantics as ``torch.nn.functional.silu``; ``out=`` writes into a given tensor,
    ``inplace=True`` into ``x``. When autograd must record the call it runs PyTorch's kernel.
    """
    if out is None and not inplace and type(x) is torch.Tensor and x.is_floating_point():
        if not (x.requires_grad and torch.is_grad_enabled()):  # the common call, kept short
            return silu_op(SiluParams(x))
    params = make_params(x, out=out, inplace=inplace)
    if x.requires_grad and torch.is_grad_enabled():
        return torch_silu(params)
    return silu_op(params)


swish = silu
