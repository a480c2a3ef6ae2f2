"""The GEMM family under torch.compile: the custom ops ``tunekit::mm`` and ``tunekit::addmm`` (with
their fakes and autograd) and the ``compiled_*`` forms the public functions hand over to while
compiling (``ops/_shared/custom_ops.py`` says why custom ops, and their limits).

- ``tunekit::mm(Tensor a, Tensor b, str activation) -> Tensor``: ACT(a @ b), 2-D or batched (3-D).
- ``tunekit::addmm(Tensor c, Tensor a, Tensor b, float beta, float alpha, str activation) -> Tensor``:
  ACT(beta * c + alpha * a @ b), c broadcast to the result.

Results are contiguous. Their backward is the same ops on transposed views (the compiler sees
GEMMs it cannot fuse, each a tuned call at run time); an activation's gradient recomputes the
product (the compiled public functions avoid that: where autograd records a fused linear they call
the op without activation and then torch's activation, which the compiler fuses with its gradient).
Every form the eager functions leave to torch goes to torch's op here too (traced, not tuned).
"""

from __future__ import annotations

import torch

from ...backends.cublaslt_graphs import release_after_warm_up
from .autograd import activation_backward
from .op import addmm_op, mm_op
from .params import ACTIVATIONS, AddmmParams, GemmParams, folded
from .torch_candidates import activation_function
from .._shared.custom_ops import contiguous, tunekit_ops

__all__ = ["mm_custom", "addmm_custom", "compiled_mm", "compiled_bmm", "compiled_addmm", "compiled_baddbmm",
           "compiled_matmul", "compiled_linear"]

_mm_call, _addmm_call = mm_op.call, addmm_op.call
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _check(op: str, a: torch.Tensor, b: torch.Tensor, activation: str) -> None:
    if (a.dim() not in (2, 3) or b.dim() != a.dim() or a.shape[-1] != b.shape[-2]
            or (a.dim() == 3 and a.shape[0] != b.shape[0]) or a.dtype != b.dtype or a.device != b.device):
        raise RuntimeError(f"tunekit::{op}: a and b must be 2-D or 3-D of one dtype and device with matching inner "
                           f"sizes, got {a.dtype}{list(a.shape)} on {a.device} and {b.dtype}{list(b.shape)} on {b.device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"tunekit::{op}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")


def _result_shape(a, b):
    return (*a.shape[:-1], b.shape[-1])


@torch.library.custom_op("tunekit::mm", mutates_args=())
def mm_custom(a: torch.Tensor, b: torch.Tensor, activation: str) -> torch.Tensor:
    """ACT(a @ b) as a custom op: the tunable op ``mm`` at run time."""
    _check("mm", a, b, activation)
    try:
        return contiguous(_mm_call(GemmParams(a, b, None, activation)))
    finally:  # a cuBLASLt choice's workspace is not left in Inductor's graph pool, even by a call that raised
        release_after_warm_up(a.device)


@mm_custom.register_fake
def _mm_fake(a, b, activation):
    _check("mm", a, b, activation)
    return a.new_empty(_result_shape(a, b))


@torch.library.custom_op("tunekit::addmm", mutates_args=())
def addmm_custom(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float, alpha: float,
                 activation: str) -> torch.Tensor:
    """ACT(beta * c + alpha * a @ b) as a custom op: the tunable op ``addmm`` at run time."""
    _check("addmm", a, b, activation)
    try:
        return contiguous(_addmm_call(AddmmParams(c, a, b, alpha, beta, None, activation)))
    finally:
        release_after_warm_up(a.device)


@addmm_custom.register_fake
def _addmm_fake(c, a, b, beta, alpha, activation):
    _check("addmm", a, b, activation)
    torch.broadcast_shapes(c.shape, _result_shape(a, b))
    return a.new_empty(_result_shape(a, b))


def _save_mm(ctx, inputs, output):
    a, b, activation = inputs
    ctx.save_for_backward(a, b)
    ctx.activation = activation


def _mm_grad(ctx, dy):
    a, b = ctx.saved_tensors
    dz = dy
    if ctx.activation != "none":
        dz = activation_backward(dy, tunekit_ops.mm(a, b, "none"), ctx.activation)
    da = tunekit_ops.mm(dz, b.mT, "none") if ctx.needs_input_grad[0] else None
    db = tunekit_ops.mm(a.mT, dz, "none") if ctx.needs_input_grad[1] else None
    return da, db, None


def _save_addmm(ctx, inputs, output):
    c, a, b, beta, alpha, activation = inputs
    ctx.save_for_backward(c, a, b)
    ctx.options = (beta, alpha, activation)


def _addmm_grad(ctx, dy):
    c, a, b = ctx.saved_tensors
    beta, alpha, activation = ctx.options
    dz = dy
    if activation != "none":
        dz = activation_backward(dy, tunekit_ops.addmm(c, a, b, beta, alpha, "none"), activation)
    dc = (dz * beta).sum_to_size(c.shape) if ctx.needs_input_grad[0] else None
    da = tunekit_ops.mm(dz, b.mT, "none") * alpha if ctx.needs_input_grad[1] else None
    db = tunekit_ops.mm(a.mT, dz, "none") * alpha if ctx.needs_input_grad[2] else None
    return dc, da, db, None, None, None


mm_custom.register_autograd(_mm_grad, setup_context=_save_mm)
addmm_custom.register_autograd(_addmm_grad, setup_context=_save_addmm)


# -- the public functions while compiling (Dynamo traces these) -------------------------------------
def _traced_pair(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype in _FLOATS and b.dtype == a.dtype
            and a.layout == torch.strided and b.layout == torch.strided and a.device == b.device
            and a.device.type in ("cuda", "cpu"))


def _traced_matrices(a, b, dims: int) -> bool:
    return (_traced_pair(a, b) and a.dim() == dims and b.dim() == dims and a.shape[-1] == b.shape[-2]
            and (dims == 2 or a.shape[0] == b.shape[0]))


def compiled_mm(input, mat2, *, out=None):
    if out is None and _traced_matrices(input, mat2, 2):
        return tunekit_ops.mm(input, mat2, "none")
    return torch.mm(input, mat2) if out is None else torch.mm(input, mat2, out=out)


def compiled_bmm(input, mat2, *, out=None):
    if out is None and _traced_matrices(input, mat2, 3):
        return tunekit_ops.mm(input, mat2, "none")
    return torch.bmm(input, mat2) if out is None else torch.bmm(input, mat2, out=out)


def _traced_addmm(input, a, b, beta, alpha, out, dims: int) -> bool:
    if not (out is None and _traced_matrices(a, b, dims) and isinstance(input, torch.Tensor)
            and input.dtype == a.dtype and input.device == a.device and type(beta) in (int, float)
            and type(alpha) in (int, float) and input.dim() <= dims):
        return False
    shape = _result_shape(a, b)
    return all(s == 1 or s == t for s, t in zip(reversed(input.shape), reversed(shape)))


def compiled_addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    if _traced_addmm(input, mat1, mat2, beta, alpha, out, 2):
        return tunekit_ops.addmm(input, mat1, mat2, float(beta), float(alpha), "none")
    if out is None:
        return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha, out=out)


