"""rms_norm's tunable ops, torch's candidates, the public functions, autograd and the custom ops
(the package's ``__init__.py`` says what the candidates are and why the op exists)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import route
from .params import RmsNormBackwardParams, RmsNormParams, epsilon
from .triton_candidates import triton_rms_norm_backward_candidates, triton_rms_norm_candidates
from .._shared import routing
from .._shared.arguments import computes, traced_computes
from .._shared.custom_ops import contiguous, save_inputs, tunekit_ops
from ...tunable import context
from ...tunable.context import captured, inherited
from ...tunable.registry import register
from ...tunable.tunable_op import TunableOp

__all__ = ["rms_norm", "rms_norm_backward", "RmsNormFunction", "rms_norm_op", "rms_norm_backward_op",
           "torch_rms_norm", "torch_rms_norm_backward", "normalized", "compiled_rms_norm", "rms_norm_custom",
           "rms_norm_backward_custom"]

_F_rms_norm = F.rms_norm  # torch's own function, bound before any tunekit.patch() replaces it
_fused_backward = torch.ops.aten._fused_rms_norm_backward.default
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_f32 = torch.float32


def normalized(normalized_shape) -> tuple[int, ...] | None:
    """``normalized_shape`` (a list / tuple of ints, a torch.Size) as a tuple, or None when tunekit
    leaves it to torch (anything else, a bare int too: torch gives its own error)."""
    if isinstance(normalized_shape, (tuple, list)) and all(type(d) is int for d in normalized_shape):
        return tuple(normalized_shape)
    return None


def _computed(input, shape, weight, eps) -> bool:
    """Whether tunekit computes this call: a float input and a weight of its dtype and device shaped
    ``normalized_shape``, which the input ends with; eps None or a float. Other calls (no weight, a
    weight of another dtype, whose result dtype torch promotes; shapes torch refuses) run torch's."""
    return (shape is not None and len(shape) > 0 and computes(input) and weight is not None and computes(weight)
            and weight.dtype == input.dtype and weight.device == input.device and tuple(weight.shape) == shape
            and input.dim() >= len(shape) and tuple(input.shape[input.dim() - len(shape):]) == shape
            and (eps is None or type(eps) is float))


def _norm_dims(x: torch.Tensor, shape) -> tuple[int, ...]:
    return tuple(range(x.dim() - len(shape), x.dim()))


# -- forward --------------------------------------------------------------------------------------
def torch_rms_norm(p: RmsNormParams) -> torch.Tensor:
    """torch's ``F.rms_norm``: its fused kernel on CUDA (float32 math, one rounding), its composite on
    the CPU. Autograd-aware (torch's node) when called with grad enabled."""
    y = _F_rms_norm(p.x, p.normalized_shape, p.weight, p.eps)
    return y if p.out is None else p.out.copy_(y)


def make_example(shape, dtype=torch.float32, device="cpu") -> RmsNormParams:
    x = torch.randn(shape, dtype=dtype, device=device) * 3
    return RmsNormParams(x, torch.rand(shape[-1], dtype=dtype, device=device) + 0.5, (shape[-1],))


#: ms of device time a challenger must save over torch's kernel. Under autograd a Triton choice's call
#: takes the Python Function and three launches (forward, gradient, dweight's sum), torch's kernel
#: its own C++ node: forward + backward cost the host 397 us against 154 (H200, 4096 x 1024 bfloat16,
#: ``benchmarks/results/rms_norm_host-NVIDIA_H200.txt``), so below this a host-bound training step
#: (a LLaMA-style one is) would run slower although the Triton kernels take half the device time
CHALLENGER_HOST_MS = 0.150

rms_norm_op = register(TunableOp("rms_norm", RmsNormParams, make_example=make_example))
rms_norm_op.challenger_host_ms = CHALLENGER_HOST_MS
_torch_candidate = rms_norm_op.add(torch_rms_norm, default=True)
rms_norm_op.off_thread = routing.off_thread  # the screen and the check's warm-up on workers online
for _c in triton_rms_norm_candidates():
    rms_norm_op.add(_c)


