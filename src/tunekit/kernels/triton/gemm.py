"""Triton GEMM kernels for the mm family (mm, addmm, bmm, baddbmm, linear, linear + activation).

Every kernel computes, for each batch entry ``b``::

    out[b] = ACT(alpha * (A[b] @ B[b]) + beta * C[b] + bias)        A: M x K, B: K x N, C/out: M x N

with fp32 accumulation, the epilogue in fp32 and one rounding to out's dtype (float32, float16,
bfloat16) on store. Why these kernels exist next to cuBLAS: shapes cuBLAS handles badly (rows that
are not 16-byte aligned, e.g. 4097 x 4095 x 4096 in bf16; small odd shapes), decode shapes
(M = 1..16 against a large weight: memory-bound, need split-K to fill the GPU), and fused
bias + activation epilogues. Candidates are configurations of these kernels; the host picks.

Shared signature (matmul_kernel, matmul_skinny_kernel here; matmul_tma_persistent_kernel in
``gemm_tma.py``, the Hopper kernel built on TMA descriptors)::

    (a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr,
     M, N, K, batch,
     stride_ab, stride_am, stride_ak,          A[b, m, k]  at a_ptr + b*stride_ab + m*stride_am + k*stride_ak
     stride_bb, stride_bk, stride_bn,          B[b, k, n]
     stride_cb, stride_cm, stride_cn,          C[b, m, n]  (broadcast C: stride 0, no copy)
     stride_bias,                              bias[n]     (one vector of N for every batch entry)
     stride_ob, stride_om, stride_on,          out[b, m, n]
     alpha, beta,                              Python floats
     <constexprs>)

Any strides work (transposed and sliced views, no copies); ``linear(x, w)`` is A = x, B = w.t()
(stride_bk = 1). Pointers a kernel does not read may be None: c_ptr when HAS_C is False, bias_ptr
when HAS_BIAS is False, ws_ptr when SPLIT_K == 1, c/bias/out when SPLIT_K > 1.

Constexprs:
- BLOCK_M, BLOCK_N, BLOCK_K: tile (powers of two; tl.dot needs >= 16 each).
- GROUP_M: grouped ("swizzled") tile order: GROUP_M tile rows are walked column by column so the
  programs running together share A and B panels in L2. 1 = plain row-major order.
- SPLIT_K: K split over SPLIT_K programs per output tile. Split ``s`` takes K blocks
  s, s + SPLIT_K, s + 2*SPLIT_K, ... and writes its raw fp32 sum to the workspace; then
  ``splitk_reduce_kernel`` adds the splits in a fixed order (s = 0, 1, ...) and applies the epilogue.
  No atomics: results are bit-identical run to run (torch.use_deterministic_algorithms-safe).
- EVEN_K: K % (BLOCK_K * SPLIT_K) == 0, so no K mask (the host must compute it; wrong = wrong result).
- HAS_C: read C and add beta * C. The host passes HAS_C = (C given and beta != 0): with beta == 0
  C is not read at all, so NaN/inf in C do not propagate (torch.addmm's semantics).
- HAS_BIAS: add bias[n] (linear's bias; addmm's 1-D input can also go here when beta == 1).
- ACTIVATION: 0 none, 1 relu, 2 silu, 3 gelu (erf), 4 gelu (tanh); applied after everything else.
- INPUT_PRECISION: tl.dot's input_precision for float32 inputs: "ieee" (torch's default,
  allow_tf32 = False), "tf32" (float32_matmul_precision "high") or "tf32x3". Ignored for 16-bit.

Semantics that fall out of the structure: K == 0 gives ACT(beta * C + bias) (alpha * 0, the loop never
runs); M == 0 or N == 0 or batch == 0 must not be launched (empty grid); alpha is always applied
(alpha == 0 with inf/NaN in A or B gives NaN, where BLAS would not read A and B: the host may route
alpha == 0 to ``beta * C`` itself).

Host launchers must compute (see also each kernel's docstring):
- matmul_kernel / matmul_skinny_kernel grid: ``(batch * SPLIT_K * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``
  (one folded axis: no 65535 limit on batch or splits). With SPLIT_K > 1: a float32 workspace of
  ``SPLIT_K * batch * M * N`` elements (contiguous [SPLIT_K, batch, M, N], torch.empty: every element
  is written, even by a split whose K range is empty), then ``splitk_reduce_kernel`` with grid
  ``(batch * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``.
- matmul_tma_persistent_kernel: grid ``(min(NUM_SMS, batch * cdiv(M, BM) * cdiv(N, BN)),)`` and a
  Triton allocator for the device-side descriptors (see the kernel's docstring).
- Batch strides of 0 when batch == 1 (and for an operand broadcast over the batch). Every stride
  enters every address: Triton specializes integer arguments divisible by 16 (0 is), and one odd
  stride, even an unused one, drops all loads to scalar ones (no cp.async pipelining either).
- Rows that are not 16-byte aligned (4097 x 4095 x 4096 bf16: B's and out's row strides are 4095)
  make the pointer kernels load element by element. Copying the unaligned operand into a padded,
  aligned buffer and running ``gemm_tma.matmul_tma_persistent_kernel`` with pointer stores into the
  unaligned out (OUT_TMA=False) is much faster there (``benchmarks/experiments/gemm_kernels_notes.md``).

Offsets: batch, row and column offsets are int64 (a [tokens, vocab] logits output passes 2**31
elements); tile-local arithmetic stays int32. Masked loads (zeros in the tails) and masked stores:
any M, N, K. With TRITON_INTERPRET=1 set before import the kernels run on CPU tensors (tests; the
interpreter of Triton 3.9 emulates the TMA descriptors too).
"""

