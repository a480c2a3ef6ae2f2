"""Layouts of a reduction (logsumexp) and its CUDA C candidates (``kernels/cuda/logsumexp*.cu``).

A contiguous input reduced over one dimension or a run of adjacent ones is an (outer, R, inner)
array reduced over R (:func:`reduction_view`): inner = 1 is *rows* (the last dimension), inner > 1
is *columns* (dim 0 of a matrix), read in place. :func:`rows_and_cols` is the last-dim-only view.
Anything else (strided views, non-adjacent dims, empty reductions: -inf) runs the default.

Work split (host side, per call, from the sizes and the SM count):
- rows: items of (BLOCK / TPR rows, a chunk of columns), walked grid-stride. The forward splits a
  row only in the ``*_split`` candidates, whose partial (max, sum) pairs a second kernel
  (``logsumexp_combine_*``) merges; the gradient needs no merge, so it always splits when rows are
  too few to fill the GPU.
- columns: blocks of (32 x VEC columns, one outer index, a chunk of R), partials merged by the
  same combine kernel when R is split; column strips (float32): a block per 32 columns over all
  of R, nothing to merge.
- flat (the gradient only, any layout): each (R x inner) slice cut into tiles of BLOCK x VEC x
  packs elements, one block per tile: the elementwise layout, no loop and no split to plan.
A thread never sums more than ``MAX_TERMS`` terms (an fp32 running sum starts to absorb small
terms past ~2^13: measured, a warp per row of 16M elements failed the numerical check).
"""

from __future__ import annotations

import functools
import math

import torch

from ..backends import nvrtc
from ..tunable.candidate import Candidate, hash_source

__all__ = ["DTYPES", "reduction_view", "rows_and_cols", "CudaRows", "CudaRowBlock", "CudaColumns", "CudaColumnStrip",
           "CudaRowsBackward", "CudaColumnsBackward", "CudaFlatBackward"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 256
BLOCKS_PER_SM = 2048 // BLOCK
#: columns kernels: threads along inner x along R (kernels/cuda/logsumexp*.cu)
IX, RY = 32, BLOCK // 32
MAX_TERMS = 2**13
MAX_GRID = 2**31 - 1
#: splits a warp merges per result (4 loads per lane); more go to a block per result
#: (kernels/cuda/logsumexp.cu: combine, combine_wide)
WARP_MERGE_SPLITS = 4 * 32
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def reduction_view(p) -> tuple[int, int, int] | str:
    """``p.x`` seen as a contiguous (outer, R, inner) array reduced over R, or why it cannot be.

    Applies to a contiguous float32/float16/bfloat16 input reduced over one dimension or over a run
    of adjacent dimensions (``(1, 2)`` of a 4-D tensor), with a non-empty reduction and at least one
    result, writing a new output or a contiguous one of the input's dtype. The last dimension gives
    inner = 1 (rows); dim 0 of a 2-D tensor gives outer = 1 (columns).
    """
    x, dims = p.x, p.dims
    if x.dtype not in DTYPES:
        return "float32, float16 or bfloat16 only"
    if x.dim() == 0:
        return "needs at least one dimension"
    if dims != tuple(range(dims[0], dims[-1] + 1)):
        return "reduces adjacent dimensions only"
    if not x.is_contiguous():
        return "needs a contiguous input"
    shape = x.shape
    outer, reduced, inner = (math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1]),
                             math.prod(shape[dims[-1] + 1:]))
    if reduced == 0 or outer * inner == 0:
        return "needs a non-empty reduction and a non-empty result"
    if p.out is not None and (not p.out.is_contiguous() or p.out.dtype != x.dtype):
        return "needs a contiguous output of the input's dtype"
    return outer, reduced, inner


def _extents(p) -> tuple[int, int, int]:
    """(outer, R, inner) of params ``supports()`` accepted: no checks (the launch path)."""
    shape, dims = p.x.shape, p.dims
    outer, reduced = math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1])
    return outer, reduced, math.prod(shape[dims[-1] + 1:])


