"""Triton logsumexp over a contiguous (outer, R, inner) array reduced over R, and its gradient.

Layouts (``tunekit.ops._shared.reduction.reduction_view``): *rows* (inner = 1, the last dims) and
*columns* (inner > 1, read in place, coalesced along inner). The result has outer * inner elements, index
``o * inner + i``. Launchers: ``tunekit/ops/logsumexp/triton_*.py``.

Online reduction, per chunk of a row or column (``_update``): take the chunk's max first, rescale
the running sums once by ``exp2((m_old - m_new) * log2e)`` (one exp per row, not per element), then
add ``exp2((x - m_new) * log2e)``: one independent exp per element, no per-element dependent
rescale chain. Sums are kept per tile lane (an FMA per element, one cross-lane sum at the end);
the max is per row (one cross-lane max per chunk).

Special values fall out of the arithmetic, whichever way ``tl.max`` treats NaN:
- the shift is the max when finite, else 0, so ``x - shift`` is never ``inf - inf``;
- the rescale factor is 1 when the max did not change (covers -inf -> -inf and +inf -> +inf);
- a NaN input makes its lane's sum NaN and it stays NaN (NaN * 0 is NaN): result NaN;
- a +inf input makes the max +inf and its lane's sum +inf: result ``inf + log(inf)`` = +inf;
- a slice of -inf keeps max -inf and sums 0: result ``-inf + log(0)`` = -inf.
Partials (``max``, ``sum``) of split reductions merge with the same rules (combine kernel).

Backward: ``dx = dy * exp(x - lse)`` (what autograd computes for torch.logsumexp, specials too).
Math in fp32, offsets in int64 (inputs may exceed 2^31 elements); every tail masked.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _update(m, s, x, AXIS: tl.constexpr):
    """One chunk ``x`` (fp32, masked lanes -inf) into row maxima ``m`` and lane sums ``s``."""
    m_new = tl.maximum(m, tl.max(x, axis=AXIS))
    scale = tl.where(m == m_new, 1.0, tl.exp2((m - m_new) * LOG2E))
    shift = tl.where(tl.abs(m_new) < float("inf"), m_new, 0.0)  # NaN compares false: 0
    s = s * tl.expand_dims(scale, AXIS) + tl.exp2((x - tl.expand_dims(shift, AXIS)) * LOG2E)
    return m_new, s


@triton.jit
def _merge(m, s, pm, ps, AXIS: tl.constexpr):
    """Partials (``pm``, ``ps``: a tile, masked lanes -inf / 0) into running (``m``, ``s``)."""
    m_new = tl.maximum(m, tl.max(pm, axis=AXIS))
    m_b = tl.expand_dims(m_new, AXIS)
    factor = tl.where(pm == m_b, 1.0, tl.exp2((pm - m_b) * LOG2E))
    scale = tl.where(m == m_new, 1.0, tl.exp2((m - m_new) * LOG2E))
    return m_new, s * scale + tl.sum(ps * factor, axis=AXIS)


@triton.jit
def logsumexp_rows_kernel(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """ROWS rows per program, BLOCK columns per step: ROWS = 1 for long rows, more for short ones
    (32768 x 64) so a program still loads a full tile."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = row < rows
    base = x_ptr + tl.expand_dims(row * cols, 1)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        col = start + tl.arange(0, BLOCK)
        mask = tl.expand_dims(row_ok, 1) & tl.expand_dims(col < cols, 0)
        x = tl.load(base + tl.expand_dims(col, 0), mask=mask, other=float("-inf")).to(tl.float32)
        m, s = _update(m, s, x, 1)
    result = m + tl.log(tl.sum(s, axis=1))
    tl.store(out_ptr + row, result.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def logsumexp_split_rows_kernel(x_ptr, pm_ptr, ps_ptr, rows, cols, chunk, splits, BLOCK: tl.constexpr):
    """Program ``row * splits + k`` reduces columns [k * chunk, (k + 1) * chunk) of its row (chunk a
    multiple of BLOCK) into the fp32 partial (max, sum) at ``k * rows + row``: few very long rows
    (4 x 16M) still fill the GPU. ``logsumexp_combine_kernel`` merges them."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // splits
    k = pid - row * splits
    start = k * chunk
    base = x_ptr + row * cols
    m = tl.full([1], float("-inf"), tl.float32)
    s = tl.zeros([1, BLOCK], dtype=tl.float32)
    for off in range(0, chunk, BLOCK):
        col = start + off + tl.arange(0, BLOCK)
        x = tl.load(base + tl.expand_dims(col, 0), mask=tl.expand_dims(col < cols, 0),
                    other=float("-inf")).to(tl.float32)
        m, s = _update(m, s, x, 1)
    at = k * rows + row + tl.arange(0, 1)
    tl.store(pm_ptr + at, m)
    tl.store(ps_ptr + at, tl.sum(s, axis=1))


@triton.jit
def logsumexp_columns_kernel(x_ptr, out_ptr, pm_ptr, ps_ptr, R, inner, n_out, tiles_i, splits, r_chunk,
                             BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, SPLIT: tl.constexpr):
    """Program ``(o * splits + k) * tiles_i + t`` reduces rows [k * r_chunk, (k + 1) * r_chunk) of
    R for BLOCK_I adjacent columns, tiles [BLOCK_R, BLOCK_I] loaded along inner (coalesced, no
    transpose). SPLIT: write the partials at ``k * n_out + o * inner + i`` (n_out = outer * inner)
    for the combine kernel (few outputs, long R); else the result (splits = 1, r_chunk >= R)."""
    pid = tl.program_id(0).to(tl.int64)
    t = pid % tiles_i
    rest = pid // tiles_i
    k = rest % splits
    o = rest // splits
    i = t * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < inner
    base = x_ptr + o * R * inner + tl.expand_dims(i, 0)
    r0 = k * r_chunk
    m = tl.full([BLOCK_I], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    for off in range(0, r_chunk, BLOCK_R):
        r = r0 + off + tl.arange(0, BLOCK_R)
        mask = tl.expand_dims(r < R, 1) & tl.expand_dims(i_ok, 0)
        x = tl.load(base + tl.expand_dims(r * inner, 1), mask=mask, other=float("-inf")).to(tl.float32)
        m, s = _update(m, s, x, 0)
    j = o * inner + i
    if SPLIT:
        at = k * n_out + j
        tl.store(pm_ptr + at, m, mask=i_ok)
        tl.store(ps_ptr + at, tl.sum(s, axis=0), mask=i_ok)
    else:
        result = m + tl.log(tl.sum(s, axis=0))
        tl.store(out_ptr + j, result.to(out_ptr.dtype.element_ty), mask=i_ok)


@triton.jit
def logsumexp_combine_kernel(pm_ptr, ps_ptr, out_ptr, n_out, splits,
                             BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Merge the ``splits`` partials of each output (layout [splits, n_out], coalesced along the
    outputs) into ``max + log(sum)``, tiles [BLOCK_K, BLOCK_N]."""
    j = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    j_ok = j < n_out
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, splits, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K).to(tl.int64)
        mask = tl.expand_dims(k < splits, 1) & tl.expand_dims(j_ok, 0)
        at = tl.expand_dims(k * n_out, 1) + tl.expand_dims(j, 0)
        pm = tl.load(pm_ptr + at, mask=mask, other=float("-inf"))
        ps = tl.load(ps_ptr + at, mask=mask, other=0.0)
        m, s = _merge(m, s, pm, ps, 0)
    result = m + tl.log(s)
    tl.store(out_ptr + j, result.to(out_ptr.dtype.element_ty), mask=j_ok)


