"""gelu's params, candidates, tunable ops, public functions, autograd and custom ops (the package's
``__init__.py`` says what the candidates are)."""

from __future__ import annotations

import functools

import torch

from .._shared.arguments import (APPROXIMATIONS, TORCH, check_approximate, check_float_tensor, check_gradient_pair,
                                 computes, elementwise_destination, elementwise_target, traced_computes)
from .._shared.custom_ops import compute_dtype, like_x, save_inputs, tunekit_ops
from .._shared.elementwise import GradParams, UnaryParams, cuda_candidates, elementwise_op, triton_candidates
from .._shared.grad_call import GradCall
from .._shared.routing import transformed
from ...tunable.context import captured, inherited
from ...tunable.numerics import tolerance
from ...tunable.params import with_arguments
from ...tunable.registry import register

__all__ = ["GeluParams", "GeluBackwardParams", "GeluFunction", "gelu", "gelu_backward", "gelu_op", "gelu_backward_op",
           "gelu_tolerance", "torch_gelu", "torch_gelu_backward", "compiled_gelu", "compiled_gelu_backward",
           "gelu_custom", "gelu_backward_custom", "approximation"]

_gelu = torch._C._nn.gelu
_gelu_ = torch._C._nn.gelu_
_gelu_tanh = functools.partial(_gelu, approximate="tanh")
_aten_gelu_backward = torch.ops.aten.gelu_backward.default
_aten_gelu_backward_out = torch.ops.aten.gelu_backward.grad_input
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


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


#: float32 absolute tolerance of both gelu ops. PyTorch's own fp32 kernels are up to 3.6e-6 from
#: float64 (the tanh backward's ``1 - tanh^2`` cancels for |x| > 4, and |dy| reaches ~4); a kernel
#: with another tanh or order of operations differs from torch by as much, and must not be rejected.
FLOAT32_ATOL = 8e-6


def gelu_tolerance(p) -> tuple[float, float]:
    rtol, atol = tolerance(p.x.dtype)
    return (rtol, max(atol, FLOAT32_ATOL)) if p.x.dtype == torch.float32 else (rtol, atol)


def _tanh_flag(p) -> dict:
    return {"TANH": p.approximate == "tanh"}


# -- forward candidates ---------------------------------------------------------------------------
def torch_gelu(p: GeluParams) -> torch.Tensor:
    """PyTorch's own fused kernel (autograd-aware when no ``out`` is given)."""
    if p.out is None:
        return _gelu(p.x, approximate=p.approximate)
    if p.out is p.x:
        return _gelu_(p.x, approximate=p.approximate)
    return _gelu(p.x, approximate=p.approximate, out=p.out)


def _torch_gelu_runner(approximate: str):
    """``torch_gelu``'s run for ``out`` None with ``approximate`` bound (a runner: see tunable_op); one
    object per form, so that it can be named differentiable."""
    return _gelu if approximate == "none" else _gelu_tanh


