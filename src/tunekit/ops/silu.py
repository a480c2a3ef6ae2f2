"""silu (swish): ``y = x * sigmoid(x)`` as ``torch.nn.functional.silu``, and its gradient.

Two tunable ops, each with its candidates (kernels live in ``tunekit/kernels/<backend>/``):

``silu``
- ``torch_silu`` (default): PyTorch's fused kernel. Runs any input.
- ``torch_x_sigmoid``: the composite ``x * sigmoid(x)`` (two kernels and a temporary), the naive
  baseline; kept so tuning shows why it loses.
- ``silu_<form>``: CUDA C (``kernels/cuda/silu.cu``) in every vector form of ``elementwise.cuh``
  (f32 ... f16x8_pack, bf16, strided multi-pack and persistent forms); contiguous tensors aligned
  for the access width.
- ``silu_triton_b<BLOCK>_w<warps>``: Triton (``kernels/triton/activations.py``).

``silu_backward`` (``dx = dy * s * (1 + x * (1 - s))``, ``s = sigmoid(x)``): ``torch_silu_backward``
(default, ``aten.silu_backward``), the same CUDA C forms and Triton configurations.

The path of a call: :func:`silu` -> (compiling: :func:`compiled_silu`, the custom op
``tunekit::silu``) -> the fast path (``silu_op.fast_call``) or ``silu_op.call(SiluParams(x))`` ->
the chosen candidate. Autograd: on a tensor that requires grad, once its forward's runner is cached,
torch's own function where that is the choice (the fast call: F.silu's result, node and host cost),
else the tuned forward with torch's own ``SiluBackward0`` node (``_shared/grad_call.py``); before that :class:`SiluFunction`, whose backward calls the tuned :func:`silu_backward`. Drop-in use:
:class:`SiLU` (``tunekit.nn.SiLU``) and the ``tunekit.patch()`` replacements of ``F.silu`` and
``nn.SiLU.forward`` at the end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._shared import routing
from ._shared.arguments import (TORCH, check_float_tensor, check_gradient_pair, computes, elementwise_destination,
                                elementwise_target, traced_computes)
from ._shared.custom_ops import compute_dtype, like_x, save_inputs, tunekit_ops
from ._shared.routing import transformed
from ._shared.elementwise import GradParams, UnaryParams, cuda_candidates, elementwise_op, triton_candidates
from ._shared.family import OpFamily, PatchTarget
from ._shared.grad_call import GradCall
from ..tunable.context import captured, inherited
from ..tunable.registry import register

__all__ = ["SiluParams", "SiluBackwardParams", "SiluFunction", "SiLU", "silu", "swish", "silu_backward", "silu_op",
           "silu_backward_op", "compiled_silu", "compiled_silu_backward", "FAMILY"]

_silu = torch._C._nn.silu
_silu_ = torch._C._nn.silu_
_F_silu = F.silu  # torch's own function, bound before any tunekit.patch() replaces the attribute
_aten_silu_backward = torch.ops.aten.silu_backward.default
_aten_silu_backward_out = torch.ops.aten.silu_backward.grad_input
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


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
        return _silu_(p.x)
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


silu_op = register(elementwise_op("silu", SiluParams, grad_kind="silu", make_params=make_params,
                                  make_example=make_example))
silu_op.add(torch_silu, default=True, fast_runner=lambda p: _silu)  # run(p) is _silu(p.x) when out is None
silu_op.differentiable_runners = frozenset({_silu})  # torch's function: F.silu's result and node, at its host cost
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


silu_backward_op = register(elementwise_op("silu_backward", SiluBackwardParams, make_params=make_backward_params,
                                           make_example=make_backward_example))
silu_backward_op.add(torch_silu_backward, default=True)
for _c in (cuda_candidates("silu.cu", "silu_backward", inputs=("dy", "x"))
           + triton_candidates("silu_backward", "silu_backward_kernel", ("dy", "x"))):
    silu_backward_op.add(_c)

_silu_call = silu_op.call
_silu_backward_call = silu_backward_op.call


# -- public functions and autograd ------------------------------------------------------------------
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


def silu(input: torch.Tensor, inplace: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x * sigmoid(x)``, element by element, by the fastest correct candidate for these inputs.

    ``torch.nn.functional.silu(input, inplace=False)``'s arguments, results and errors, and an
    ``out=`` as ``torch._C._nn.silu``'s. Differentiable: a tensor that requires grad gets torch's
    backward node (or, on a signature's first calls, the tuned backward). What tunekit does not compute (``ops/_shared/arguments.py``: other dtypes, subclasses,
    devices, ``out=`` torch resizes or refuses, ``out=`` / in place under autograd) runs torch's own
    function with the same arguments.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_silu(input, inplace, out=out)
    if out is None and not inplace:  # the common call, kept short
        y = silu_op.fast_call(input)  # the cached choice's runner (tunable/fast_path.py), or None
        if y is not None:
            return y
        if not computes(input):
            return _F_silu(input)
        if not (input.requires_grad and _grad_enabled()):
            return _silu_call(SiluParams(input))
        y = _silu_grad_call.call(input)  # tunekit forward, torch.s grad_fn (_shared/grad_call.py), or None
        return y if y is not None else SiluFunction.apply(input)
    if inplace and out is not None:
        raise ValueError("tunekit.silu: pass either out= or inplace=True, not both")
    if not computes(input) or (input.requires_grad and _grad_enabled()):
        return _torch_silu(input, inplace, out)
    where = elementwise_target(input, out, inplace)
    if where is TORCH:
        return _torch_silu(input, inplace, out)
    y = _silu_call(SiluParams(input, where))
    return y if out is None else out


def _torch_silu(input, inplace, out):
    """torch's own silu for a form tunekit leaves to it: its result, warning or exception."""
    if out is None:
        return _F_silu(input, inplace)
    return _silu(input, out=out)