def rows_and_cols(p) -> tuple[int, int] | str:
    """(rows, cols) of ``p.x`` reduced over its last dimension, or why the view does not apply."""
    x = p.x
    if x.dtype not in DTYPES:
        return "float32, float16 or bfloat16 only"
    if x.dim() == 0 or p.dims != (x.dim() - 1,):
        return "reduces the last dimension only"
    if not x.is_contiguous():
        return "needs a contiguous input"
    cols = x.shape[-1]
    if cols == 0 or x.numel() == 0:
        return "needs a non-empty reduction"
    if p.out is not None and (not p.out.is_contiguous() or p.out.dtype != x.dtype):
        return "needs a contiguous output of the input's dtype"
    return x.numel() // cols, cols


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def split_chunk(length: int, parallel: int, sms: int, *, threads: int, tile: int, min_tiles: int = 1,
                waves: int = 1) -> tuple[int, int]:
    """(chunk, splits) cutting ``length`` so ``parallel`` x splits work items give every SM about
    ``waves`` x BLOCKS_PER_SM blocks (more, smaller items shrink the last partial wave where no
    merge pass has to pay for them: the gradient), yet each chunk holds at least ``min_tiles`` whole ``tile``s (a block's
    fixed costs, and the partials a split writes, stay small next to its reads) and no thread sums
    more than MAX_TERMS terms (``threads`` threads share a chunk). Chunks are whole tiles, so vector
    loads stay aligned."""
    want = min(_ceil(sms * BLOCKS_PER_SM * waves, parallel), max(1, length // (tile * min_tiles)))
    need = _ceil(length, threads * MAX_TERMS)
    splits = max(1, min(max(want, need), _ceil(length, tile)))
    chunk = _ceil(_ceil(length, splits), tile) * tile
    return chunk, _ceil(length, chunk)


def _combine_grid(n: int, sms: int) -> int:
    """Blocks of the combine kernel: a warp per result, grid-stride past a few waves."""
    return min(_ceil(n, BLOCK // 32), sms * BLOCKS_PER_SM * 4)


class _CudaReduction(Candidate):
    """Checks shared by the CUDA C candidates: device, dtype, layout, vector alignment, NVRTC."""

    inputs = ("x",)

    def __init__(self, name: str, filename: str, kernel: str, dtype: torch.dtype, *, vec: int, unroll: int):
        self.name, self.dtype, self.vec, self.unroll = name, dtype, vec, unroll
        self.kernel = nvrtc.kernel(filename, kernel)
        self.combine = nvrtc.kernel("logsumexp.cu", f"logsumexp_combine_{SUFFIX[dtype]}")
        self.combine_wide = nvrtc.kernel("logsumexp.cu", f"logsumexp_combine_wide_{SUFFIX[dtype]}")

    def layout(self, outer: int, R: int, inner: int) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def supports(self, p) -> str | None:
        x = p.x
        if x.device.type != "cuda":
            return "needs a CUDA device"
        if x.dtype != self.dtype:
            return f"{str(self.dtype).removeprefix('torch.')} only"
        view = reduction_view(p)
        if isinstance(view, str):
            return view
        why = self.layout(*view)
        if why:
            return why
        for name in self.inputs:
            t = getattr(p, name)
            if t.dtype != x.dtype or not t.is_contiguous() or t.device != x.device:
                return "needs contiguous tensors of one dtype on one device"
            if name != "x" and t.numel() != view[0] * view[2]:
                return f"{name} must hold one value per result"
            if self.vec > 1 and t.data_ptr() % 16:
                return "needs 16-byte aligned tensors (vector loads)"
        return nvrtc.available()

    def source_hash(self) -> str:
        return hash_source(self.kernel.source_hash(), self.name, self.kernel.name, self.vec, self.unroll, BLOCK, IX)

    def merge_partials(self, index: int, partials: torch.Tensor, out: torch.Tensor, n: int, splits: int,
                       split_stride: int, result_stride: int) -> None:
        """The second pass: out[j] from partials[j * result_stride + k * split_stride], k < splits.
        A warp per result while 4 loads per lane cover the splits, else a block per result;
        launched as a dependent of the first pass (its launch latency hides behind that pass's
        last wave)."""
        sms = _sm_count(index)
        if splits <= WARP_MERGE_SPLITS:
            kernel, grid = self.combine, _combine_grid(n, sms)
        else:
            kernel, grid = self.combine_wide, min(n, sms * BLOCKS_PER_SM * 4)
        kernel.launch_dependent(index, grid, BLOCK, partials, out, n, splits, split_stride, result_stride)


class CudaRows(_CudaReduction):
    """Rows (inner = 1), ``threads_per_row`` threads each; ``split`` cuts rows into chunks merged by
    a second kernel (few long rows), otherwise rows longer than threads x MAX_TERMS are declined.
    ``chunk_bytes``: split into chunks of that size, one block each (the grid is every item; no
    block walks a second), instead of split_chunk's few long chunks for one or two waves."""

    chunk_bytes: int | None = None

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, threads_per_row: int, unroll: int,
                 split: bool = False, kernel: str | None = None, chunk_bytes: int | None = None):
        super().__init__(name, "logsumexp.cu", kernel or name, dtype, vec=vec, unroll=unroll)
        self.threads_per_row, self.split, self.chunk_bytes = threads_per_row, split or chunk_bytes is not None, chunk_bytes
        self.rows_per_block = BLOCK // threads_per_row
        self.max_cols = None if self.split else threads_per_row * MAX_TERMS

    def source_hash(self) -> str:
        base = super().source_hash()
        return base if self.chunk_bytes is None else hash_source(base, self.chunk_bytes)

    def layout(self, outer, R, inner):
        if inner != 1:
            return "reduces the last dimension(s) only"
        if self.max_cols is not None and R > self.max_cols:
            return f"rows longer than {self.max_cols} (fp32 sums of more than {MAX_TERMS} terms per thread)"
        if self.vec > 1 and R % self.vec:
            return f"rows must start 16-byte aligned (cols a multiple of {self.vec})"
        if self.chunk_bytes is not None and outer * _ceil(R, self.chunk_bytes // self.dtype.itemsize) > MAX_GRID:
            return f"more than {MAX_GRID} chunks (one block each)"
        return None

    def _work(self, p, split: dict | None) -> tuple[int, int, int, int, int, int]:
        """(device index, grid, rows, cols, chunk, splits) of a launch; ``split``: split_chunk's
        options when rows are cut into chunks (None: whole rows)."""
        rows, cols, _ = _extents(p)
        index = p.x.get_device()
        sms = _sm_count(index)
        groups = _ceil(rows, self.rows_per_block)
        chunk, splits = cols, 1
        if self.chunk_bytes is not None:  # one block per item (layout() declined more than MAX_GRID)
            chunk = min(cols, self.chunk_bytes // p.x.element_size())
            splits = _ceil(cols, chunk)
            return index, groups * splits, rows, cols, chunk, splits
        if split is not None:
            chunk, splits = split_chunk(cols, groups, sms, threads=self.threads_per_row,
                                        tile=self.threads_per_row * self.vec * self.unroll, **split)
        return index, min(groups * splits, sms * BLOCKS_PER_SM * 4), rows, cols, chunk, splits

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        index, grid, rows, cols, chunk, splits = self._work(p, split={} if self.split else None)
        if splits == 1:
            self.kernel.launch(index, grid, BLOCK, x, out, 0, rows, cols, chunk, 1)
            return out
        if self.chunk_bytes is not None:  # the chunks kernel writes partials[row][split]
            partials = torch.empty((rows, splits, 2), dtype=torch.float32, device=x.device)
            split_stride, result_stride = 1, splits
        else:
            partials = torch.empty((splits, rows, 2), dtype=torch.float32, device=x.device)
            split_stride, result_stride = rows, 1
        self.kernel.launch(index, grid, BLOCK, x, out, partials, rows, cols, chunk, splits)
        self.merge_partials(index, partials, out, rows, splits, split_stride, result_stride)
        return out


class CudaRowBlock(_CudaReduction):
    """Rows (inner = 1), one block of ``threads`` threads per row and the grid every row: no loop
    and no division ahead of the loads, nothing to merge. 128 threads at 8 blocks per SM keep
    1024 rows resident at once (one wave where the 256-thread forms need two); ``logsumexp.cu``
    has the measurements."""

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, threads: int):
        super().__init__(name, "logsumexp.cu", name, dtype, vec=vec, unroll=4)
        self.threads = threads

    def layout(self, outer, R, inner):
        if inner != 1:
            return "reduces the last dimension(s) only"
        if R % self.vec:
            return f"rows must start 16-byte aligned (cols a multiple of {self.vec})"
        if R > self.threads * MAX_TERMS:
            return f"rows longer than {self.threads * MAX_TERMS} (fp32 sums of more than {MAX_TERMS} terms per thread)"
        if outer > MAX_GRID:
            return f"more than {MAX_GRID} rows (one block each)"
        return None

    def source_hash(self) -> str:
        return hash_source(super().source_hash(), self.threads)

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        rows, cols, _ = _extents(p)
        self.kernel.launch(p.x.get_device(), rows, self.threads, p.x, out, cols)
        return out


class CudaColumns(_CudaReduction):
    """Columns (inner > 1), read in place: ``ix`` threads along inner (``vec`` columns each) by
    ``BLOCK / ix`` along R per block; R is cut into chunks (merged by the combine kernel) when
    columns are too few. ``ix`` = 32, or 8 for the narrow form (``logsumexp.cu`` says why)."""

    ix = IX

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, unroll: int, ix: int = IX):
        super().__init__(name, "logsumexp.cu", name, dtype, vec=vec, unroll=unroll)
        self.ix = ix

    def layout(self, outer, R, inner):
        if inner == 1:
            return "reduces a dimension other than the last"
        if self.vec > 1 and inner % self.vec:
            return f"the inner size must be a multiple of {self.vec} (vector loads)"
        if outer * _ceil(inner, self.ix * self.vec) > 2**30:
            return "too many columns for one launch"
        return None

    def _work(self, p) -> tuple[int, int, int, int, int, int, int]:
        """(device index, grid, outer, R, inner, chunk, splits) of a launch."""
        outer, R, inner = _extents(p)
        index = p.x.get_device()
        blocks = _ceil(inner, self.ix * self.vec) * outer
        ry = BLOCK // self.ix
        chunk, splits = split_chunk(R, blocks, _sm_count(index), threads=ry, tile=ry * self.unroll, min_tiles=4)
        return index, blocks * splits, outer, R, inner, chunk, splits

    def source_hash(self) -> str:
        return hash_source(super().source_hash(), self.ix)

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        index, grid, outer, R, inner, chunk, splits = self._work(p)
        partials = 0 if splits == 1 else torch.empty((splits, outer * inner, 2), dtype=torch.float32, device=x.device)
        self.kernel.launch(index, grid, BLOCK, x, out, partials, outer, R, inner, chunk, splits)
        if splits > 1:
            self.merge_partials(index, partials, out, outer * inner, splits, outer * inner, 1)
        return out


class CudaColumnStrip(_CudaReduction):
    """Columns (inner > 1), float32: a block of ``threads`` threads per strip of ``ix`` x ``vec``
    adjacent columns of one outer slice, over all of R, so no split and no merge pass
    (``logsumexp.cu``, ``column_strip``, has the measurements). Declined where a thread would sum
    more than MAX_TERMS terms of a column."""

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, ix: int, threads: int):
        super().__init__(name, "logsumexp.cu", name, dtype, vec=vec, unroll=4)
        self.ix, self.threads = ix, threads

    def layout(self, outer, R, inner):
        if inner == 1:
            return "reduces a dimension other than the last"
        if inner % self.vec:
            return f"the inner size must be a multiple of {self.vec} (vector loads)"
        if R > self.threads // self.ix * MAX_TERMS:
            return (f"reductions longer than {self.threads // self.ix * MAX_TERMS} (fp32 sums of more than "
                    f"{MAX_TERMS} terms per thread): the split columns candidates take them")
        if outer * _ceil(inner, self.ix * self.vec) > MAX_GRID:
            return "too many columns for one launch"
        return None

    def source_hash(self) -> str:
        return hash_source(super().source_hash(), self.ix, self.threads)

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        outer, R, inner = _extents(p)
        grid = outer * _ceil(inner, self.ix * self.vec)
        self.kernel.launch(p.x.get_device(), grid, self.threads, p.x, out, R, inner)
        return out


class CudaRowsBackward(CudaRows):
    """``dx = dy * exp(x - lse)`` over rows, ``threads_per_row`` threads each; rows are cut into
    chunks whenever they are too few to fill the GPU (no merge needed)."""

    inputs = ("dy", "x", "lse")

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, threads_per_row: int, unroll: int):
        _CudaReduction.__init__(self, name, "logsumexp_backward.cu", name, dtype, vec=vec, unroll=unroll)
        self.threads_per_row, self.split, self.max_cols = threads_per_row, True, None
        self.rows_per_block = BLOCK // threads_per_row

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        # measured on an H200 (64 x 1M float32): items for ~1.3 waves of resident blocks ran at 77%
        # of copy bandwidth; more, smaller items shrink the partial last wave
        index, grid, rows, cols, chunk, splits = self._work(p, split={"min_tiles": 4, "waves": 8})
        self.kernel.launch(index, grid, BLOCK, p.dy, p.x, p.lse, out, rows, cols, chunk, splits)
        return out


class CudaColumnsBackward(CudaColumns):
    """``dx = dy * exp(x - lse)`` over columns, in the forward's block layout."""

    inputs = ("dy", "x", "lse")

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, unroll: int):
        _CudaReduction.__init__(self, name, "logsumexp_backward.cu", name, dtype, vec=vec, unroll=unroll)

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        index, grid, outer, R, inner, chunk, splits = self._work(p)
        self.kernel.launch(index, grid, BLOCK, p.dy, p.x, p.lse, out, outer, R, inner, chunk, splits)
        return out