def make_params(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
                inplace: bool = False) -> GeluParams:
    """Validate the public arguments into params."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    return GeluParams(x, approximate, elementwise_destination("gelu", x, out, inplace))


def make_example(shape, dtype=torch.float32, device="cpu", approximate: str = "none") -> GeluParams:
    return GeluParams(torch.randn(shape, dtype=dtype, device=device) * 3, approximate)


gelu_op = register(elementwise_op("gelu", GeluParams, grad_kind="gelu", make_params=make_params,
                                  make_example=make_example, tolerance=gelu_tolerance))
gelu_op.add(torch_gelu, default=True, fast_runner=lambda p: _torch_gelu_runner(p.approximate))
gelu_op.differentiable_runners = frozenset({_gelu, _gelu_tanh})  # F.gelu's result and node, at its host cost
for _c in (cuda_candidates("gelu.cu", "gelu", when={"approximate": "none"})
           + cuda_candidates("gelu.cu", "gelu_tanh", when={"approximate": "tanh"})
           + triton_candidates("gelu", "gelu_forward_kernel", ("x",), _tanh_flag)):
    gelu_op.add(_c)


# -- backward candidates --------------------------------------------------------------------------
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


gelu_backward_op = register(elementwise_op("gelu_backward", GeluBackwardParams, make_params=make_backward_params,
                                           make_example=make_backward_example, tolerance=gelu_tolerance))
gelu_backward_op.add(torch_gelu_backward, default=True)
for _c in (cuda_candidates("gelu.cu", "gelu_backward", inputs=("dy", "x"), when={"approximate": "none"})
           + cuda_candidates("gelu.cu", "gelu_tanh_backward", inputs=("dy", "x"), when={"approximate": "tanh"})
           + triton_candidates("gelu_backward", "gelu_backward_kernel", ("dy", "x"), _tanh_flag)):
    gelu_backward_op.add(_c)

_gelu_call = gelu_op.call
_gelu_backward_call = gelu_backward_op.call


# -- public functions and autograd ------------------------------------------------------------------
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


def gelu(input: torch.Tensor, *, approximate: str = "none", out: torch.Tensor | None = None,
         inplace: bool = False) -> torch.Tensor:
    """GELU, element by element, by the fastest correct candidate for these inputs.

    ``torch.nn.functional.gelu(input, *, approximate='none', out=None)``'s arguments, results and
    errors; ``inplace=True`` writes into ``input`` (torch's ``gelu_``). Differentiable: a tensor that
    requires grad gets torch's backward node (on a signature's first calls, the tuned backward). What tunekit does not compute (``ops/_shared/arguments.py``;
    an ``approximate`` other than "none" / "tanh") runs torch's own function with the same arguments.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_gelu(input, approximate=approximate, out=out, inplace=inplace)
    if out is None and not inplace:  # the common call, kept short
        y = gelu_op.fast_call(input, approximate)  # the cached choice's runner (tunable/fast_path.py), or None
        if y is not None:
            return y
        if not (computes(input) and approximation(approximate)):
            return _gelu(input, approximate=approximate)
        if not (input.requires_grad and _grad_enabled()):
            return _gelu_call(GeluParams(input, approximate))
        y = _gelu_grad_call.call(input, approximate)  # tunekit's forward, torch's grad_fn (_shared/grad_call.py), or None
        return y if y is not None else GeluFunction.apply(input, approximate)
    if inplace and out is not None:
        raise ValueError("tunekit.gelu: pass either out= or inplace=True, not both")
    if not (computes(input) and approximation(approximate)) or (input.requires_grad and _grad_enabled()):
        return _torch_gelu(input, approximate, inplace, out)
    where = elementwise_target(input, out, inplace)
    if where is TORCH:
        return _torch_gelu(input, approximate, inplace, out)
    y = _gelu_call(GeluParams(input, approximate, where))
    return y if out is None else out


def approximation(approximate) -> bool:
    """An ``approximate`` tunekit computes: "none" or "tanh" (torch refuses any other: RuntimeError for
    another string, TypeError for another type)."""
    return type(approximate) is str and approximate in APPROXIMATIONS


