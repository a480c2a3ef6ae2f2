"""Inductor's mm template as tunekit GEMM kernels: small GEMMs with odd sizes (777 x 1555 x 333 bf16), where
cuBLAS runs at 4% of peak and tunekit's pointer kernel (``gemm.matmul_kernel``) no faster than cuBLAS, but
this template 1.41x faster (H100, ``benchmarks/results/gemm_odd_single_kernel-NVIDIA_H100_80GB_HBM3.txt``).

How it differs from ``gemm.matmul_kernel``:
- rows past M and columns past N *wrap* (``rm % M``): every load is in bounds without an M / N mask
  (the wrapped rows are computed and never stored), so loads along K vectorize even where M, N are odd;
- int32 indices, the K offsets recomputed from the loop index (no int64 pointer tensors carried through
  the loop): the host refuses operands whose element offsets reach 2^31;
- ``matmul_wrapped_static_kernel`` takes the sizes and strides as compile-time constants (Inductor's
  ``dynamic=False``): 13.95 us against 14.95 with them at run time, but one compile per shape (about
  a second), so it is worth it where offline tuning ships the choice.

The signature is ``gemm.py``'s shared one (the batch must be 1: ``stride_*b`` unused; ``ws_ptr``
unused: no split-K), and the epilogue is ``gemm._epilogue`` (alpha, beta * C, bias, activation, one
rounding on store): the host launcher is ``tunekit/ops/gemm/triton_wrapped.py``.
"""

import triton
import triton.language as tl

from .gemm import _dot, _epilogue, _tile_ids

__all__ = ["matmul_wrapped_kernel", "matmul_wrapped_static_kernel"]


@triton.jit
def _wrapped(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, M, N, K,
             stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias, stride_om, stride_on,
             alpha, beta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr,
             ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One output tile: rows / columns wrapped for the loads, masked for the store."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    am = rm % M
    bn = rn % N
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        ka = rk[None, :] + k * BLOCK_K
        kb = rk[:, None] + k * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptr + am[:, None] * stride_am + ka * stride_ak)
            b = tl.load(b_ptr + kb * stride_bk + bn[None, :] * stride_bn)
        else:
            a = tl.load(a_ptr + am[:, None] * stride_am + ka * stride_ak, mask=ka < K, other=0.0)
            b = tl.load(b_ptr + kb * stride_bk + bn[None, :] * stride_bn, mask=kb < K, other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION)
    y, mask = _epilogue(acc, 0, rm, rn, M, N, c_ptr, 0, stride_cm, stride_cn, bias_ptr, stride_bias, alpha, beta,
                        HAS_C, HAS_BIAS, ACTIVATION)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_wrapped_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr, M, N, K, batch,
                          stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                          stride_cb, stride_cm, stride_cn, stride_bias, stride_ob, stride_om, stride_on,
                          alpha, beta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, HAS_C: tl.constexpr,
                          HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Sizes and strides at run time. Grid ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``; batch 1, M, N >= 1."""
    _wrapped(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
             stride_cm, stride_cn, stride_bias, stride_om, stride_on, alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K,
             GROUP_M, EVEN_K, HAS_C, HAS_BIAS, ACTIVATION, INPUT_PRECISION)


@triton.jit
def matmul_wrapped_static_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr, M: tl.constexpr, N: tl.constexpr,
                                 K: tl.constexpr, batch, stride_ab, stride_am: tl.constexpr,
                                 stride_ak: tl.constexpr, stride_bb, stride_bk: tl.constexpr,
                                 stride_bn: tl.constexpr, stride_cb, stride_cm: tl.constexpr,
                                 stride_cn: tl.constexpr, stride_bias: tl.constexpr, stride_ob,
                                 stride_om: tl.constexpr, stride_on: tl.constexpr, alpha, beta,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, HAS_C: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The same with sizes and strides as compile-time constants: one compile per shape and layout."""
    _wrapped(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
             stride_cm, stride_cn, stride_bias, stride_om, stride_on, alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K,
             GROUP_M, EVEN_K, HAS_C, HAS_BIAS, ACTIVATION, INPUT_PRECISION)
