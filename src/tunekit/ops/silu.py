"""silu (swish): ``y = x * sigmoid(x)`` as ``torch.nn.functional.silu``, and its gradient.

Two tunable ops, each with its candidates (kernels live in ``tunekit/kernels/<backend>/``):

``silu``
- ``torch_silu`` (default): PyTorch's fused kernel. Runs any input.
- ``torch_x_sigmoid``: the composite ``x * sigmoid(x)`` (two kernels and a temporary), the seeds'
  "torch" baseline; kept so tuning shows why it loses.
- ``silu_<form>``: CUDA C (``kernels/cuda/silu.cu``): the seeds' f32, f32x4, f16, f16x2, f16x8,
  f16x8_pack, the same in bf16, and strided multi-pack and persistent forms with more bytes in
  flight; contiguous tensors aligned for the access width.
- ``silu_triton_b<BLOCK>_w<warps>``: Triton (``kernels/triton/activations.py``).

``silu_backward`` (``dx = dy * s * (1 + x * (1 - s))``, ``s = sigmoid(x)``): ``torch_silu_backward``
(default, ``aten.silu_backward``), the same CUDA C forms and Triton configurations.

Autograd: :func:`silu` on a tensor that requires grad runs the tuned forward and records
:class:`SiluFunction`, whose backward calls the tuned :func:`silu_backward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._arguments import check_float_tensor, check_gradient_pair, elementwise_destination
from ._cuda_elementwise import cuda_candidates
from ._elementwise import GradParams, UnaryParams, triton_candidates
from ..tunable.context import captured, inherited
from ..tunable.registry import register
from ..tunable.tunable_op import TunableOp

__all__ = ["SiluParams", "SiluBackwardParams", "SiluFunction", "silu", "swish", "silu_backward", "silu_op",
           "silu_backward_op"]

_silu = torch._C._nn.silu
_aten_silu_backward = torch.ops.aten.silu_backward.default
_aten_silu_backward_out = torch.ops.aten.silu_backward.grad_input


class SiluParams(UnaryParams):
    op_name = "silu"


class SiluBackwardParams(GradParams):
    op_name = "silu_backward"


# -- forward candidates ---------------------------------------------------------------------------
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
    return SiluParams(torch.randn(shape, dtype=dtype, device=device) * 3)


silu_op = register(TunableOp("silu", SiluParams, make_params=make_params, make_example=make_example))
silu_op.add(torch_silu, default=True, fast_runner=lambda p: _silu)  # run(p) is _silu(p.x) when out is None
silu_op.add(torch_x_sigmoid)
for _c in cuda_candidates("silu.cu", "silu") + triton_candidates("silu", "silu_forward_kernel", ("x",)):
    silu_op.add(_c)


# -- backward candidates --------------------------------------------------------------------------
def torch_silu_backward(p: SiluBackwardParams) -> torch.Tensor:
    """PyTorch's fused gradient kernel."""
    if p.out is None:
        return _aten_silu_backward(p.dy, p.x)
    return _aten_silu_backward_out(p.dy, p.x, grad_input=p.out)


def make_backward_params(dy: torch.Tensor, x: torch.Tensor) -> SiluBackwardParams:
    check_gradient_pair("silu_backward", dy, x)
    return SiluBackwardParams(dy, x)


def make_backward_example(shape, dtype=torch.float32, device="cpu") -> SiluBackwardParams:
    return SiluBackwardParams(torch.randn(shape, dtype=dtype, device=device),
                              torch.randn(shape, dtype=dtype, device=device) * 3)


silu_backward_op = register(TunableOp("silu_backward", SiluBackwardParams, make_params=make_backward_params,
                                      make_example=make_backward_example))
silu_backward_op.add(torch_silu_backward, default=True)
for _c in (cuda_candidates("silu.cu", "silu_backward", inputs=("dy", "x"))
           + triton_candidates("silu_backward", "silu_backward_kernel", ("dy", "x"))):
    silu_backward_op.add(_c)


# -- public functions -----------------------------------------------------------------------------
class SiluFunction(torch.autograd.Function):
    """Autograd for :func:`silu`: the tuned forward, the tuned backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.tuning = captured()  # the backward may run on autograd's thread
        return _silu_call(SiluParams(x))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        with inherited(ctx.tuning):
            return silu_backward(dy, x)


def silu(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """``x * sigmoid(x)``, element by element, by the fastest correct candidate for these inputs.

    Same results and semantics as ``torch.nn.functional.silu``; ``out=`` writes into a given tensor,
    ``inplace=True`` into ``x``. Differentiable: a tensor that requires grad gets the tuned backward.
    ``out=`` and ``inplace=True`` under autograd run PyTorch's kernel, with PyTorch's rules.
    """
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_silu
        return compiled_silu(x, out=out, inplace=inplace)
    if out is None and not inplace:  # the common call, kept short
        y = silu_op.fast_call(x)  # the cached choice's runner (tunable/fast_path.py), or None
        if y is not None:
            return y
        if type(x) is torch.Tensor and x.is_floating_point():
            if not (x.requires_grad and _grad_enabled()):
                return _silu_call(SiluParams(x))
            return SiluFunction.apply(x)
    params = make_params(x, out=out, inplace=inplace)
    if x.requires_grad and torch.is_grad_enabled():
        return SiluFunction.apply(x) if params.out is None else torch_silu(params)
    return _silu_call(params)


def silu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`silu` at ``x`` for the incoming gradient ``dy`` (``aten.silu_backward``).

    When the result itself must be differentiable (double backward), differentiable torch ops run.
    """
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_silu_backward
        return compiled_silu_backward(dy, x)
    params = make_backward_params(dy, x)
    if _grad_enabled() and (dy.requires_grad or x.requires_grad):
        # aten.silu_backward has no derivative; autograd's own double backward uses this composite
        s = torch.sigmoid(x)
        return dy * s * (1 + x * (1 - s))
    return _silu_backward_call(params)


_silu_call = silu_op.call
_silu_backward_call = silu_backward_op.call
_grad_enabled = torch.is_grad_enabled
swish = silu
_is_compiling = torch.compiler.is_compiling
