"""gelu as ``torch.nn.functional.gelu``, both forms, and its gradient.

- ``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``
- ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``

Two tunable ops, each with its candidates (kernels live in ``tunekit/kernels/<backend>/``):

``gelu``
- ``torch_gelu`` (default): PyTorch's fused kernel, both forms. Runs any input.
- ``gelu_<form>`` (erf) and ``gelu_tanh_<form>``: CUDA C (``kernels/cuda/gelu.cu``), fp32 math for
  every storage type (the seed's half-precision tanh turned into NaN for x > ~4), the forms of
  ``kernels/cuda/elementwise.cuh``; each declines the other ``approximate``.
- ``gelu_triton_b<BLOCK>_w<warps>``: Triton, both forms (a compile-time switch).

``gelu_backward``: ``torch_gelu_backward`` (default, ``aten.gelu_backward``), the CUDA C forms
(``gelu_backward_<form>``, ``gelu_tanh_backward_<form>``) and Triton configurations.

Autograd: :func:`gelu` on a tensor that requires grad records :class:`GeluFunction`, whose
backward calls the tuned :func:`gelu_backward`.
"""

from __future__ import annotations

import torch

from ._arguments import check_approximate, check_float_tensor, check_gradient_pair, elementwise_destination
from ._cuda_elementwise import cuda_candidates
from ._elementwise import GradParams, UnaryParams, triton_candidates, with_arguments
from ..tunable.numerics import tolerance
from ..tunable.context import captured, inherited
from ..tunable.registry import register
from ..tunable.tunable_op import TunableOp

__all__ = ["GeluParams", "GeluBackwardParams", "GeluFunction", "gelu", "gelu_backward", "gelu_op", "gelu_backward_op"]

_gelu = torch._C._nn.gelu
_gelu_ = torch._C._nn.gelu_
_aten_gelu_backward = torch.ops.aten.gelu_backward.default
_aten_gelu_backward_out = torch.ops.aten.gelu_backward.grad_input


class _Approximate:
    """What both gelu ops add to their params: the ``approximate`` argument ("none" or "tanh"),
    part of the cache key, the signature and the spec."""

    __slots__ = ()

    def cache_key(self):
        return (super().cache_key(), self.approximate)

    def signature(self) -> str:
        return f"{super().signature()} approximate={self.approximate}"

    def spec(self):
        return with_arguments(super().spec(), approximate=self.approximate)


class GeluParams(_Approximate, UnaryParams):
    op_name = "gelu"
    __slots__ = ("approximate",)

    def __init__(self, x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None):
        UnaryParams.__init__(self, x, out)
        self.approximate = approximate


class GeluBackwardParams(_Approximate, GradParams):
    op_name = "gelu_backward"
    __slots__ = ("approximate",)

    def __init__(self, dy: torch.Tensor, x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None):
        GradParams.__init__(self, dy, x, out)
        self.approximate = approximate


#: float32 absolute tolerance of both gelu ops. PyTorch's own fp32 kernels are this far from float64:
#: up to 1.2e-6 (erf on the CPU) and 3.6e-6 (tanh backward: ``1 - tanh^2`` cancels for |x| > 4, and
#: |dy| reaches ~4), measured on 4M N(0, 9) samples; a kernel with another tanh or order of
#: operations differs from torch by as much, and must not be rejected for it.
FLOAT32_ATOL = 8e-6


def gelu_tolerance(p) -> tuple[float, float]:
    rtol, atol = tolerance(p.x.dtype)
    return (rtol, max(atol, FLOAT32_ATOL)) if p.x.dtype == torch.float32 else (rtol, atol)


def _tanh_flag(p) -> dict:
    return {"TANH": p.approximate == "tanh"}


# -- forward --------------------------------------------------------------------------------------
def torch_gelu(p: GeluParams) -> torch.Tensor:
    """PyTorch's own fused kernel (autograd-aware when no ``out`` is given)."""
    if p.out is None:
        return _gelu(p.x, approximate=p.approximate)
    if p.out is p.x:
        return _gelu_(p.x, approximate=p.approximate)
    return _gelu(p.x, approximate=p.approximate, out=p.out)


def _torch_gelu_runner(approximate: str):
    """``torch_gelu``'s run for ``out`` None with ``approximate`` bound (a runner: see tunable_op)."""
    if approximate == "none":
        return _gelu
    return lambda x: _gelu(x, approximate=approximate)


