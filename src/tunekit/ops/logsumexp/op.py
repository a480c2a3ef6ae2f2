"""logsumexp's tunable ops, their torch candidates, autograd and public functions (the package's
``__init__.py`` says what the candidates are)."""

from __future__ import annotations

import math

import torch

from .cuda_backward import cuda_backward_candidates
from .cuda_forward import cuda_candidates
from .default_backward import FusedGradient
from .params import LogsumexpBackwardParams, LogsumexpParams, normalize_dims, reduced_shape, unsqueezed
from .triton_backward import triton_logsumexp_backward_candidates
from .triton_forward import triton_logsumexp_candidates
from .._shared import routing
from .._shared.arguments import check_float_tensor, computes, traced_computes, writable_out
from .._shared.custom_ops import compute_dtype, contiguous, save_inputs, tunekit_ops
from .._shared.grad_call import GradCall
from .._shared.routing import transformed
from ...tunable.context import captured, inherited
from ...tunable.registry import register
from ...tunable.tunable_op import TunableOp

__all__ = ["LogsumexpFunction", "logsumexp", "logsumexp_backward", "logsumexp_op", "logsumexp_backward_op",
           "torch_logsumexp", "torch_logsumexp_backward", "compiled_logsumexp", "compiled_logsumexp_backward",
           "logsumexp_custom", "logsumexp_backward_custom", "routed_logsumexp", "patched_function", "patched_method"]


_torch_logsumexp = torch.logsumexp  # torch's own function, bound before any tunekit.patch() replaces it


# -- forward --------------------------------------------------------------------------------------
#: float16's largest finite value: torch's composite sums exp(x - max) into a float16 tensor, which
#: overflows to inf once more than this many terms are reduced (each term is at most 1)
_FLOAT16_MAX = 65504


def torch_logsumexp(p: LogsumexpParams) -> torch.Tensor:
    """PyTorch's composite; in float32 where it would overflow: a float16 reduction of more than
    65504 terms (torch's own returns inf there, e.g. 200 x 40999 x 3 over dims 0 and 1). This is the
    default and the reference the other candidates are checked against, so it must be right."""
    x = p.x
    if x.dtype == torch.float16 and x.numel() // max(1, math.prod(reduced_shape(x, p.dims, p.keepdim))) > _FLOAT16_MAX:
        result = _torch_logsumexp(x.float(), p.dims, p.keepdim)
        return result.to(x.dtype) if p.out is None else p.out.copy_(result)
    if p.out is None:
        return _torch_logsumexp(x, p.dims, p.keepdim)
    return _torch_logsumexp(x, p.dims, p.keepdim, out=p.out)


def make_params(x: torch.Tensor, dim, keepdim: bool = False) -> LogsumexpParams:
    check_float_tensor("logsumexp", x)
    return LogsumexpParams(x, normalize_dims(dim, x.dim()), bool(keepdim))


def make_example(shape, dtype=torch.float32, device="cpu", dim=-1, keepdim=False) -> LogsumexpParams:
    x = torch.randn(shape, dtype=dtype, device=device) * 3
    return LogsumexpParams(x, normalize_dims(dim, x.dim()), keepdim)


logsumexp_op = register(TunableOp("logsumexp", LogsumexpParams, make_params=make_params, make_example=make_example))
logsumexp_op.add(torch_logsumexp, default=True)
logsumexp_op.off_thread = routing.off_thread  # the screen and the check's warm-up on workers online
for _c in cuda_candidates():
    logsumexp_op.add(_c)
for _c in triton_logsumexp_candidates():
    logsumexp_op.add(_c)