# -- backward -------------------------------------------------------------------------------------
def torch_rms_norm_backward(p: RmsNormBackwardParams):
    """(dx, dweight): on CUDA torch's fused gradient kernel (``aten._fused_rms_norm_backward``, fed the
    rstd it needs from one float32 (float64: float64) norm of the rows); on the CPU, where torch has no fused gradient,
    the formula in float32 (float64 for float64) with torch ops. The reference every other candidate is
    checked against."""
    x, w, dims = p.x, p.weight, _norm_dims(p.x, p.normalized_shape)
    n, eps = w.numel(), epsilon(x, p.eps)
    acc = torch.promote_types(x.dtype, _f32)  # float32 math; float64 stays float64
    if x.is_cuda:
        rstd = torch.linalg.vector_norm(x, dim=dims, keepdim=True, dtype=acc).square_().div_(n).add_(eps).rsqrt_()
        dx, dw = _fused_backward(p.dy, x, list(p.normalized_shape), rstd, w, [True, True])
    else:
        xf, g = x.to(acc), p.dy.to(acc) * w.to(acc)
        rstd = xf.square().mean(dims, keepdim=True).add_(eps).rsqrt_()
        c = (g * xf).mean(dims, keepdim=True)
        dx = (rstd * (g - xf * (rstd * rstd * c))).to(x.dtype)
        lead, dw = tuple(range(x.dim() - len(dims))), p.dy.to(acc) * xf * rstd
        dw = (dw.sum(lead) if lead else dw).to(w.dtype)  # sum(()) would sum every dim
    if p.out is not None:
        dx = p.out.copy_(dx)
    if p.dweight is not None:
        dw = p.dweight.copy_(dw)
    return dx, dw


def make_backward_example(shape, dtype=torch.float32, device="cpu") -> RmsNormBackwardParams:
    fwd = make_example(shape, dtype, device)
    return RmsNormBackwardParams(torch.randn_like(fwd.x), fwd.x, fwd.weight, fwd.normalized_shape)


rms_norm_backward_op = register(TunableOp("rms_norm_backward", RmsNormBackwardParams,
                                          make_example=make_backward_example))
rms_norm_backward_op.add(torch_rms_norm_backward, default=True)
rms_norm_backward_op.off_thread = routing.off_thread
for _c in triton_rms_norm_backward_candidates():
    rms_norm_backward_op.add(_c)

_rms_norm_call = rms_norm_op.call
_rms_norm_backward_call = rms_norm_backward_op.call


