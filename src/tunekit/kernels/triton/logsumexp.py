"""Triton logsumexp over the last dimension of a contiguous (rows, cols) array, and its gradient.

Forward: one program per row walks the row in BLOCK-wide chunks keeping, per lane, a running max
and a sum rescaled whenever the max grows (the row is read once), then merges the lanes. NaN is
tracked apart (the max ignores it); a -inf partial max rescales by 0, never by exp(-inf + inf).
Results as torch.logsumexp: NaN if any NaN, else +inf if any +inf, -inf for a row of -inf.

Backward: ``dx = dy[row] * exp(x - lse[row])``, one program per row, in one pass.
Math in fp32, offsets in 64 bits.
"""

import triton
import triton.language as tl


@triton.jit
def logsumexp_rows_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * cols
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    nan = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < cols, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        nan = nan | is_nan.to(tl.int32)
        x = tl.where(is_nan, float("-inf"), x)
        new_m = tl.maximum(m, x)
        old_scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - new_m))
        term = tl.where(x == float("-inf"), 0.0, tl.exp(x - new_m))
        s = s * old_scale + term
        m = new_m
    row_m = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - row_m))
    row_s = tl.sum(s * scale, axis=0)
    infinite = (row_m == float("inf")) | (row_m == float("-inf"))
    result = tl.where(infinite, row_m, row_m + tl.log(row_s))
    result = tl.where(tl.max(nan, axis=0) > 0, float("nan"), result)
    tl.store(out_ptr + row, result.to(out_ptr.dtype.element_ty))


@triton.jit
def logsumexp_backward_rows_kernel(dy_ptr, x_ptr, lse_ptr, dx_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dy = tl.load(dy_ptr + row).to(tl.float32)
    lse = tl.load(lse_ptr + row).to(tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
        dx = dy * tl.exp(x - lse)
        tl.store(dx_ptr + row * cols + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