import triton
import triton.language as tl

from .activations import K_BETA, K_KAPPA, M_SQRT1_2, _one_plus_minus_tanh

__all__ = [
    "matmul_kernel",
    "splitk_reduce_kernel",
    "matmul_skinny_kernel",
    "ACTIVATIONS",
    "even_k",
]

#: ACTIVATION constexpr values.
ACTIVATIONS = {"none": 0, "relu": 1, "silu": 2, "gelu": 3, "gelu_tanh": 4}


def even_k(K: int, block_k: int, split_k: int = 1) -> bool:
    """The EVEN_K constexpr: every split's every K block is full (no K mask needed)."""
    return K % (block_k * split_k) == 0


@triton.jit
def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr):
    """``tl.dot`` with fp32 accumulation. Under TRITON_INTERPRET=1 bfloat16 tiles are widened to
    fp32 first: the interpreter keeps bfloat16 as raw uint16 bits and its dot multiplies those
    integers (Triton 3.9). Exact either way (bf16 products are exact in fp32). Compiled kernels
    never take that branch (a constexpr False)."""
    if INTERPRETED:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


#: True when this module's kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = tl.constexpr(not isinstance(_dot, triton.runtime.jit.JITFunction))


@triton.jit
def _tile_ids(t, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile ``t`` (of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)) to (pid_m, pid_n) in grouped order."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group = t // width
    first_m = group * GROUP_M
    size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (t % width) % size
    pid_n = (t % width) // size
    return pid_m, pid_n


@triton.jit
def _activation(y, ACTIVATION: tl.constexpr):
    """fp32 activations, NaN-preserving, with activations.py's formulas (gelu tanh without the
    1 + tanh cancellation), so a fused epilogue equals the unfused fp32 activation."""
    if ACTIVATION == 1:
        y = tl.where(y < 0.0, 0.0, y)  # NaN < 0 is false: NaN stays (tl.maximum would drop it)
    elif ACTIVATION == 2:
        y = y / (1.0 + tl.exp(-y))
    elif ACTIVATION == 3:
        y = 0.5 * y * (1.0 + tl.math.erf(y * M_SQRT1_2))
    elif ACTIVATION == 4:
        one_plus_t, _ = _one_plus_minus_tanh((y + y * y * y * K_KAPPA) * K_BETA)
        y = 0.5 * y * one_plus_t
    return y