class CudaFlatBackward(_CudaReduction):
    """``dx = dy * exp(x - lse)`` as the elementwise op it is: every slice (R x inner contiguous
    elements of one outer index) cut into tiles of BLOCK x vec x ``packs`` elements, one block per
    tile, each thread ``packs`` vector loads in flight: the activations' layout, which reaches 95%
    of the copy bandwidth where the rows and columns forms (a chunk of R per thread, in a loop)
    reached 80-85% on an H200 (``benchmarks/results/logsumexp_backward_stores-<device>.md`` has
    both, after ``store_pack``)."""

    inputs = ("dy", "x", "lse")

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, packs: int):
        super().__init__(name, "logsumexp_backward.cu", name, dtype, vec=vec, unroll=packs)
        self.tile = BLOCK * vec * packs

    def layout(self, outer, R, inner):
        if self.vec > 1 and (R if inner == 1 else inner) % self.vec:
            return f"{'rows' if inner == 1 else 'the inner size'} must be a multiple of {self.vec} (vector loads)"
        if R * inner < BLOCK * self.vec:
            return (f"slices of {BLOCK * self.vec} elements or more only (shorter ones leave most of a block idle: "
                    "the rows forms take them)")
        if inner >= 2**31 or outer * _ceil(R * inner, self.tile) >= 2**31:
            return "too large for one launch (2^31 blocks, inner sizes below 2^31)"
        return None

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        outer, R, inner = _extents(p)
        tiles = _ceil(R * inner, self.tile)
        self.kernel.launch(p.x.get_device(), outer * tiles, BLOCK, p.dy, p.x, p.lse, out, R * inner, inner, tiles)
        return out


