"""Triton RMSNorm over the rows of a contiguous [rows, N] array, and its gradient.

Forward: ``rstd = 1 / sqrt(mean(x^2) + eps)`` per row, ``y = x * rstd * w``. Backward, with
``g = dy * w`` and ``c = mean(g * x)`` per row: ``dx = rstd * (g - x * rstd^2 * c)``, and
``dw = sum over rows of dy * x * rstd``, each program summing its rows into one float32 partial
row (``dw_partial[program, :]``); the launcher adds the partials. Launchers and the conditions
(rows of at most ``BLOCK`` elements, one tile per row): ``tunekit/ops/rms_norm_triton.py``.

Math in float32 (one rounding, at the store: torch's fused CUDA kernel does the same), row
offsets in int64, every tail masked. Special values follow the formula, as in torch: a NaN or an
inf in a row makes the row's sum NaN / inf, so the whole row NaN (``inf * 0``) as torch's.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm_forward_kernel(x_ptr, w_ptr, y_ptr, rows, N, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """ROWS rows per program (a [ROWS, BLOCK] tile), the whole row in registers."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < N
    mask = tl.expand_dims(row < rows, 1) & tl.expand_dims(col_ok, 0)
    offsets = tl.expand_dims(row * N, 1) + tl.expand_dims(cols, 0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    y = x * tl.expand_dims(rstd, 1) * tl.expand_dims(w, 0)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_backward_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, rows, N, eps, rows_per_program,
                             BLOCK: tl.constexpr):
    """Program p: rows [p * rows_per_program, (p + 1) * rows_per_program), one at a time; dx per
    row, and the program's float32 partial of dw at row p of ``dw_partial``."""
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    first = program.to(tl.int64) * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, rows)):
        offsets = row * N + cols
        x = tl.load(x_ptr + offsets, mask=col_ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=col_ok, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / N + eps)
        g = dy * w
        c = tl.sum(g * x, axis=0) / N
        dx = rstd * (g - x * (rstd * rstd * c))
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)
        dw += dy * x * rstd
    tl.store(dw_partial_ptr + program.to(tl.int64) * N + cols, dw, mask=col_ok)