def compiled_baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    if _traced_addmm(input, batch1, batch2, beta, alpha, out, 3):
        return tunekit_ops.addmm(input, batch1, batch2, float(beta), float(alpha), "none")
    if out is None:
        return torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha)
    return torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha, out=out)


def compiled_matmul(input, other, *, out=None):
    if (out is None and _traced_pair(input, other) and input.dim() >= 2 and other.dim() >= 2
            and input.shape[-1] == other.shape[-2]):
        if other.dim() == 2:
            flat = tunekit_ops.mm(folded(input), other, "none")
            return flat if input.dim() == 2 else flat.view(*input.shape[:-1], other.shape[-1])
        if input.dim() == 3 and other.dim() == 3 and (input.shape[0] == other.shape[0]):
            return tunekit_ops.mm(input, other, "none")
    return torch.matmul(input, other) if out is None else torch.matmul(input, other, out=out)


def compiled_linear(input, weight, bias, activation: str):
    """``tunekit.linear`` / ``linear_act`` under torch.compile. Where autograd records the call, the
    product runs without the activation and torch's activation follows (fused by the compiler)."""
    if (_traced_pair(input, weight) and input.dim() >= 2 and weight.dim() == 2 and input.shape[-1] == weight.shape[1]
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dim() == 1 and bias.dtype == input.dtype
                                  and bias.shape[0] == weight.shape[0] and bias.device == input.device))):
        x = folded(input)
        recorded = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                                or (bias is not None and bias.requires_grad))
        fused = "none" if recorded else activation
        y = (tunekit_ops.mm(x, weight.t(), fused) if bias is None
             else tunekit_ops.addmm(bias, x, weight.t(), 1.0, 1.0, fused))
        if fused != activation:
            y = activation_function(activation)(y)
        return y if input.dim() == 2 else y.view(*input.shape[:-1], weight.shape[0])
    return activation_function(activation)(torch.nn.functional.linear(input, weight, bias))