def silu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`silu` at ``x`` for the incoming gradient ``dy`` (``aten.silu_backward``).

    When the result itself must be differentiable (double backward), differentiable torch ops run.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_silu_backward(dy, x)
    params = make_backward_params(dy, x)
    if transformed() or (_grad_enabled() and (dy.requires_grad or x.requires_grad)):
        # aten.silu_backward has no derivative; autograd's own double backward uses this composite
        # (so do forward-mode AD and torch.func transforms: tunekit's kernels compute values only)
        s = torch.sigmoid(x)
        return dy * s * (1 + x * (1 - s))
    return _silu_backward_call(params)


swish = silu
def _silu_forward(x):
    """The forward under torch's node: the cached runner, else the general path (a Triton choice has no
    runner; a signature still tuning resumes its session here)."""
    y = silu_op.fast_call(x)
    return y if y is not None else _silu_call(SiluParams(x))


_silu_grad_call = GradCall(_silu_forward, "silu", silu_backward_op)


# -- torch.library: tunekit::silu, tunekit::silu_backward (ops/_shared/custom_ops.py says why) -------
@torch.library.custom_op("tunekit::silu", mutates_args=())
def silu_custom(x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu(x)`` as a custom op: the tunable op ``silu`` at run time."""
    check_float_tensor("silu", x)
    return like_x(_silu_call(SiluParams(x)), x)


@silu_custom.register_fake
def _silu_fake(x):
    check_float_tensor("silu", x)
    return torch.empty_like(x)


@torch.library.custom_op("tunekit::silu_backward", mutates_args=())
def silu_backward_custom(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu_backward(dy, x)`` as a custom op: the tunable op ``silu_backward``."""
    check_gradient_pair("silu_backward", dy, x)
    return like_x(_silu_backward_call(SiluBackwardParams(dy, x)), x)


@silu_backward_custom.register_fake
def _silu_backward_fake(dy, x):
    check_gradient_pair("silu_backward", dy, x)
    return torch.empty_like(x)


def _silu_second_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 - s) * (2 + x * (1 - 2 * s))


