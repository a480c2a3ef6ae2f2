"""The persistent Hopper GEMM kernel: operands read through TMA descriptors, one program per SM
walking the output tiles. Same signature and epilogue as the pointer kernels of ``gemm.py`` (whose
docstring says what every argument means); this kernel needs Triton >= 3.4 (device-side tensor
descriptors) and operands :func:`tma_compatible` says it can read.
"""

import triton
import triton.language as tl

from .gemm import _dot, _epilogue, _tile_ids  # the device functions both kernel families share

__all__ = ["matmul_tma_persistent_kernel", "tma_compatible", "HAS_TENSOR_DESCRIPTORS"]

#: Whether this Triton has device-side tensor descriptors (``tl.make_tensor_descriptor``, Triton >= 3.4;
#: 3.3 called it ``_experimental_make_tensor_descriptor``). matmul_tma_persistent_kernel needs them, and
#: tl.range's ``flatten`` / ``warp_specialize`` keywords, which came with the same releases.
HAS_TENSOR_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor")


def tma_compatible(t, element_size: int | None = None) -> bool:
    """Whether a 2-D or 3-D operand can be read through a TMA descriptor: 16-byte aligned base, one
    unit stride in the last two dims, the other strides 16-byte multiples and non-zero (batch stride
    is only checked when the batch dim has more than one entry). Pure host helper."""
    size = element_size or t.element_size()
    if t.data_ptr() % 16:
        return False
    *batch, rows, cols = t.shape
    s_batch, s_rows, s_cols = (t.stride(0) if batch else 0), t.stride(-2), t.stride(-1)
    if s_cols == 1 or cols == 1:
        outer = s_rows
    elif s_rows == 1 or rows == 1:
        outer = s_cols
    else:
        return False
    if outer == 0 or (outer * size) % 16:
        return False
    return not (batch and batch[0] > 1 and (s_batch == 0 or (s_batch * size) % 16))



@triton.jit
def _make_desc(ptr, batch, rows, cols, stride_batch, stride_rows, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               BATCHED: tl.constexpr):
    """A device-side TMA descriptor over [batch,] rows x cols (unit stride along cols)."""
    if BATCHED:
        return tl.make_tensor_descriptor(ptr, shape=[batch, rows, cols], strides=[stride_batch, stride_rows, 1],
                                          block_shape=[1, BLOCK_R, BLOCK_C])
    else:
        return tl.make_tensor_descriptor(ptr, shape=[rows, cols], strides=[stride_rows, 1],
                                         block_shape=[BLOCK_R, BLOCK_C])


@triton.jit
def _desc_load(desc, b, r, c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BATCHED: tl.constexpr):
    if BATCHED:
        return desc.load([b, r, c]).reshape(BLOCK_R, BLOCK_C)
    else:
        return desc.load([r, c])


