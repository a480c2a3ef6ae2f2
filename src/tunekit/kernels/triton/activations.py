"""Triton kernels for the elementwise activations (silu, gelu) and their backward passes.

Why they are written the way they are:

- Math in fp32 whatever the storage dtype: fp16/bf16 inputs are widened on load and rounded once on
  store, as PyTorch's own kernels do, so results agree with torch to the dtype's rounding.
- 64-bit offsets (``pid.to(tl.int64) * BLOCK``): ``pid * BLOCK`` in int32 wraps past 2**31 elements.
- Masked loads and stores: any ``n``, not just multiples of ``BLOCK``; lanes past the end touch nothing.
- Backward formulas are PyTorch's, term by term, so NaN and inf propagate where torch's do (gelu's
  tanh form gets ``1 + t`` and ``1 - t*t`` from a cancellation-free helper; same values, same NaNs).
- ``tl.math.erf`` (a core op since Triton 3.0, lowered to libdevice's erff on NVIDIA) and ``tl.exp``
  only; gelu's tanh is built from exp below (the libdevice module path moved between releases), in
  a form more accurate than ``1 + tanhf(u)``.

Each kernel takes its tensors, then ``out``, then ``n``; ``BLOCK`` (and ``TANH``) are constexprs.
With ``TRITON_INTERPRET=1`` set before this module is imported they run on CPU tensors (tests).
"""

import triton
import triton.language as tl

__all__ = ["silu_forward_kernel", "silu_backward_kernel", "gelu_forward_kernel", "gelu_backward_kernel"]

# Globals read inside a kernel must be constexpr (Triton rejects plain globals since 3.2 or so).
# Kernels write them right of a tensor (``x * K``): in the interpreter ``K * x`` is
# ``constexpr.__mul__``, which wraps the tensor in a constexpr that tl.where/tl.abs then reject.
_SQRT1_2 = 0.70710678118654752440  # M_SQRT1_2
_2_SQRTPI = 1.12837916709551257390  # M_2_SQRTPI
_SQRT2 = 1.41421356237309504880  # M_SQRT2
M_SQRT1_2 = tl.constexpr(_SQRT1_2)
K_ALPHA = tl.constexpr(_2_SQRTPI * _SQRT1_2 * 0.5)  # 1/sqrt(2*pi), the normal pdf's factor
K_BETA = tl.constexpr(_SQRT2 * _2_SQRTPI * 0.5)  # sqrt(2/pi)
K_KAPPA = tl.constexpr(0.044715)


@triton.jit
def _one_plus_minus_tanh(u):
    """``(1 + tanh(u), 1 - tanh(u))`` in fp32, from ``e = exp(-2|u|)`` in [0, 1]:
    ``1 + tanh(u) = 2e/(1+e)`` for u < 0 and ``2/(1+e)`` otherwise (``1 - tanh`` the other way round).

    gelu needs tanh only as ``1 + t`` and ``1 - t*t = (1+t)(1-t)``. Forming ``t`` first and then
    ``1 + t`` cancels where t is near -1 (x < -3: 1e-4 relative error, more than float32's tolerance;
    torch's own float32 gelu_backward has it). Here there is no cancellation, exp never overflows
    (large |u| gives e = 0: exactly 0 and 2, as tanh = +-1 would), and NaN stays NaN.
    """
    neg = u < 0.0
    e = tl.exp(-2.0 * tl.where(neg, -u, u))
    big = 2.0 / (1.0 + e)
    small = e * big
    return tl.where(neg, small, big), tl.where(neg, big, small)


@triton.jit
def _offsets(n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def silu_forward_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs, mask = _offsets(n, BLOCK)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-x))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offs, mask = _offsets(n, BLOCK)
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-x))
    dx = dy * s * (1.0 + x * (1.0 - s))
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_forward_kernel(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask = _offsets(n, BLOCK)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        one_plus_t, _ = _one_plus_minus_tanh((x + x * x * x * K_KAPPA) * K_BETA)
        y = 0.5 * x * one_plus_t
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * M_SQRT1_2))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask = _offsets(n, BLOCK)
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        x_sq = x * x
        one_plus_t, one_minus_t = _one_plus_minus_tanh((x + x_sq * x * K_KAPPA) * K_BETA)
        left = 0.5 * x
        left_d = 0.5 * one_plus_t  # 0.5 * (1 + t)
        tanh_d = one_plus_t * one_minus_t  # 1 - t*t
        inner_d = (1.0 + x_sq * (3.0 * K_KAPPA)) * K_BETA
        dx = dy * (left_d + left * tanh_d * inner_d)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(x * M_SQRT1_2))
        pdf = tl.exp(-0.5 * x * x) * K_ALPHA
        dx = dy * (cdf + x * pdf)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
