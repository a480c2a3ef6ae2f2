"""torch.compile support: every tunekit op as a ``torch.library`` custom op, ``torch.ops.tunekit.*``.

Why custom ops. Dynamo cannot trace a TunableOp call (a ContextVar, dicts keyed on data pointers
and, on a miss, candidates timed on real data), so each tunekit call would break the graph. A custom
op is opaque to the compiler: tracing runs only its fake implementation (the result's shape, dtype
and strides: no data, no tuning), and the compiled graph calls its real implementation at run time,
which is the very call eager code makes (``silu_op.call(SiluParams(x))``): the same choice cache,
the same results store, tuning on the first *run* of a new signature, never while tracing.

Why eager calls do not go through them. Crossing the dispatcher into a Python custom op costs 7 to
10 µs a call, several times tunekit's whole cached path. The public functions keep their direct path
and hand over to the ``compiled_*`` functions below only while ``torch.compiler.is_compiling()``
(one test at the top of each; Dynamo inlines the ``compiled_*`` function into the graph).

Registered, each ``mutates_args=()``, for every device, with a fake implementation and autograd::

    tunekit::silu(Tensor x) -> Tensor
    tunekit::silu_backward(Tensor dy, Tensor x) -> Tensor
    tunekit::gelu(Tensor x, str approximate) -> Tensor
    tunekit::gelu_backward(Tensor dy, Tensor x, str approximate) -> Tensor
    tunekit::logsumexp(Tensor x, int[] dim, bool keepdim) -> Tensor
    tunekit::logsumexp_backward(Tensor dy, Tensor x, Tensor lse, int[] dim, bool keepdim) -> Tensor

A forward op's gradient is its backward op, so a compiled backward graph runs the tuned gradient.
A backward op's own gradient (double backward) is that backward op again for ``dy`` (it is linear
in ``dy``) and torch composites for the rest (computed in float32 for 16-bit inputs), as eager
tunekit differentiates through torch ops there.

Layouts: elementwise results have ``torch.empty_like(x)``'s strides (x's for dense inputs, else
contiguous); logsumexp results and its gradient are contiguous. The real implementations copy when
a candidate returned another layout (only torch's kernels on non-dense inputs do), so fake and real
agree exactly, as the compiler requires.

Limits:

- Only the functional forms are custom ops. ``out=`` and ``inplace=True`` under torch.compile run
  torch's own ops (``silu(x, out=)``, ``gelu_`` ...) with torch's rules, which the compiler
  functionalizes and may fuse; tunekit's partial-overlap check of ``out`` (data pointers) is
  skipped while compiling.
- A custom op is a fusion barrier: Inductor does not fuse across it. Worth it where the tuned kernel
  beats the fused code, which is what tuning says; otherwise call torch's op in compiled code.
- Tracing the public functions without Dynamo (``make_fx``, ``torch.func`` transforms,
  ``torch.jit.trace``) is not supported: call ``torch.ops.tunekit.*`` there (no vmap rule either).
- Settings (``tunekit.tuning()``) apply around a compiled call, at run time; a ``with
  tunekit.tuning()`` block inside the compiled function would break the graph.
- Code that loads an exported program (``torch.export``) naming ``torch.ops.tunekit.*`` must import
  tunekit first, as for any custom op.
- Under CUDA-graph capture (``mode="reduce-overhead"``) the runtime's rule holds: nothing is tuned
  while capturing; Inductor's eager warm-up run tunes first.
- ``tunekit::logsumexp*`` refuse an empty ``dim`` (torch.logsumexp's own handling of ``()`` is
  inconsistent); :func:`compiled_logsumexp` passes that case, integer inputs and invalid dims to
  ``torch.logsumexp`` as eager tunekit does.
"""

import torch

from .ops._arguments import check_approximate, check_float_tensor, check_gradient_pair
from .ops.gelu import GeluBackwardParams, GeluParams, gelu_backward_op, gelu_op
from .ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, _unsqueezed, logsumexp_backward_op,
                            logsumexp_op, normalize_dims, reduced_shape)
from .ops.silu import SiluBackwardParams, SiluParams, silu_backward_op, silu_op

__all__ = ["CUSTOM_OPS", "compiled_silu", "compiled_silu_backward", "compiled_gelu", "compiled_gelu_backward",
           "compiled_logsumexp", "compiled_logsumexp_backward"]

_HALF = (torch.float16, torch.bfloat16)
_ops = torch.ops.tunekit  # resolved lazily by attribute, so it can be bound before the ops exist