def make_params(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
                inplace: bool = False) -> GeluParams:
    """Validate the public arguments into params."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    return GeluParams(x, approximate, elementwise_destination("gelu", x, out, inplace))


def make_example(shape, dtype=torch.float32, device="cpu", approximate: str = "none") -> GeluParams:
    return GeluParams(torch.randn(shape, dtype=dtype, device=device) * 3, approximate)


gelu_op = register(TunableOp("gelu", GeluParams, make_params=make_params, make_example=make_example,
                             tolerance=gelu_tolerance))
gelu_op.add(torch_gelu, default=True, fast_runner=lambda p: _torch_gelu_runner(p.approximate))
for _c in (cuda_candidates("gelu.cu", "gelu", when={"approximate": "none"})
           + cuda_candidates("gelu.cu", "gelu_tanh", when={"approximate": "tanh"})
           + triton_candidates("gelu", "gelu_forward_kernel", ("x",), _tanh_flag)):
    gelu_op.add(_c)


# -- backward -------------------------------------------------------------------------------------
def torch_gelu_backward(p: GeluBackwardParams) -> torch.Tensor:
    """PyTorch's fused gradient kernel."""
    if p.out is None:
        return _aten_gelu_backward(p.dy, p.x, approximate=p.approximate)
    return _aten_gelu_backward_out(p.dy, p.x, approximate=p.approximate, grad_input=p.out)


def make_backward_params(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> GeluBackwardParams:
    check_gradient_pair("gelu_backward", dy, x)
    check_approximate("gelu_backward", approximate)
    return GeluBackwardParams(dy, x, approximate)


def make_backward_example(shape, dtype=torch.float32, device="cpu", approximate: str = "none") -> GeluBackwardParams:
    return GeluBackwardParams(torch.randn(shape, dtype=dtype, device=device),
                              torch.randn(shape, dtype=dtype, device=device) * 3, approximate)


gelu_backward_op = register(TunableOp("gelu_backward", GeluBackwardParams, make_params=make_backward_params,
                                      make_example=make_backward_example, tolerance=gelu_tolerance))
gelu_backward_op.add(torch_gelu_backward, default=True)
for _c in (cuda_candidates("gelu.cu", "gelu_backward", inputs=("dy", "x"), when={"approximate": "none"})
           + cuda_candidates("gelu.cu", "gelu_tanh_backward", inputs=("dy", "x"), when={"approximate": "tanh"})
           + triton_candidates("gelu_backward", "gelu_backward_kernel", ("dy", "x"), _tanh_flag)):
    gelu_backward_op.add(_c)


# -- public functions -----------------------------------------------------------------------------
class GeluFunction(torch.autograd.Function):
    """Autograd for :func:`gelu`: the tuned forward, the tuned backward."""

    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.tuning = captured()  # the backward may run on autograd's thread
        ctx.approximate = approximate
        return _gelu_call(GeluParams(x, approximate))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        with inherited(ctx.tuning):
            return gelu_backward(dy, x, ctx.approximate), None


def gelu(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
         inplace: bool = False) -> torch.Tensor:
    """GELU, element by element, by the fastest correct candidate for these inputs.

    Same results and semantics as ``torch.nn.functional.gelu``; ``out=`` writes into a given tensor,
    ``inplace=True`` into ``x``. Differentiable: a tensor that requires grad gets the tuned backward.
    ``out=`` and ``inplace=True`` under autograd run PyTorch's kernel, with PyTorch's rules.
    """
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_gelu
        return compiled_gelu(x, approximate, out=out, inplace=inplace)
    if out is None and not inplace:  # the common call, kept short
        y = gelu_op.fast_call(x, approximate)  # the cached choice's runner (tunable/fast_path.py), or None
        if y is not None:
            return y
        if type(x) is torch.Tensor and x.is_floating_point() and (approximate == "none" or approximate == "tanh"):
            if not (x.requires_grad and _grad_enabled()):
                return _gelu_call(GeluParams(x, approximate))
            return GeluFunction.apply(x, approximate)
    params = make_params(x, approximate, out=out, inplace=inplace)
    if x.requires_grad and torch.is_grad_enabled():
        return GeluFunction.apply(x, approximate) if params.out is None else torch_gelu(params)
    return _gelu_call(params)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """The gradient of :func:`gelu` at ``x`` for the incoming gradient ``dy`` (``aten.gelu_backward``).

    When the result itself must be differentiable (double backward), PyTorch's op runs.
    """
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_gelu_backward
        return compiled_gelu_backward(dy, x, approximate)
    params = make_backward_params(dy, x, approximate)
    if _grad_enabled() and (dy.requires_grad or x.requires_grad):
        return torch_gelu_backward(params)
    return _gelu_backward_call(params)


_gelu_call = gelu_op.call
_gelu_backward_call = gelu_backward_op.call
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