# -- backward -------------------------------------------------------------------------------------
def torch_logsumexp_backward(p: LogsumexpBackwardParams) -> torch.Tensor:
    """``dy * exp(x - lse)`` with torch ops (autograd's formula for torch.logsumexp), in float32 for
    16-bit inputs: in bfloat16, ``x - lse`` alone rounds by up to 3% of the gradient (lse ~ 10),
    and this result is the reference every other candidate is checked against. Writes ``out``
    in place when given (tuning times it so, and no extra copy should count against it)."""
    x = p.x
    dy, lse = unsqueezed(p.dy, p.dims, p.keepdim, x.dim()), unsqueezed(p.lse, p.dims, p.keepdim, x.dim())
    if x.dtype in (torch.float16, torch.bfloat16):
        dx = torch.exp(x.float() - lse.float()).mul_(dy.float())
        return dx.to(x.dtype) if p.out is None else p.out.copy_(dx)
    if p.out is None:
        return dy * torch.exp(x - lse)
    torch.sub(x, lse, out=p.out)
    return p.out.exp_().mul_(dy)


def make_backward_example(shape, dtype=torch.float32, device="cpu", dim=-1, keepdim=False) -> LogsumexpBackwardParams:
    fwd = make_example(shape, dtype, device, dim, keepdim)
    lse = torch.logsumexp(fwd.x, fwd.dims, keepdim)
    return LogsumexpBackwardParams(torch.randn_like(lse), fwd.x, lse, fwd.dims, keepdim)


logsumexp_backward_op = register(TunableOp("logsumexp_backward", LogsumexpBackwardParams,
                                           make_example=make_backward_example))
logsumexp_backward_op.add(FusedGradient(torch_logsumexp_backward), default=True)  # default_backward.py: why
logsumexp_backward_op.off_thread = routing.off_thread
logsumexp_backward_op.add(torch_logsumexp_backward)
for _c in cuda_backward_candidates():
    logsumexp_backward_op.add(_c)
for _c in triton_logsumexp_backward_candidates():
    logsumexp_backward_op.add(_c)


_logsumexp_call = logsumexp_op.call
_logsumexp_backward_call = logsumexp_backward_op.call
_is_compiling = torch.compiler.is_compiling


# -- public functions and autograd ------------------------------------------------------------------
class LogsumexpFunction(torch.autograd.Function):
    """Autograd for :func:`logsumexp`: the tuned forward, the tuned fused backward."""

    @staticmethod
    def forward(ctx, x, dims, keepdim):
        lse = _logsumexp_call(LogsumexpParams(x, dims, keepdim))
        ctx.save_for_backward(x, lse)
        ctx.tuning = captured()  # the backward may run on autograd's thread
        ctx.dims, ctx.keepdim = dims, keepdim
        return lse

    @staticmethod
    def backward(ctx, dy):
        x, lse = ctx.saved_tensors
        # autograd often hands an expanded gradient (from .sum()); one value per result is small
        dy = dy.contiguous()
        with inherited(ctx.tuning):
            return logsumexp_backward(dy, x, lse, ctx.dims, ctx.keepdim), None, None