@triton.jit
def _mm_operands(a_desc, b_desc, b, off_m, off_n, off_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, A_ROW_MAJOR: tl.constexpr, B_ROW_MAJOR: tl.constexpr,
                 BATCHED: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N] operand tiles at (off_m, off_k), (off_k, off_n)."""
    if A_ROW_MAJOR:
        a = _desc_load(a_desc, b, off_m, off_k, BLOCK_M, BLOCK_K, BATCHED)
    else:
        a = _desc_load(a_desc, b, off_k, off_m, BLOCK_K, BLOCK_M, BATCHED).T
    if B_ROW_MAJOR:
        bt = _desc_load(b_desc, b, off_k, off_n, BLOCK_K, BLOCK_N, BATCHED)
    else:
        bt = _desc_load(b_desc, b, off_n, off_k, BLOCK_N, BLOCK_K, BATCHED).T
    return a, bt


# long: a persistent kernel is one loop nest (tiles, K blocks, epilogue); split, it would pass a dozen
# tiles and descriptors between helpers
@triton.jit
def matmul_tma_persistent_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr,
                                 M, N, K, batch,
                                 stride_ab, stride_am, stride_ak,
                                 stride_bb, stride_bk, stride_bn,
                                 stride_cb, stride_cm, stride_cn,
                                 stride_bias,
                                 stride_ob, stride_om, stride_on,
                                 alpha, beta,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                                 A_ROW_MAJOR: tl.constexpr, B_ROW_MAJOR: tl.constexpr, BATCHED: tl.constexpr,
                                 OUT_TMA: tl.constexpr, HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                                 ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                                 FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Persistent Hopper GEMM: NUM_SMS programs walk the batch * tiles output tiles (grouped order
    within a batch entry), operands through device-side TMA descriptors (``tl.make_tensor_descriptor``:
    out-of-bounds boxes read as zeros, so odd M, N, K need no masks), wgmma fed from shared memory,
    ``num_stages`` TMA loads in flight. ws_ptr is unused (no split-K here).

    Layouts (constexprs the host derives from strides; ``tma_compatible`` checks a tensor):
    - A_ROW_MAJOR: stride_ak == 1 (descriptor [M, K]); else stride_am == 1 (A is a transposed
      view: descriptor [K, M], tile transposed in shared memory).
    - B_ROW_MAJOR: stride_bn == 1 (descriptor [K, N]); else stride_bk == 1 (B = w.t() of linear:
      descriptor [N, K]).
    - BATCHED: 3-D descriptors [batch, rows, cols] (boxes never cross batch entries); else 2-D
      (batch must be 1; batch strides ignored).
    - OUT_TMA: store out through a descriptor (out row-major, stride_on == 1, 16-byte aligned
      rows); else masked pointer stores (any out strides). C and bias are always read with masked
      pointer loads (any strides, broadcast C included).
    - FLATTEN / WARP_SPECIALIZE: tl.range's flags for the tile loop (Triton >= 3.4, like the
      descriptors: check HAS_TENSOR_DESCRIPTORS). Flattening merges the tile and K loops so the next tile's
      loads overlap this tile's epilogue; warp specialization targets Blackwell (on Hopper keep False).
    Requirements (host checks, else use matmul_kernel): 16-byte aligned base pointers, non-unit
    strides multiples of 16 bytes (and non-zero batch strides when BATCHED), float16/bfloat16/float32
    inputs of one dtype.

    Host: grid ``(min(NUM_SMS, batch * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)),)``; NUM_SMS =
    ``torch.cuda.get_device_properties(dev).multi_processor_count`` (132 on H100 SXM / H200). Device
    descriptors live in a global scratch buffer that Triton gets from the allocator set by
    ``triton.set_allocator(fn)``, ``fn(size: int, alignment: int, stream: int | None)`` returning a
    CUDA tensor (e.g. ``torch.empty(size, device="cuda", dtype=torch.int8)``); without it the
    launch raises ("no allocator was set"). The allocator is a ContextVar (Triton 3.4 to 3.9 at
    least): a new thread starts without it, so set it in the launching thread (cheap enough to do
    before every launch). The scratch is small (about 128 bytes per descriptor per program).
    """
    start = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    total = tiles * batch
    k_tiles = tl.cdiv(K, BLOCK_K)

    if A_ROW_MAJOR:
        a_desc = _make_desc(a_ptr, batch, M, K, stride_ab, stride_am, BLOCK_M, BLOCK_K, BATCHED)
    else:
        a_desc = _make_desc(a_ptr, batch, K, M, stride_ab, stride_ak, BLOCK_K, BLOCK_M, BATCHED)
    if B_ROW_MAJOR:
        b_desc = _make_desc(b_ptr, batch, K, N, stride_bb, stride_bk, BLOCK_K, BLOCK_N, BATCHED)
    else:
        b_desc = _make_desc(b_ptr, batch, N, K, stride_bb, stride_bn, BLOCK_N, BLOCK_K, BATCHED)
    if OUT_TMA:
        out_desc = _make_desc(out_ptr, batch, M, N, stride_ob, stride_om, BLOCK_M, BLOCK_N, BATCHED)

    # The epilogue recomputes its tile from its own counter (as Triton's persistent tutorial does):
    # a value live from the loads to the epilogue defeats the pipeliner when the loops are flattened.
    tile_c = start - NUM_SMS
    for tile in tl.range(start, total, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        b = tile // tiles
        pid_m, pid_n = _tile_ids(tile % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a, bt = _mm_operands(a_desc, b_desc, b, off_m, off_n, ki * BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K,
                                 A_ROW_MAJOR, B_ROW_MAJOR, BATCHED)
            acc = _dot(a, bt, acc, INPUT_PRECISION)

        tile_c += NUM_SMS
        bc = tile_c // tiles
        pid_m, pid_n = _tile_ids(tile_c % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        bc64 = bc.to(tl.int64)
        y, mask = _epilogue(acc, bc64, rm, rn, M, N, c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr,
                            stride_bias, alpha, beta, HAS_C, HAS_BIAS, ACTIVATION)
        y = y.to(out_ptr.dtype.element_ty)
        if OUT_TMA:
            if BATCHED:
                out_desc.store([bc, pid_m * BLOCK_M, pid_n * BLOCK_N], y.reshape(1, BLOCK_M, BLOCK_N))
            else:
                out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], y)
        else:
            out = out_ptr + bc64 * stride_ob + rm[:, None] * stride_om + rn[None, :] * stride_on
            tl.store(out, y, mask=mask)