# -- public functions and autograd ------------------------------------------------------------------
class RmsNormFunction(torch.autograd.Function):
    """Autograd for :func:`rms_norm` where a tunekit kernel is the forward: the tuned gradient."""

    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        ctx.save_for_backward(x, weight)
        ctx.normalized_shape, ctx.eps = normalized_shape, eps
        ctx.tuning = captured()  # the backward may run on autograd's thread
        return _rms_norm_call(RmsNormParams(x, weight, normalized_shape, eps))

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with inherited(ctx.tuning):
            dx, dw = rms_norm_backward(dy.contiguous(), x, weight, ctx.normalized_shape, ctx.eps)
        return (dx if ctx.needs_input_grad[0] else None), (dw if ctx.needs_input_grad[1] else None), None, None


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """Root-mean-square normalization of the last ``len(normalized_shape)`` dims, times ``weight``,
    by the fastest correct candidate.

    ``torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)``'s arguments,
    results and errors. tunekit computes a float input with a weight of its dtype (the form of
    ``nn.RMSNorm`` and of Hugging Face models' RMSNorm modules); every other call (no weight, a
    weight of another dtype, shapes torch refuses) runs torch's function. Differentiable: once a
    signature's choice is torch's kernel, a call that needs gradients gets torch's own node (torch's
    host cost); otherwise :class:`RmsNormFunction`, whose backward is the tuned gradient.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_rms_norm(input, normalized_shape, weight, eps)
    y = route.call(input, normalized_shape, weight, eps)  # torch's function from C++ where it is the choice
    if y is not None:
        return y
    shape = normalized(normalized_shape)
    if not _computed(input, shape, weight, eps):
        return _F_rms_norm(input, normalized_shape, weight, eps)
    params = RmsNormParams(input, weight, shape, eps)
    if not ((input.requires_grad or weight.requires_grad) and _grad_enabled()):
        return _rms_norm_call(params)
    if _torch_decided(params):
        route.learn(input, shape, weight, eps)
        return _torch_candidate.run(params)  # torch's kernel and its own node
    return RmsNormFunction.apply(input, weight, shape, eps)


#: (settings cache id, params cache key) -> whether the decided choice is torch's kernel (cleared with the op's choices)
_torch_node: dict = {}
rms_norm_op.on_forget.append(_torch_node.clear)
rms_norm_op.on_forget.append(route.forget)


def _torch_decided(params: RmsNormParams) -> bool:
    """Whether this signature's decided choice is torch's kernel (False while undecided: the Function,
    whose forward tunes), memoized by cache key: a signature string per call costs microseconds."""
    s = context.current()
    key = (s.cache_id, params.cache_key())
    known = _torch_node.get(key)
    if known is None:
        decided = rms_norm_op.decision(params, s)
        if decided is None:
            return False
        known = _torch_node[key] = decided.candidate is _torch_candidate
    return known


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, normalized_shape,
                      eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight): the gradient of :func:`rms_norm` at ``x`` for the incoming gradient ``dy``.

    When the result must itself be differentiable (double backward), torch's differentiable ops run.
    """
    shape = normalized(normalized_shape)
    if not (_computed(x, shape, weight, eps) and computes(dy) and dy.shape == x.shape and dy.dtype == x.dtype
            and dy.device == x.device):
        raise ValueError("tunekit.rms_norm_backward: dy and x of one shape, dtype and device ending with "
                         "normalized_shape, and a weight of that shape and of x's dtype")
    if _grad_enabled() and (dy.requires_grad or x.requires_grad or weight.requires_grad):
        with torch.enable_grad():
            xs = x if x.requires_grad else x.detach().requires_grad_()
            ws = weight if weight.requires_grad else weight.detach().requires_grad_()
            return torch.autograd.grad(_F_rms_norm(xs, shape, ws, eps), (xs, ws), dy, create_graph=True)
    if _is_compiling():
        return tuple(tunekit_ops.rms_norm_backward(dy, x, weight, list(shape), eps))
    return _rms_norm_backward_call(RmsNormBackwardParams(dy, x, weight, shape, eps))


# -- torch.library: tunekit::rms_norm, tunekit::rms_norm_backward ------------------------------------
@torch.library.custom_op("tunekit::rms_norm", mutates_args=())
def rms_norm_custom(x: torch.Tensor, weight: torch.Tensor, normalized_shape: list[int],
                    eps: float | None) -> torch.Tensor:
    """``tunekit.rms_norm`` as a custom op: the tunable op ``rms_norm`` at run time."""
    return contiguous(_rms_norm_call(RmsNormParams(x, weight, normalized_shape, eps)))


@rms_norm_custom.register_fake
def _rms_norm_fake(x, weight, normalized_shape, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("tunekit::rms_norm_backward", mutates_args=())
def rms_norm_backward_custom(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, normalized_shape: list[int],
                             eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``tunekit.rms_norm_backward`` as a custom op: the tunable op ``rms_norm_backward``."""
    dx, dw = _rms_norm_backward_call(RmsNormBackwardParams(dy.contiguous(), x, weight, normalized_shape, eps))
    return contiguous(dx), contiguous(dw)


@rms_norm_backward_custom.register_fake
def _rms_norm_backward_fake(dy, x, weight, normalized_shape, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(weight.shape, dtype=weight.dtype, device=weight.device))


def _rms_norm_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    normalized_shape, eps = ctx.arguments
    dx, dw = tunekit_ops.rms_norm_backward(grad, x, weight, normalized_shape, eps)
    return dx, dw, None, None


rms_norm_custom.register_autograd(_rms_norm_grad, setup_context=save_inputs)


def compiled_rms_norm(input, normalized_shape, weight=None, eps=None):
    """``tunekit.rms_norm`` under torch.compile: ``tunekit::rms_norm`` for the calls tunekit computes,
    torch's function (which the compiler fuses) for the rest."""
    shape = normalized(normalized_shape)
    if (shape and weight is not None and traced_computes(input) and traced_computes(weight)
            and weight.dtype == input.dtype and tuple(weight.shape) == shape and (eps is None or type(eps) is float)
            and tuple(input.shape[input.dim() - len(shape):]) == shape):
        return tunekit_ops.rms_norm(input, weight, list(shape), eps)
    return _F_rms_norm(input, normalized_shape, weight, eps)
