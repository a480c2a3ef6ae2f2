"""silu (swish): ``y = x * sigmoid(x)``, as ``torch.nn.functional.silu``.

Candidates (this file registers them; kernels live in ``tunekit/kernels/<backend>/``):

- ``torch_silu`` (default): PyTorch's fused kernel. Runs any input.
- ``torch_x_sigmoid``: the composite ``x * sigmoid(x)``: two kernels and a temporary, the seeds'
  "torch" baseline; kept as a candidate so tuning shows why it loses.
- ``silu_<form>``: CUDA C kernels from ``kernels/cuda/silu.cu`` (the seed's f32, f32x4, f16, f16x2,
  f16x8, f16x8_pack, the same in bf16, and two-pack forms with more bytes in flight per thread),
  compiled with NVRTC; contiguous tensors whose pointers are aligned for the load width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._arguments import check_float_tensor, elementwise_destination
from ._cuda_elementwise import CudaElementwise
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
        if x.is_contiguous():  # candidates see a flat array: the element count is the shape that matters
            return (x.dtype, x.numel(), x.data_ptr() & 15, x.device, tail)
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


def make_params(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> SiluParams:
    """Validate the public arguments into params."""
    check_float_tensor("silu", x)
    return SiluParams(x, elementwise_destination("silu", x, out, inplace))


def make_example(shape, dtype=torch.float32, device="cpu") -> SiluParams:
    return SiluParams(torch.randn(shape, dtype=dtype, device=device))


silu_op = register(TunableOp("silu", SiluParams, make_params=make_params, make_example=make_example))
silu_op.add(torch_silu, default=True)
silu_op.add(torch_x_sigmoid)

#: (kernel name in silu.cu, dtype, bytes per load, elements per thread)
CUDA_VARIANTS = [
    ("silu_f32", torch.float32, 4, 1), ("silu_f32x4", torch.float32, 16, 4), ("silu_f32x8_pack2", torch.float32, 16, 8),
    ("silu_f16", torch.float16, 2, 1), ("silu_f16x2", torch.float16, 4, 2), ("silu_f16x8", torch.float16, 4, 8),
    ("silu_f16x8_pack", torch.float16, 16, 8), ("silu_f16x16_pack2", torch.float16, 16, 16),
    ("silu_bf16", torch.bfloat16, 2, 1), ("silu_bf16x2", torch.bfloat16, 4, 2), ("silu_bf16x8", torch.bfloat16, 4, 8),
    ("silu_bf16x8_pack", torch.bfloat16, 16, 8), ("silu_bf16x16_pack2", torch.bfloat16, 16, 16),
]
for _name, _dtype, _load, _per_thread in CUDA_VARIANTS:
    silu_op.add(CudaElementwise("silu.cu", _name, _dtype, _load, _per_thread))


def silu(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """``x * sigmoid(x)``, element by element, by the fastest correct candidate for these inputs.

    Same results and semantics as ``torch.nn.functional.silu``; ``out=`` writes into a given tensor,
    ``inplace=True`` into ``x``. When autograd must record the call it runs PyTorch's kernel.
    """
    if out is None and not inplace and type(x) is torch.Tensor and x.is_floating_point():
        if not (x.requires_grad and _grad_enabled()):  # the common call, kept short
            return _silu_call(SiluParams(x))
    params = make_params(x, out=out, inplace=inplace)
    if x.requires_grad and torch.is_grad_enabled():
        return torch_silu(params)
    return _silu_call(params)


_silu_call = silu_op.call
_grad_enabled = torch.is_grad_enabled
swish = silu