def _torch_gelu(input, approximate, inplace, out):
    """torch's own gelu for a form tunekit leaves to it: its result, warning or exception."""
    if inplace:
        return _gelu_(input, approximate=approximate)
    if out is None:
        return _gelu(input, approximate=approximate)
    return _gelu(input, approximate=approximate, out=out)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """The gradient of :func:`gelu` at ``x`` for the incoming gradient ``dy`` (``aten.gelu_backward``).

    When the result itself must be differentiable (double backward), PyTorch's op runs.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_gelu_backward(dy, x, approximate)
    params = make_backward_params(dy, x, approximate)
    if transformed() or (_grad_enabled() and (dy.requires_grad or x.requires_grad)):  # torch's op
        return torch_gelu_backward(params)
    return _gelu_backward_call(params)


def _gelu_forward(x, approximate):
    """The forward under torch's node: the cached runner, else the general path (as silu's)."""
    y = gelu_op.fast_call(x, approximate)
    return y if y is not None else _gelu_call(GeluParams(x, approximate))


_gelu_grad_call = GradCall(_gelu_forward, "gelu", gelu_backward_op)


# -- torch.library: tunekit::gelu, tunekit::gelu_backward (ops/_shared/custom_ops.py says why) -------
@torch.library.custom_op("tunekit::gelu", mutates_args=())
def gelu_custom(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``tunekit.gelu(x, approximate)`` as a custom op: the tunable op ``gelu`` at run time."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    return like_x(_gelu_call(GeluParams(x, approximate)), x)


@gelu_custom.register_fake
def _gelu_fake(x, approximate):
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    return torch.empty_like(x)


@torch.library.custom_op("tunekit::gelu_backward", mutates_args=())
def gelu_backward_custom(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``tunekit.gelu_backward(dy, x, approximate)`` as a custom op: the tunable op ``gelu_backward``."""
    check_gradient_pair("gelu_backward", dy, x)
    check_approximate("gelu_backward", approximate)
    return like_x(_gelu_backward_call(GeluBackwardParams(dy, x, approximate)), x)


@gelu_backward_custom.register_fake
def _gelu_backward_fake(dy, x, approximate):
    check_gradient_pair("gelu_backward", dy, x)
    check_approximate("gelu_backward", approximate)
    return torch.empty_like(x)


_SQRT_2_OVER_PI = (2 / torch.pi) ** 0.5
_INV_SQRT_2PI = (2 * torch.pi) ** -0.5
_TANH_C = 0.044715


def _gelu_second_derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate == "tanh":  # g = x (1 + t) / 2, t = tanh(u), u = k (x + c x^3)
        x2 = x * x
        du = _SQRT_2_OVER_PI * (1 + 3 * _TANH_C * x2)
        t = torch.tanh(_SQRT_2_OVER_PI * (x + _TANH_C * x * x2))
        d2u = (6 * _SQRT_2_OVER_PI * _TANH_C) * x
        return (1 - t * t) * (du + 0.5 * x * (d2u - 2 * t * du * du))
    x2 = x * x  # g = x Phi(x): g'' = phi(x) (2 - x^2)
    return torch.exp(-0.5 * x2) * _INV_SQRT_2PI * (2 - x2)


def _gelu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return tunekit_ops.gelu_backward(grad, x, ctx.arguments[0]), None


def _gelu_backward_grad(ctx, grad):
    """Double backward: linear in ``dy`` (the backward op again), torch composites for ``x``."""
    dy, x = ctx.saved_tensors
    approximate = ctx.arguments[0]
    gdy = tunekit_ops.gelu_backward(grad, x, approximate) if ctx.needs_input_grad[0] else None
    gx = None
    if ctx.needs_input_grad[1]:
        t = compute_dtype(x)
        gx = (grad.to(t) * dy.to(t) * _gelu_second_derivative(x.to(t), approximate)).to(x.dtype)
    return gdy, gx, None


gelu_custom.register_autograd(_gelu_grad, setup_context=save_inputs)
gelu_backward_custom.register_autograd(_gelu_backward_grad, setup_context=save_inputs)


def compiled_gelu(input: torch.Tensor, *, approximate: str = "none", out: torch.Tensor | None = None,
                  inplace: bool = False) -> torch.Tensor:
    """``tunekit.gelu`` under torch.compile: ``tunekit::gelu`` for the functional form of a tensor
    tunekit computes; torch's ops for the rest (``out=`` and in place: the compiler functionalizes them)."""
    if inplace and out is not None:
        raise ValueError("tunekit.gelu: pass either out= or inplace=True, not both")
    if out is None and not inplace and traced_computes(input) and approximation(approximate):
        return tunekit_ops.gelu(input, approximate)
    return _torch_gelu(input, approximate, inplace, out)


def compiled_gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``tunekit.gelu_backward`` under torch.compile."""
    return tunekit_ops.gelu_backward(dy, x, approximate)