def _silu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return tunekit_ops.silu_backward(grad, x)


def _silu_backward_grad(ctx, grad):
    """Double backward: linear in ``dy`` (the backward op again), torch composites for ``x``."""
    dy, x = ctx.saved_tensors
    gdy = tunekit_ops.silu_backward(grad, x) if ctx.needs_input_grad[0] else None
    gx = None
    if ctx.needs_input_grad[1]:
        t = compute_dtype(x)
        gx = (grad.to(t) * dy.to(t) * _silu_second_derivative(x.to(t))).to(x.dtype)
    return gdy, gx


silu_custom.register_autograd(_silu_grad, setup_context=save_inputs)
silu_backward_custom.register_autograd(_silu_backward_grad, setup_context=save_inputs)


def compiled_silu(input: torch.Tensor, inplace: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``tunekit.silu`` under torch.compile: ``tunekit::silu`` for the functional form of a tensor
    tunekit computes; torch's ops for the rest (``out=`` and in place: the compiler functionalizes them)."""
    if inplace and out is not None:
        raise ValueError("tunekit.silu: pass either out= or inplace=True, not both")
    if out is None and not inplace and traced_computes(input):
        return tunekit_ops.silu(input)
    return _torch_silu(input, inplace, out)


def compiled_silu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu_backward`` under torch.compile."""
    return tunekit_ops.silu_backward(dy, x)


# -- drop-in use: tunekit.nn.SiLU and tunekit.patch() ---------------------------------------------
def routed_silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """:func:`silu` for a call routed from torch's entry points (after ``routing.takes(x)``), with
    the "inside tunekit" flag set so the torch functions tunekit calls reach torch while patched. The
    cached choice's runner first, without the flag: torch's own function or a kernel launch, nothing
    that calls back into Python (the flag and the public function cost a patched call ~1 us)."""
    if not inplace:
        y = silu_op.fast_call(x)
        if y is not None:
            return y
    state = routing.state
    state.inside = True
    try:
        return silu(x, True) if inplace else silu(x)
    finally:
        state.inside = False


class SiLU(torch.nn.SiLU):
    """``torch.nn.SiLU(inplace=False)`` whose forward runs :func:`tunekit.silu` (``inplace`` honoured)
    for the inputs where tunekit gives torch's results (``ops/_shared/routing.py``); torch's own
    forward for any other. A subclass: ``isinstance``, constructor, repr, state_dict, pickling as torch's."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inplace = self.inplace
        if type(inplace) is bool and routing.takes(input):
            return routed_silu(input, inplace)
        return super().forward(input)


def _patched_functional(attr):
    def silu(*args, **kwargs):
        if attr.users:
            if len(args) == 1 and not kwargs:
                x, inplace = args[0], False
            else:
                bound = routing.bind(args, kwargs, ("input", "inplace"), defaults={"inplace": False}) or {}
                x, inplace = bound.get("input"), bound.get("inplace")
            if type(inplace) is bool and routing.takes(x):
                return routed_silu(x, inplace)
        return attr.original(*args, **kwargs)
    return silu


def _patched_forward(attr):
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs:
            inplace = self.inplace
            if type(inplace) is bool and routing.takes(args[0]):
                return routed_silu(args[0], inplace)
        return attr.original(self, *args, **kwargs)
    return forward


FAMILY = OpFamily(
    name="silu",
    functions={"silu": silu, "swish": swish, "silu_backward": silu_backward},
    modules={"SiLU": SiLU},
    patches=(PatchTarget(F, "silu", _patched_functional), PatchTarget(torch.nn.SiLU, "forward", _patched_forward)),
    custom_ops={"silu": silu_custom, "silu_backward": silu_backward_custom},
)