# -- layouts --------------------------------------------------------------------------------------
def _like_x(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` laid out as ``torch.empty_like(x)`` (the fake's result): a copy only when it is not."""
    if y.stride() == x.stride() and x.is_contiguous():  # every call on a contiguous x
        return y
    if y.stride() == torch.empty_like(x, device="meta").stride():
        return y
    return torch.empty_like(x).copy_(y)


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _contiguous(y: torch.Tensor) -> torch.Tensor:
    """``y`` with exactly ``torch.empty(y.shape)``'s strides (size-1 dims included)."""
    if y.stride() == _contiguous_strides(y.shape):
        return y
    return torch.empty(y.shape, dtype=y.dtype, device=y.device).copy_(y)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in _HALF else t.dtype


# -- silu -----------------------------------------------------------------------------------------
_silu_call = silu_op.call
_silu_backward_call = silu_backward_op.call


@torch.library.custom_op("tunekit::silu", mutates_args=())
def silu_custom(x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu(x)`` as a custom op: the tunable op ``silu`` at run time."""
    check_float_tensor("silu", x)
    return _like_x(_silu_call(SiluParams(x)), x)


@silu_custom.register_fake
def _silu_fake(x):
    check_float_tensor("silu", x)
    return torch.empty_like(x)


@torch.library.custom_op("tunekit::silu_backward", mutates_args=())
def silu_backward_custom(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu_backward(dy, x)`` as a custom op: the tunable op ``silu_backward``."""
    check_gradient_pair("silu_backward", dy, x)
    return _like_x(_silu_backward_call(SiluBackwardParams(dy, x)), x)


@silu_backward_custom.register_fake
def _silu_backward_fake(dy, x):
    check_gradient_pair("silu_backward", dy, x)
    return torch.empty_like(x)


def _silu_second_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 - s) * (2 + x * (1 - 2 * s))


# -- gelu -----------------------------------------------------------------------------------------
_gelu_call = gelu_op.call
_gelu_backward_call = gelu_backward_op.call


@torch.library.custom_op("tunekit::gelu", mutates_args=())
def gelu_custom(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``tunekit.gelu(x, approximate)`` as a custom op: the tunable op ``gelu`` at run time."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    return _like_x(_gelu_call(GeluParams(x, approximate)), x)


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
    return _like_x(_gelu_backward_call(GeluBackwardParams(dy, x, approximate)), x)


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


# -- logsumexp ------------------------------------------------------------------------------------
_logsumexp_call = logsumexp_op.call
_logsumexp_backward_call = logsumexp_backward_op.call


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
    return _contiguous(_logsumexp_call(LogsumexpParams(x, _dims(dim, x, "logsumexp"), keepdim)))


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
    return _contiguous(_logsumexp_backward_call(LogsumexpBackwardParams(dy, x, lse, dims, keepdim or x.dim() == 0)))


@logsumexp_backward_custom.register_fake
def _logsumexp_backward_fake(dy, x, lse, dim, keepdim):
    _check_backward(dy, x, lse, dim, keepdim)
    return x.new_empty(x.shape)



# -- autograd -------------------------------------------------------------------------------------
def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ctx.arguments = [a for a in inputs if not isinstance(a, torch.Tensor)]


def _silu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return _ops.silu_backward(grad, x)


def _silu_backward_grad(ctx, grad):
    dy, x = ctx.saved_tensors
    gdy = _ops.silu_backward(grad, x) if ctx.needs_input_grad[0] else None
    gx = None
    if ctx.needs_input_grad[1]:
        t = _compute_dtype(x)
        gx = (grad.to(t) * dy.to(t) * _silu_second_derivative(x.to(t))).to(x.dtype)
    return gdy, gx


def _gelu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return _ops.gelu_backward(grad, x, ctx.arguments[0]), None


def _gelu_backward_grad(ctx, grad):
    dy, x = ctx.saved_tensors
    approximate = ctx.arguments[0]
    gdy = _ops.gelu_backward(grad, x, approximate) if ctx.needs_input_grad[0] else None
    gx = None
    if ctx.needs_input_grad[1]:
        t = _compute_dtype(x)
        gx = (grad.to(t) * dy.to(t) * _gelu_second_derivative(x.to(t), approximate)).to(x.dtype)
    return gdy, gx, None


def _save_logsumexp(ctx, inputs, output):
    x, dim, keepdim = inputs
    ctx.save_for_backward(x, output)
    ctx.dim, ctx.keepdim = list(dim), keepdim


def _logsumexp_grad(ctx, grad):
    x, lse = ctx.saved_tensors
    # autograd often hands an expanded gradient (from .sum()): one value per result is small
    return _ops.logsumexp_backward(grad.contiguous(), x, lse, ctx.dim, ctx.keepdim), None, None


def _logsumexp_backward_grad(ctx, grad):
    """dx = dy' e with e = exp(x - lse') (' : unsqueezed): d/ddy = sum(g e), d/dx = g dy' e,
    d/dlse = -sum(g dy' e), sums over the reduced dims."""
    dy, x, lse = ctx.saved_tensors
    dim, keepdim = ctx.arguments
    dims = normalize_dims(dim, x.dim())
    t = _compute_dtype(x)
    g = grad.to(t)
    e = torch.exp(x.to(t) - _unsqueezed(lse.to(t), dims, keepdim, x.dim()))
    gdy = gx = glse = None
    if ctx.needs_input_grad[0]:
        gdy = (g * e).sum(dims, keepdim=keepdim).to(dy.dtype) if x.dim() else (g * e).to(dy.dtype)
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        gdx = g * _unsqueezed(dy.to(t), dims, keepdim, x.dim()) * e
        if ctx.needs_input_grad[1]:
            gx = gdx.to(x.dtype)
        if ctx.needs_input_grad[2]:
            glse = -(gdx.sum(dims, keepdim=keepdim) if x.dim() else gdx).to(lse.dtype)
    return gdy, gx, glse, None, None


silu_custom.register_autograd(_silu_grad, setup_context=_save_inputs)
silu_backward_custom.register_autograd(_silu_backward_grad, setup_context=_save_inputs)
gelu_custom.register_autograd(_gelu_grad, setup_context=_save_inputs)
gelu_backward_custom.register_autograd(_gelu_backward_grad, setup_context=_save_inputs)
logsumexp_custom.register_autograd(_logsumexp_grad, setup_context=_save_logsumexp)
logsumexp_backward_custom.register_autograd(_logsumexp_backward_grad, setup_context=_save_inputs)

#: op name -> its torch.library custom op (``torch.ops.tunekit.<name>`` is the same op)
CUSTOM_OPS = {"silu": silu_custom, "silu_backward": silu_backward_custom, "gelu": gelu_custom,
              "gelu_backward": gelu_backward_custom, "logsumexp": logsumexp_custom,
              "logsumexp_backward": logsumexp_backward_custom}


# -- what the public functions run while Dynamo traces them ---------------------------------------
def _check_out(op: str, x: torch.Tensor, out: torch.Tensor, inplace: bool) -> None:
    """elementwise_destination's checks that tracing can make (not the data-pointer overlap)."""
    if inplace and out is not None:
        raise ValueError(f"tunekit.{op}: pass either out= or inplace=True, not both")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"tunekit.{op}: out must match x in shape, dtype and device")


def compiled_silu(x: torch.Tensor, *, out: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """``tunekit.silu`` under torch.compile: ``tunekit::silu``, or torch's op for out= / inplace."""
    check_float_tensor("silu", x)
    if out is None and not inplace:
        return _ops.silu(x)
    _check_out("silu", x, out, inplace)
    if inplace or out is x:
        return torch.nn.functional.silu(x, inplace=True)
    return torch._C._nn.silu(x, out=out)


def compiled_gelu(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None,
                  inplace: bool = False) -> torch.Tensor:
    """``tunekit.gelu`` under torch.compile: ``tunekit::gelu``, or torch's op for out= / inplace."""
    check_float_tensor("gelu", x)
    check_approximate("gelu", approximate)
    if out is None and not inplace:
        return _ops.gelu(x, approximate)
    _check_out("gelu", x, out, inplace)
    if inplace or out is x:
        return torch._C._nn.gelu_(x, approximate=approximate)
    return torch._C._nn.gelu(x, approximate=approximate, out=out)


def compiled_silu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``tunekit.silu_backward`` under torch.compile."""
    return _ops.silu_backward(dy, x)


def compiled_gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``tunekit.gelu_backward`` under torch.compile."""
    return _ops.gelu_backward(dy, x, approximate)


def _traceable_dims(dim, ndim: int):
    """normalize_dims without exceptions (Dynamo traces this): sorted dims, or None where torch decides."""
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (tuple, list)) else None
    if not dims:
        return None
    rank = max(ndim, 1)
    out = []
    for d in dims:
        if not isinstance(d, int) or not -rank <= d < rank or d % rank in out:
            return None
        out.append(d % rank)
    return sorted(out)


def compiled_logsumexp(x: torch.Tensor, dim, keepdim: bool = False) -> torch.Tensor:
    """``tunekit.logsumexp`` under torch.compile: ``tunekit::logsumexp``; integer inputs, empty or invalid
    dims go to ``torch.logsumexp`` (its promotion, its errors), as in eager tunekit."""
    dims = _traceable_dims(dim, x.dim()) if isinstance(x, torch.Tensor) and x.is_floating_point() else None
    if dims is None:
        return torch.logsumexp(x, dim, keepdim)
    return _ops.logsumexp(x, dims, bool(keepdim))


def compiled_logsumexp_backward(dy, x, lse, dim, keepdim: bool = False) -> torch.Tensor:
    """``tunekit.logsumexp_backward`` under torch.compile."""
    return _ops.logsumexp_backward(dy, x, lse, list(normalize_dims(dim, x.dim())), bool(keepdim))