def cuda_candidates() -> list[_CudaReduction]:
    """The forward candidates, per dtype: rows (8, 32, 256 threads per row; scalar and 16-byte
    loads), split rows (a block per chunk), columns (scalar and 16-byte loads), row blocks (a block
    of 128 or 256 threads per row, 16-byte loads); float32 also column strips."""
    out: list[_CudaReduction] = []
    for dtype, sfx in SUFFIX.items():
        vec = 16 // torch.empty(0, dtype=dtype).element_size()
        for layout, tpr, unroll, unroll_vec in (("rows8", 8, 4, 2), ("warp", 32, 8, 4), ("block", 256, 8, 4)):
            out.append(CudaRows(f"logsumexp_{layout}_{sfx}", dtype, vec=1, threads_per_row=tpr, unroll=unroll))
            out.append(CudaRows(f"logsumexp_{layout}_{sfx}_vec", dtype, vec=vec, threads_per_row=tpr, unroll=unroll_vec))
        for v, unroll, tail in ((1, 8, ""), (vec, 4, "_vec")):
            out.append(CudaRows(f"logsumexp_block_split_{sfx}{tail}", dtype, vec=v, threads_per_row=256, unroll=unroll,
                                split=True, kernel=f"logsumexp_block_{sfx}{tail}"))
            out.append(CudaColumns(f"logsumexp_columns_{sfx}{tail}", dtype, vec=v, unroll=unroll))
        out.append(CudaColumns(f"logsumexp_columns_narrow_{sfx}_vec", dtype, vec=vec, unroll=4, ix=8))
        for kb in (32, 64):
            out.append(CudaRows(f"logsumexp_chunks{kb}k_{sfx}", dtype, vec=vec, threads_per_row=256, unroll=4,
                                kernel=f"logsumexp_chunks_{sfx}", chunk_bytes=kb * 1024))
        for threads in (128, 256):
            out.append(CudaRowBlock(f"logsumexp_rowblock{threads}_{sfx}_vec", dtype, vec=vec, threads=threads))
    out.append(CudaColumnStrip("logsumexp_columns_strip_f32_vec", torch.float32, vec=4, ix=8, threads=1024))
    return out


