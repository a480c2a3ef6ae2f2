"""gelu as ``torch.nn.functional.gelu``, both forms, and its gradient.

- ``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``
- ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``

Two tunable ops, each with its candidates (kernels live in ``tunekit/kernels/<backend>/``):

``gelu``
- ``torch_gelu`` (default): PyTorch's fused kernel, both forms. Runs any input.
- ``gelu_<form>`` (erf) and ``gelu_tanh_<form>``: CUDA C (``kernels/cuda/gelu.cu``), fp32 math for
  every storage type (a half-precision tanh turns into NaN for x > ~4), the forms of
  ``kernels/cuda/elementwise.cuh``; each declines the other ``approximate``.
- ``gelu_triton_b<BLOCK>_w<warps>``: Triton, both forms (a compile-time switch).

``gelu_backward``: ``torch_gelu_backward`` (default, ``aten.gelu_backward``), the CUDA C forms
(``gelu_backward_<form>``, ``gelu_tanh_backward_<form>``) and Triton configurations.

The same layout as ``ops/silu.py``: candidates, tunable ops, public functions and autograd
(:class:`GeluFunction`), the custom ops ``tunekit::gelu`` / ``tunekit::gelu_backward``, and the
drop-in :class:`GELU` module and ``tunekit.patch()`` replacements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._shared import routing
from ._shared.arguments import (check_approximate, check_float_tensor, check_gradient_pair, check_traced_out,
                                elementwise_destination)
from ._shared.custom_ops import compute_dtype, like_x, save_inputs, tunekit_ops
from ._shared.elementwise import GradParams, UnaryParams, cuda_candidates, elementwise_op, triton_candidates
from ._shared.family import OpFamily, PatchTarget
from ..tunable.context import captured, inherited
from ..tunable.numerics import tolerance
from ..tunable.params import with_arguments
from ..tunable.registry import register

__all__ = ["GeluParams", "GeluBackwardParams", "GeluFunction", "GELU", "gelu", "gelu_backward", "gelu_op",
           "gelu_backward_op", "gelu_tolerance", "compiled_gelu", "compiled_gelu_backward", "FAMILY"]

_gelu = torch._C._nn.gelu
_gelu_ = torch._C._nn.gelu_
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


gelu_op = register(elementwise_op("gelu", GeluParams, make_params=make_params, make_example=make_example,
                                  tolerance=gelu_tolerance))
gelu_op.add(torch_gelu, default=True, fast_runner=lambda p: _torch_gelu_runner(p.approximate))
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


def gelu(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
         inplace: bool = False) -> torch.Tensor:
    """GELU, element by element, by the fastest correct candidate for these inputs.

    Same results and semantics as ``torch.nn.functional.gelu``; ``out=`` writes into a given tensor,
    ``inplace=True`` into ``x``. Differentiable: a tensor that requires grad gets the tuned backward.
    ``out=`` and ``inplace=True`` under autograd run PyTorch's kernel, with PyTorch's rules.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
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
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_gelu_backward(dy, x, approximate)
    params = make_backward_params(dy, x, approximate)
    if _grad_enabled() and (dy.requires_grad or x.requires_grad):
        return torch_gelu_backward(params)
    return _gelu_backward_call(params)


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


def compiled_gelu(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
                  inplace: bool = False) -> torch.Tensor:
    """``tunekit.gelu`` under torch.compile: ``tunekit::gelu``, or torch's op for out= / inplace."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    if out is None and not inplace:
        return tunekit_ops.gelu(x, approximate)
    check_traced_out("gelu", x, out, inplace)
    if inplace or out is x:
        return torch._C._nn.gelu_(x, approximate=approximate)
    return torch._C._nn.gelu(x, approximate=approximate, out=out)


def compiled_gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``tunekit.gelu_backward`` under torch.compile."""
    return tunekit_ops.gelu_backward(dy, x, approximate)


# -- drop-in use: tunekit.nn.GELU and tunekit.patch() ---------------------------------------------
def routed_gelu(x: torch.Tensor, approximate: str, inplace: bool = False) -> torch.Tensor:
    """:func:`gelu` for a call routed from torch's entry points (``ops/silu.py``'s ``routed_silu``)."""
    state = routing.state
    state.inside = True
    try:
        return gelu(x, approximate, inplace=True) if inplace else gelu(x, approximate)
    finally:
        state.inside = False


def _routable(approximate) -> bool:
    return type(approximate) is str and (approximate == "none" or approximate == "tanh")


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
        if _routable(approximate) and type(inplace) is bool and routing.takes(input):
            return routed_gelu(input, approximate, inplace)
        if inplace:
            return _gelu_(input, approximate=approximate)
        return super().forward(input)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return f"{text}, inplace=True" if self.inplace else text


def _patched_functional(attr):
    def gelu(*args, **kwargs):
        if attr.users:
            if len(args) == 1 and not kwargs:
                x, approximate = args[0], "none"
            else:
                bound = routing.bind(args, kwargs, ("input",), ("approximate",), {"approximate": "none"}) or {}
                x, approximate = bound.get("input"), bound.get("approximate")
            if _routable(approximate) and routing.takes(x):
                return routed_gelu(x, approximate)
        return attr.original(*args, **kwargs)
    return gelu


def _patched_forward(attr):
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs:
            approximate = self.approximate
            if _routable(approximate) and routing.takes(args[0]):
                return routed_gelu(args[0], approximate)
        return attr.original(self, *args, **kwargs)
    return forward


FAMILY = OpFamily(
    name="gelu",
    functions={"gelu": gelu, "gelu_backward": gelu_backward},
    modules={"GELU": GELU},
    patches=(PatchTarget(F, "gelu", _patched_functional), PatchTarget(torch.nn.GELU, "forward", _patched_forward)),
    custom_ops={"gelu": gelu_custom, "gelu_backward": gelu_backward_custom},
)