@triton.jit
def _epilogue(acc, b, rm, rn, M, N, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias, alpha, beta,
              HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """``ACT(alpha * acc + beta * C + bias)`` for batch entry ``b`` and the tile at rows ``rm`` and
    columns ``rn`` (all int64). Returns the fp32 tile and its store mask. c_ptr / bias_ptr are only
    touched under HAS_C / HAS_BIAS (they may be None)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    y = acc * alpha
    if HAS_C:
        c = tl.load(c_ptr + b * stride_cb + rm[:, None] * stride_cm + rn[None, :] * stride_cn, mask=mask,
                    other=0.0)
        y += c.to(tl.float32) * beta
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn * stride_bias, mask=rn < N, other=0.0)
        y += bias.to(tl.float32)[None, :]
    return _activation(y, ACTIVATION), mask


@triton.jit
def _split_ids(M, N, batch, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
               SPLIT_K: tl.constexpr):
    """program_id(0) = (b * SPLIT_K + s) * tiles + t  ->  (b (int64), s, pid_m, pid_n)."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    t = pid % tiles
    rest = pid // tiles
    s = rest % SPLIT_K
    b = (rest // SPLIT_K).to(tl.int64)
    pid_m, pid_n = _tile_ids(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return b, s, pid_m, pid_n


@triton.jit
def _store_result(acc, b, rm, rn, M, N, batch, s,
                  c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                  out_ptr, stride_ob, stride_om, stride_on, ws_ptr, alpha, beta,
                  SPLIT_K: tl.constexpr, HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACTIVATION: tl.constexpr):
    """SPLIT_K == 1: the epilogue, stored to out. Else the raw fp32 partial to the workspace
    [SPLIT_K, batch, M, N] at split ``s``."""
    if SPLIT_K == 1:
        y, mask = _epilogue(acc, b, rm, rn, M, N, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                            alpha, beta, HAS_C, HAS_BIAS, ACTIVATION)
        out = out_ptr + b * stride_ob + rm[:, None] * stride_om + rn[None, :] * stride_on
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        row = (s * batch + b) * M + rm  # int64
        tl.store(ws_ptr + row[:, None] * N + rn[None, :], acc, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr,
                  M, N, K, batch,
                  stride_ab, stride_am, stride_ak,
                  stride_bb, stride_bk, stride_bn,
                  stride_cb, stride_cm, stride_cn,
                  stride_bias,
                  stride_ob, stride_om, stride_on,
                  alpha, beta,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """General batched, strided, masked tiled GEMM (tl.dot; software-pipelined by ``num_stages``).

    Grid ``(batch * SPLIT_K * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``. Loads are masked on rows
    (``rm < M``), columns (``rn < N``) and, unless EVEN_K, K; a row mask is constant along a
    K-contiguous load, so it does not stop vectorized loads. Pointers advance by
    ``BLOCK_K * SPLIT_K * stride`` (int64) per step.
    """
    b, s, pid_m, pid_n = _split_ids(M, N, batch, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_K)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = s * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + b * stride_ab + rm[:, None] * stride_am + rk[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + b * stride_bb + rk[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * (BLOCK_K * SPLIT_K)
    b_step = tl.cast(stride_bk, tl.int64) * (BLOCK_K * SPLIT_K)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok, other=0.0)
            bt = tl.load(b_ptrs, mask=n_ok, other=0.0)
        else:
            k_left = K - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=m_ok & (rk[None, :] < k_left), other=0.0)
            bt = tl.load(b_ptrs, mask=n_ok & (rk[:, None] < k_left), other=0.0)
        acc = _dot(a, bt, acc, INPUT_PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step

    _store_result(acc, b, rm, rn, M, N, batch, s, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr,
                  stride_bias, out_ptr, stride_ob, stride_om, stride_on, ws_ptr, alpha, beta,
                  SPLIT_K, HAS_C, HAS_BIAS, ACTIVATION)


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, bias_ptr, out_ptr,
                         M, N, batch,
                         stride_cb, stride_cm, stride_cn,
                         stride_bias,
                         stride_ob, stride_om, stride_on,
                         alpha, beta,
                         SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """Sum the SPLIT_K fp32 partials of each output in the fixed order s = 0, 1, ... and apply the
    epilogue. Grid ``(batch * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``; BLOCK_M may be 1 (decode:
    M = 1, BLOCK_N = 1024) since there is no tl.dot here. Reads are coalesced along n."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    b = (pid // tiles).to(tl.int64)
    t = pid % tiles
    rm = (t // tiles_n).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (t % tiles_n).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    at = (b * M + rm)[:, None] * N + rn[None, :]
    split = tl.cast(batch, tl.int64) * M * N  # one split's elements (batch may be a constexpr 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * split + at, mask=mask, other=0.0)
    y, mask = _epilogue(acc, b, rm, rn, M, N, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                        alpha, beta, HAS_C, HAS_BIAS, ACTIVATION)
    out = out_ptr + b * stride_ob + rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_skinny_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr,
                         M, N, K, batch,
                         stride_ab, stride_am, stride_ak,
                         stride_bb, stride_bk, stride_bn,
                         stride_cb, stride_cm, stride_cn,
                         stride_bias,
                         stride_ob, stride_om, stride_on,
                         alpha, beta,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_C: tl.constexpr,
                         HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """GEMV-style kernel for decode shapes (M = 1, 2 rows against a large weight): no tensor cores,
    B read as [BLOCK_N, BLOCK_K] tiles (for linear's weight, B = w.t(), contiguous along K: 16-byte
    vector loads), fp32 FMAs into a BLOCK_M x BLOCK_N x BLOCK_K lane accumulator reduced once at the
    end. Memory-bound: what matters is enough programs streaming the weight, so K is split over
    SPLIT_K programs (same workspace and ``splitk_reduce_kernel`` as matmul_kernel).

    The lane accumulator costs BLOCK_M * BLOCK_N * BLOCK_K / (32 * num_warps) registers per thread:
    keep the product <= 16K at 4 warps. H200, bf16, 1 x 4096 x 14336: (1, 16, 512) split 2 and
    (1, 32, 256) split 4 run at 31-33 us (3.6-3.7 TB/s), the same as cuBLAS and as matmul_kernel with
    BLOCK_M = 16 and split-K; at M >= 2 matmul_kernel wins (M = 2: 40 us against 32). Its place in a
    candidate list: M = 1 (and float32 inputs, where an "ieee" tl.dot wastes 15/16 of its FMAs).
    Grid ``(batch * SPLIT_K * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``, tiles in row-major order.
    """
    b, s, pid_m, pid_n = _split_ids(M, N, batch, BLOCK_M, BLOCK_N, 1, SPLIT_K)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = s * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + b * stride_ab + rm[:, None] * stride_am + rk[None, :].to(tl.int64) * stride_ak
    w_ptrs = b_ptr + b * stride_bb + rn[:, None] * stride_bn + rk[None, :].to(tl.int64) * stride_bk
    a_step = tl.cast(stride_ak, tl.int64) * (BLOCK_K * SPLIT_K)
    w_step = tl.cast(stride_bk, tl.int64) * (BLOCK_K * SPLIT_K)
    m_ok = rm[:, None] < M
    n_ok = rn[:, None] < N

    # Products accumulate per lane; one cross-lane reduction at the end (reducing over K every step
    # put shuffles between the loads: 41 us instead of 35 us at 1 x 4096 x 14336, tile 1 x 32 x 512,
    # split 4, on an H200).
    lanes = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            x = tl.load(a_ptrs, mask=m_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok, other=0.0)
        else:
            k_ok = rk[None, :] < K - k * (BLOCK_K * SPLIT_K)
            x = tl.load(a_ptrs, mask=m_ok & k_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok & k_ok, other=0.0)
        lanes += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        a_ptrs += a_step
        w_ptrs += w_step
    acc = tl.sum(lanes, axis=2)

    _store_result(acc, b, rm, rn, M, N, batch, s, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr,
                  stride_bias, out_ptr, stride_ob, stride_om, stride_on, ws_ptr, alpha, beta,
                  SPLIT_K, HAS_C, HAS_BIAS, ACTIVATION)
