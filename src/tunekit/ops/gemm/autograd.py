"""Autograd for every GEMM form: one Function whose backward is GEMMs, tuned as such.

:class:`GemmFunction` computes ``ACT(alpha * A @ B + beta * C)`` (C optional: the ``mm`` op without
it, the ``addmm`` op with it). ``weight=True`` is linear's form: the second tensor is the weight
[N, K] and B its transpose (a view), so the weight's gradient comes out [N, K], row-major, as
``grad^T @ x``, and needs no transposing copy. The backward, for z = alpha * A @ B + beta * C:

    dz = ACT'(z) * dy      dC = beta * dz (summed over broadcast dims)
    dA = alpha * dz @ B^T  dB = alpha * A^T @ dz   (weight: dW = alpha * dz^T @ A)

each a tuned call of the ``mm`` op with its own signature (transposed views: no copies), recorded
by this Function again when the backward itself is recorded (``create_graph=True``).

With an activation, the forward that autograd records runs the GEMM and then torch's activation,
and keeps z for the backward (torch's own cost: the fused epilogue saves a pass only where no
gradient is needed). Recorded double backward recomputes z differentiably.
"""

from __future__ import annotations

import torch

from .checks import needs_grad
from .op import addmm_op, mm_op
from .params import AddmmParams, GemmParams
from .torch_candidates import activation_function
from ...tunable.context import captured, inherited

__all__ = ["GemmFunction", "gemm_call", "activation_backward", "backward_operands"]

_mm_call, _addmm_call = mm_op.call, addmm_op.call


def gemm_call(c, a, b, alpha, beta, activation: str) -> torch.Tensor:
    """One tuned GEMM: the ``mm`` op without C, the ``addmm`` op with it."""
    if c is None:
        return _mm_call(GemmParams(a, b, None, activation))
    return _addmm_call(AddmmParams(c, a, b, alpha, beta, None, activation))


def _matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y (2-D or batched) as a tuned call; recorded when the backward itself is."""
    if needs_grad(x, y):
        return GemmFunction.apply(None, x, y, 1, 1, "none", False)
    return _mm_call(GemmParams(x, y))


def backward_operands(dz, a, b, weight: bool, needs_a: bool, needs_b: bool) -> list:
    """The backward's GEMMs as ``(x, y)`` pairs of ``x @ y``: dA's when ``needs_a``, then dB's (dW's
    for ``weight``) when ``needs_b`` (the module docstring's formulas, before alpha)."""
    pairs = []
    if needs_a:
        pairs.append((dz, b if weight else b.mT))
    if needs_b:
        pairs.append((dz.mT, a) if weight else (a.mT, dz))
    return pairs


_aten = torch.ops.aten


def activation_backward(dy: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """torch's first-order gradient of the activation at z."""
    if activation == "relu":
        return _aten.threshold_backward(dy, z, 0)
    if activation == "silu":
        return _aten.silu_backward(dy, z)
    return _aten.gelu_backward(dy, z, approximate="tanh" if activation == "gelu_tanh" else "none")


class GemmFunction(torch.autograd.Function):
    """``apply(c, a, b, alpha, beta, activation, weight)``; ``c`` may be None (no C term)."""

    @staticmethod
    def forward(ctx, c, a, b, alpha, beta, activation, weight):
        B = b.mT if weight else b
        if activation == "none":
            y, z = gemm_call(c, a, B, alpha, beta, "none"), None
        else:
            z = gemm_call(c, a, B, alpha, beta, "none")
            y = activation_function(activation)(z)
        ctx.save_for_backward(c, a, b, z)
        ctx.options = (alpha, beta, activation, weight)
        ctx.c_shape = None if c is None else c.shape
        ctx.tuning = captured()  # the backward may run on autograd's thread
        return y

    @staticmethod
    def backward(ctx, dy):
        c, a, b, z = ctx.saved_tensors
        alpha, beta, activation, weight = ctx.options
        with inherited(ctx.tuning):
            dz = dy if activation == "none" else _dz(ctx, dy, c, a, b, z)
            dc = da = db = None
            if ctx.needs_input_grad[0]:
                dc = (dz if beta == 1 else dz * beta).sum_to_size(ctx.c_shape)
            needs_a, needs_b = ctx.needs_input_grad[1:3]
            grads = [_scaled(_matmul(x, y), alpha) for x, y in backward_operands(dz, a, b, weight, needs_a, needs_b)]
            da = grads[0] if needs_a else None
            db = grads[-1] if needs_b else None
        return dc, da, db, None, None, None, None


def _scaled(t: torch.Tensor, alpha) -> torch.Tensor:
    return t if alpha == 1 else t * alpha


def _dz(ctx, dy, c, a, b, z) -> torch.Tensor:
    """ACT'(z) * dy; differentiable in the inputs when the backward is recorded (z recomputed with
    torch's differentiable ops: double backward through an activation is rare)."""
    alpha, beta, activation, weight = ctx.options
    if not torch.is_grad_enabled():
        return activation_backward(dy, z, activation)
    zz = _scaled(a @ (b.mT if weight else b), alpha)
    if c is not None and beta != 0:
        zz = zz + beta * c
    y = activation_function(activation)(zz)
    return torch.autograd.grad(y, zz, dy, create_graph=True)[0]