def logsumexp(input: torch.Tensor, dim, keepdim: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``log(sum(exp(input), dim))`` computed stably, by the fastest correct candidate.

    ``torch.logsumexp(input, dim, keepdim=False, *, out=None)``'s arguments, results and errors.
    tunekit computes a float tensor (``ops/_shared/arguments.py``) reduced over an int or a non-empty
    tuple / list of valid dims with a bool ``keepdim``, into a new tensor or an ``out`` of the
    result's shape, dtype and device; every other call (integers, complex, names or an empty tuple
    as ``dim``, invalid dims, an ``out`` torch resizes or casts, ``out=`` under autograd) runs torch's
    own function with the same arguments.
    """
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_logsumexp(input, dim, keepdim, out=out)
    if not (computes(input) and type(keepdim) is bool and routing.plain_dims(dim)):
        return _torch_call(input, dim, keepdim, out)
    try:
        dims = normalize_dims(dim, input.dim())
    except ValueError:  # out of range, repeated: torch's error
        return _torch_call(input, dim, keepdim, out)
    grad = input.requires_grad and torch.is_grad_enabled()
    if out is not None:
        if grad or not writable_out(out, input, reduced_shape(input, dims, keepdim)):
            return _torch_call(input, dim, keepdim, out)
        _logsumexp_call(LogsumexpParams(input, dims, keepdim, out))
        return out
    if grad:
        if input.numel() <= TORCH_NODE_MAX_NUMEL and input.dtype in _TORCH_NODE_DTYPES:  # torch's node, or None
            y = _logsumexp_grad_call.call(input, dims, keepdim)
            if y is not None:
                return y
        return LogsumexpFunction.apply(input, dims, keepdim)
    return _logsumexp_call(LogsumexpParams(input, dims, keepdim))


#: Under autograd, inputs of at most this many elements get tunekit's forward with torch's own
#: ``LogsumexpBackward0`` (torch's gradient formula and host cost) instead of LogsumexpFunction (the
#: tuned fused gradient, at the Python Function's host cost: 167 against torch's 97 us forward +
#: backward at 64x64 float32 on the CPU host). At this size torch's three-kernel gradient costs a few
#: us of device time, well under the host time of any autograd call; above it the tuned gradient runs
#: at memory speed where torch's took 2-6x longer (issue 22). Only where torch's formula computes at
#: tunekit's precision: in 16-bit it rounds ``x - lse`` to the input's type (2% off at |x - lse| ~ 5,
#: outside FlagGems' bfloat16 tolerance: tests/ops/test_flaggems_accuracy.py), so 16-bit keeps the Function.
TORCH_NODE_MAX_NUMEL = 1 << 16
_TORCH_NODE_DTYPES = (torch.float32, torch.float64)
_logsumexp_grad_call = GradCall(lambda x, dims, keepdim: _logsumexp_call(LogsumexpParams(x, dims, keepdim)),
                                "logsumexp")


def _torch_call(input, dim, keepdim, out):
    """torch's own logsumexp with the caller's arguments: its result, warning or exception."""
    if out is None:
        return _torch_logsumexp(input, dim, keepdim)
    return _torch_logsumexp(input, dim, keepdim, out=out)


def logsumexp_backward(dy, x, lse, dim, keepdim: bool = False) -> torch.Tensor:
    """The gradient of :func:`logsumexp`: ``dy * exp(x - lse)`` broadcast over the reduced dims.
    When the result must itself be differentiable (double backward), torch ops run."""
    if _is_compiling():  # torch.compile: the custom op, no graph break
        return compiled_logsumexp_backward(dy, x, lse, dim, keepdim)
    dims = normalize_dims(dim, x.dim())
    p = LogsumexpBackwardParams(dy, x, lse, dims, bool(keepdim))
    if transformed() or (torch.is_grad_enabled() and (dy.requires_grad or x.requires_grad or lse.requires_grad)):
        return torch_logsumexp_backward(p)  # torch ops (also under forward-mode AD and torch.func transforms)
    return _logsumexp_backward_call(p)


# -- torch.library: tunekit::logsumexp, tunekit::logsumexp_backward (ops/_shared/custom_ops.py) ----
# Both refuse an empty ``dim`` (torch.logsumexp's own handling of ``()`` is inconsistent):
# :func:`compiled_logsumexp` passes that case, integer inputs and invalid dims to torch.logsumexp,
# as eager tunekit does. Results and the gradient are contiguous.
def _dims(dim, x: torch.Tensor, op: str) -> tuple[int, ...]:
    dims = normalize_dims(dim, x.dim())
    if not dims:
        raise ValueError(f"tunekit::{op}: dim must name at least one dimension")
    return dims


def _check_reduced(op: str, name: str, t: torch.Tensor, x: torch.Tensor, shape: list) -> None:
    if list(t.shape) != shape or t.device != x.device or not t.is_floating_point():
        raise ValueError(f"tunekit::{op}: {name} must be a floating-point tensor of the reduced shape {shape} on "
                         f"{x.device}, got {t.dtype}{list(t.shape)} on {t.device}")


def _check_backward(dy, x, lse, dim, keepdim) -> tuple[int, ...]:
    check_float_tensor("logsumexp_backward", x)
    dims = _dims(dim, x, "logsumexp_backward")
    shape = reduced_shape(x, dims, keepdim)
    _check_reduced("logsumexp_backward", "dy", dy, x, shape)
    _check_reduced("logsumexp_backward", "lse", lse, x, shape)
    return dims


@torch.library.custom_op("tunekit::logsumexp", mutates_args=(),
                         schema="(Tensor x, int[] dim, bool keepdim) -> Tensor")
def logsumexp_custom(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
    """``tunekit.logsumexp(x, dim, keepdim)`` as a custom op: the tunable op ``logsumexp`` at run time."""
    check_float_tensor("logsumexp", x)
    return contiguous(_logsumexp_call(LogsumexpParams(x, _dims(dim, x, "logsumexp"), keepdim)))


@logsumexp_custom.register_fake
def _logsumexp_fake(x, dim, keepdim):
    check_float_tensor("logsumexp", x)
    return x.new_empty(reduced_shape(x, _dims(dim, x, "logsumexp"), keepdim))


@torch.library.custom_op("tunekit::logsumexp_backward", mutates_args=(),
                         schema="(Tensor dy, Tensor x, Tensor lse, int[] dim, bool keepdim) -> Tensor")
def logsumexp_backward_custom(dy: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, dim: list[int],
                              keepdim: bool) -> torch.Tensor:
    """``tunekit.logsumexp_backward(dy, x, lse, dim, keepdim)`` as a custom op (``dy * exp(x - lse)``)."""
    dims = _check_backward(dy, x, lse, dim, keepdim)
    # a 0-d x reduces nothing away: keepdim=True spares it an unsqueeze (which would give shape [1])
    return contiguous(_logsumexp_backward_call(LogsumexpBackwardParams(dy, x, lse, dims, keepdim or x.dim() == 0)))


@logsumexp_backward_custom.register_fake
def _logsumexp_backward_fake(dy, x, lse, dim, keepdim):
    _check_backward(dy, x, lse, dim, keepdim)
    return x.new_empty(x.shape)


def _save_logsumexp(ctx, inputs, output):
    x, dim, keepdim = inputs
    ctx.save_for_backward(x, output)
    ctx.dim, ctx.keepdim = list(dim), keepdim


def _logsumexp_grad(ctx, grad):
    x, lse = ctx.saved_tensors
    # autograd often hands an expanded gradient (from .sum()): one value per result is small
    return tunekit_ops.logsumexp_backward(grad.contiguous(), x, lse, ctx.dim, ctx.keepdim), None, None


def _logsumexp_backward_grad(ctx, grad):
    """dx = dy' e with e = exp(x - lse') (' : unsqueezed): d/ddy = sum(g e), d/dx = g dy' e,
    d/dlse = -sum(g dy' e), sums over the reduced dims."""
    dy, x, lse = ctx.saved_tensors
    dim, keepdim = ctx.arguments
    dims = normalize_dims(dim, x.dim())
    t = compute_dtype(x)
    g = grad.to(t)
    e = torch.exp(x.to(t) - unsqueezed(lse.to(t), dims, keepdim, x.dim()))
    gdy = gx = glse = None
    if ctx.needs_input_grad[0]:
        gdy = (g * e).sum(dims, keepdim=keepdim).to(dy.dtype) if x.dim() else (g * e).to(dy.dtype)
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        gdx = g * unsqueezed(dy.to(t), dims, keepdim, x.dim()) * e
        if ctx.needs_input_grad[1]:
            gx = gdx.to(x.dtype)
        if ctx.needs_input_grad[2]:
            glse = -(gdx.sum(dims, keepdim=keepdim) if x.dim() else gdx).to(lse.dtype)
    return gdy, gx, glse, None, None


logsumexp_custom.register_autograd(_logsumexp_grad, setup_context=_save_logsumexp)
logsumexp_backward_custom.register_autograd(_logsumexp_backward_grad, setup_context=save_inputs)


def _traceable_dims(dim, ndim: int):
    """normalize_dims without exceptions (Dynamo traces this): sorted dims, or None where torch decides."""
    dims = [dim] if type(dim) is int else list(dim) if isinstance(dim, (tuple, list)) else None
    if not dims:
        return None
    rank = max(ndim, 1)
    out = []
    for d in dims:
        if type(d) is not int or not -rank <= d < rank or d % rank in out:
            return None
        out.append(d % rank)
    return sorted(out)


def compiled_logsumexp(input: torch.Tensor, dim, keepdim: bool = False, *, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """``tunekit.logsumexp`` under torch.compile: ``tunekit::logsumexp`` for the calls eager tunekit
    computes without ``out``; ``torch.logsumexp`` (its promotion, its errors, its ``out=``) for the rest."""
    dims = None
    if out is None and type(keepdim) is bool and traced_computes(input):
        dims = _traceable_dims(dim, input.dim())
    if dims is None:
        return _torch_call(input, dim, keepdim, out)
    return tunekit_ops.logsumexp(input, dims, keepdim)


def compiled_logsumexp_backward(dy, x, lse, dim, keepdim: bool = False) -> torch.Tensor:
    """``tunekit.logsumexp_backward`` under torch.compile."""
    return tunekit_ops.logsumexp_backward(dy, x, lse, list(normalize_dims(dim, x.dim())), bool(keepdim))


# -- drop-in use: tunekit.patch() -----------------------------------------------------------------
def routed_logsumexp(x: torch.Tensor, dim, keepdim: bool, out=None) -> torch.Tensor:
    """:func:`logsumexp` for a call routed from torch's entry points (``ops/silu.py``'s ``routed_silu``)."""
    state = routing.state
    state.inside = True
    try:
        return logsumexp(x, dim, keepdim, out=out)
    finally:
        state.inside = False


_NOT_TAKEN = object()
_any_autocast = torch._C._is_any_autocast_enabled


def _routed_call(x, dim, keepdim, out=None):
    """tunekit's logsumexp when it takes this call, else ``_NOT_TAKEN``. Not under autocast: some
    backends put logsumexp on their float32 list, which only torch's function applies."""
    if (type(keepdim) is bool and routing.plain_dims(dim) and routing.takes(x)
            and not (_any_autocast() and torch.is_autocast_enabled(x.device.type))):
        return routed_logsumexp(x, dim, keepdim, out)
    return _NOT_TAKEN


def patched_function(attr):
    """``torch.logsumexp``'s replacement; forms tunekit does not take go to torch (an ``out=`` tunekit
    cannot write goes there from :func:`logsumexp`)."""
    def logsumexp(*args, **kwargs):
        if attr.users:
            bound = routing.bind(args, kwargs, ("input", "dim", "keepdim"), ("out",), {"keepdim": False, "out": None})
            if bound is not None:
                result = _routed_call(bound["input"], bound["dim"], bound["keepdim"], bound["out"])
                if result is not _NOT_TAKEN:
                    return result
        return attr.original(*args, **kwargs)
    return logsumexp


def patched_method(attr):
    """``torch.Tensor.logsumexp``'s replacement."""
    def logsumexp(self, *args, **kwargs):
        if attr.users:
            bound = routing.bind(args, kwargs, ("dim", "keepdim"), defaults={"keepdim": False})
            if bound is not None:
                result = _routed_call(self, bound["dim"], bound["keepdim"])
                if result is not _NOT_TAKEN:
                    return result
        return attr.original(self, *args, **kwargs)
    return logsumexp