@triton.jit
def logsumexp_backward_rows_kernel(dy_ptr, x_ptr, lse_ptr, dx_ptr, rows, cols,
                                   BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """``dx = dy[row] * exp(x - lse[row])``, ROWS rows per program, BLOCK columns per step."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = row < rows
    dy = tl.expand_dims(tl.load(dy_ptr + row, mask=row_ok, other=0.0).to(tl.float32), 1)
    lse = tl.expand_dims(tl.load(lse_ptr + row, mask=row_ok, other=0.0).to(tl.float32), 1)
    base = tl.expand_dims(row * cols, 1)
    for start in range(0, cols, BLOCK):
        col = start + tl.arange(0, BLOCK)
        mask = tl.expand_dims(row_ok, 1) & tl.expand_dims(col < cols, 0)
        at = base + tl.expand_dims(col, 0)
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        dx = dy * tl.exp2((x - lse) * LOG2E)
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def logsumexp_backward_columns_kernel(dy_ptr, x_ptr, lse_ptr, dx_ptr, R, inner, tiles_i, tiles_r,
                                      BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    """One [BLOCK_R, BLOCK_I] tile per program ``(o * tiles_r + tr) * tiles_i + t``: dy and lse at
    ``o * inner + i``, x and dx at ``(o * R + r) * inner + i`` (elementwise: no loop over R, so
    dim 0 of a square matrix still gets enough programs)."""
    pid = tl.program_id(0).to(tl.int64)
    t = pid % tiles_i
    rest = pid // tiles_i
    tr = rest % tiles_r
    o = rest // tiles_r
    i = t * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < inner
    r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    dy = tl.expand_dims(tl.load(dy_ptr + o * inner + i, mask=i_ok, other=0.0).to(tl.float32), 0)
    lse = tl.expand_dims(tl.load(lse_ptr + o * inner + i, mask=i_ok, other=0.0).to(tl.float32), 0)
    at = tl.expand_dims((o * R + r) * inner, 1) + tl.expand_dims(i, 0)
    mask = tl.expand_dims(r < R, 1) & tl.expand_dims(i_ok, 0)
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    dx = dy * tl.exp2((x - lse) * LOG2E)
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def logsumexp_backward_flat_kernel(dy_ptr, x_ptr, lse_ptr, dx_ptr, slice, inner, tiles, BLOCK: tl.constexpr,
                                   ROWS: tl.constexpr):
    """The gradient as an elementwise op: program ``o * tiles + t`` covers elements
    ``[t * BLOCK, (t + 1) * BLOCK)`` of slice ``o`` (R x inner contiguous elements). Offsets within
    the tile are int32 (the host declines inner >= 2^31); one int64 division per program. ROWS:
    inner == 1, one dy and lse per program."""
    pid = tl.program_id(0).to(tl.int64)
    o = pid // tiles
    start = (pid - o * tiles) * BLOCK
    local = tl.arange(0, BLOCK)
    mask = local < slice - start
    at = o * slice + start + local
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if ROWS:
        dy = tl.load(dy_ptr + o).to(tl.float32)
        lse = tl.load(lse_ptr + o).to(tl.float32)
    else:
        j = o * inner + ((start % inner).to(tl.int32) + local) % inner
        dy = tl.load(dy_ptr + j, mask=mask, other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + j, mask=mask, other=0.0).to(tl.float32)
    dx = dy * tl.exp2((x - lse) * LOG2E)
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def logsumexp_backward_static_kernel(dy_ptr, x_ptr, lse_ptr, dx_ptr, N: tl.constexpr, SLICE: tl.constexpr,
                                     INNER: tl.constexpr, BLOCK: tl.constexpr):
    """The gradient as an elementwise op with every size a compile-time constant, as torch.compile
    generates it (one compiled kernel per shape): element ``e`` takes dy and lse at
    ``(e // SLICE) * INNER + e % INNER``. Constant sizes make the divisions shifts or multiplies,
    drop the mask where BLOCK divides N, and let Triton see runs of contiguous dy/lse indices, so
    they load as vectors (the flat kernel's runtime ``% inner`` hides that, so it gathers them
    element by element, at well under half the speed: ``docs/measurements.md``). int32 offsets
    below 2^31 elements."""
    if N < 2**31:
        e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    else:
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    j = (e // SLICE) * INNER + e % INNER
    if N % BLOCK == 0:
        x = tl.load(x_ptr + e).to(tl.float32)
        dy = tl.load(dy_ptr + j, eviction_policy="evict_last").to(tl.float32)
        lse = tl.load(lse_ptr + j, eviction_policy="evict_last").to(tl.float32)
        tl.store(dx_ptr + e, (dy * tl.exp2((x - lse) * LOG2E)).to(dx_ptr.dtype.element_ty))
    else:
        mask = e < N
        x = tl.load(x_ptr + e, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + j, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        lse = tl.load(lse_ptr + j, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(dx_ptr + e, (dy * tl.exp2((x - lse) * LOG2E)).to(dx_ptr.dtype.element_ty), mask=mask)
