"""Rows padded to 16 bytes for the TMA GEMM kernel: a copy of a matrix (or a batch of them) whose rows TMA cannot
read (a row of 4095 bf16 elements is 8190 bytes) into a buffer whose row length is a multiple of 16 elements.

Why not torch's ``copy_``: into a strided destination it ran at ~1.55 TB/s, 43.1 us for the 33.5 MB operand of
``a @ b`` at 4097 x 4095 x 4096 against 23.7 us for a contiguous copy of its size (H100,
``benchmarks/results/pad_rows_variants-NVIDIA_H100_80GB_HBM3.txt``).

Each program copies a BLOCK_R x BLOCK_C tile. The source's rows start anywhere, so its loads are element-sized
(coalesced along a row). The stores cover the whole padded row (zeros past the source's columns): a store masked
to the source's odd column count cannot be vectorized and ran 61-77 us in the same run; over the padded row, whose
length Triton sees divisible by 16, 24.8 us, as Inductor's kernel for ``F.pad``. Offsets are int64 (a batch of
large matrices passes 2^31 elements); a 1-D grid (a 2-D one caps its second dimension at 65535).
The host side is ``tunekit/ops/gemm/triton_padded_rows.py``.
"""

import triton
import triton.language as tl

__all__ = ["pad_rows_kernel"]


@triton.jit
def pad_rows_kernel(src_ptr, dst_ptr, rows, cols, dst_cols, stride_sb, stride_sr, stride_db, stride_dr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[b, r, c] = src[b, r, c] for c < cols, 0 for cols <= c < dst_cols (unit column strides)."""
    pid = tl.program_id(0)
    tiles_c = tl.cdiv(dst_cols, BLOCK_C)
    tiles_r = tl.cdiv(rows, BLOCK_R)
    batch = (pid // (tiles_c * tiles_r)).to(tl.int64)
    rest = pid % (tiles_c * tiles_r)
    r = ((rest // tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = (rest % tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_rows = r[:, None] < rows
    x = tl.load(src_ptr + batch * stride_sb + r[:, None] * stride_sr + c[None, :], mask=in_rows & (c[None, :] < cols),
                other=0)
    tl.store(dst_ptr + batch * stride_db + r[:, None] * stride_dr + c[None, :], x,
             mask=in_rows & (c[None, :] < dst_cols))