def cuda_backward_candidates() -> list[_CudaReduction]:
    """The gradient's candidates, per dtype: rows (8, 32 threads per row scalar; 32, 256 with 16-byte
    loads), columns (scalar and 16-byte loads), flat (scalar x 4; one or two 16-byte loads)."""
    out: list[_CudaReduction] = []
    for dtype, sfx in SUFFIX.items():
        vec = 16 // torch.empty(0, dtype=dtype).element_size()
        for layout, tpr, v, unroll in (("rows8", 8, 1, 4), ("warp", 32, 1, 8), ("warp", 32, vec, 4), ("block", 256, vec, 4)):
            tail = "_vec" if v > 1 else ""
            out.append(CudaRowsBackward(f"logsumexp_backward_{layout}_{sfx}{tail}", dtype, vec=v, threads_per_row=tpr,
                                        unroll=unroll))
        for v, unroll, tail in ((1, 8, ""), (vec, 4, "_vec")):
            out.append(CudaColumnsBackward(f"logsumexp_backward_columns_{sfx}{tail}", dtype, vec=v, unroll=unroll))
        for v, packs, tail in ((1, 4, ""), (vec, 1, "_vec"), (vec, 2, "_vec_x2")):
            out.append(CudaFlatBackward(f"logsumexp_backward_flat_{sfx}{tail}", dtype, vec=v, packs=packs))
    return out
