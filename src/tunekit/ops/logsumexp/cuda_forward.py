"""logsumexp's forward CUDA C candidates (``kernels/cuda/logsumexp.cu``): rows (8, 32, 256 threads per
row, optionally split over blocks), chunks, row blocks, columns read in place, column strips."""

from __future__ import annotations

import torch

from .cuda_common import BLOCK, BLOCKS_PER_SM, IX, CudaReduction, split_chunk, vector_width
from ...backends.device import sm_count
from ...tunable.candidate import hash_source
from ...tunable.dtypes import SHORT_NAMES
from .._shared.reduction import MAX_GRID, MAX_TERMS, ceil_div, extents

__all__ = ["CudaRows", "CudaRowBlock", "CudaColumns", "CudaColumnStrip", "cuda_candidates"]

#: the dtypes with kernels, by the suffix of their kernel names
SUFFIX = {dtype: SHORT_NAMES[dtype] for dtype in (torch.float32, torch.float16, torch.bfloat16)}


class CudaRows(CudaReduction):
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
        if self.chunk_bytes is not None and outer * ceil_div(R, self.chunk_bytes // self.dtype.itemsize) > MAX_GRID:
            return f"more than {MAX_GRID} chunks (one block each)"
        return None

    def _work(self, p, split: dict | None) -> tuple[int, int, int, int, int, int]:
        """(device index, grid, rows, cols, chunk, splits) of a launch; ``split``: split_chunk's
        options when rows are cut into chunks (None: whole rows)."""
        rows, cols, _ = extents(p)
        index = p.x.get_device()
        sms = sm_count(index)
        groups = ceil_div(rows, self.rows_per_block)
        chunk, splits = cols, 1
        if self.chunk_bytes is not None:  # one block per item (layout() declined more than MAX_GRID)
            chunk = min(cols, self.chunk_bytes // p.x.element_size())
            splits = ceil_div(cols, chunk)
            return index, groups * splits, rows, cols, chunk, splits
        if split is not None:
            chunk, splits = split_chunk(cols, groups, sms, threads=self.threads_per_row,
                                        tile=self.threads_per_row * self.vec * self.unroll, **split)
        return index, min(groups * splits, sms * BLOCKS_PER_SM * 4), rows, cols, chunk, splits

    def merges(self, p) -> tuple:
        splits = self._work(p, split={} if self.split else None)[5]
        return () if splits == 1 else (self.merge_kernel(splits),)

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


class CudaRowBlock(CudaReduction):
    """Rows (inner = 1), one block of ``threads`` threads per row and the grid every row: no loop
    and no division ahead of the loads, nothing to merge. 128 threads at 8 blocks per SM keep
    1024 rows resident at once (one wave where the 256-thread forms need two); the measurements
    are in ``docs/measurements.md``."""

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
        rows, cols, _ = extents(p)
        self.kernel.launch(p.x.get_device(), rows, self.threads, p.x, out, cols)
        return out


class CudaColumns(CudaReduction):
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
        if outer * ceil_div(inner, self.ix * self.vec) > 2**30:
            return "too many columns for one launch"
        return None

    def _work(self, p) -> tuple[int, int, int, int, int, int, int]:
        """(device index, grid, outer, R, inner, chunk, splits) of a launch."""
        outer, R, inner = extents(p)
        index = p.x.get_device()
        blocks = ceil_div(inner, self.ix * self.vec) * outer
        ry = BLOCK // self.ix
        chunk, splits = split_chunk(R, blocks, sm_count(index), threads=ry, tile=ry * self.unroll, min_tiles=4)
        return index, blocks * splits, outer, R, inner, chunk, splits

    def source_hash(self) -> str:
        return hash_source(super().source_hash(), self.ix)

    def merges(self, p) -> tuple:
        splits = self._work(p)[6]
        return () if splits == 1 else (self.merge_kernel(splits),)

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        index, grid, outer, R, inner, chunk, splits = self._work(p)
        partials = 0 if splits == 1 else torch.empty((splits, outer * inner, 2), dtype=torch.float32, device=x.device)
        self.kernel.launch(index, grid, BLOCK, x, out, partials, outer, R, inner, chunk, splits)
        if splits > 1:
            self.merge_partials(index, partials, out, outer * inner, splits, outer * inner, 1)
        return out


class CudaColumnStrip(CudaReduction):
    """Columns (inner > 1), float32: a block of ``threads`` threads per strip of ``ix`` x ``vec``
    adjacent columns of one outer slice, over all of R, so no split and no merge pass
    (``logsumexp.cu``'s ``column_strip``; measurements in ``docs/measurements.md``). Declined where
    a thread would sum more than MAX_TERMS terms of a column."""

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
        if outer * ceil_div(inner, self.ix * self.vec) > MAX_GRID:
            return "too many columns for one launch"
        return None

    def source_hash(self) -> str:
        return hash_source(super().source_hash(), self.ix, self.threads)

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        outer, R, inner = extents(p)
        grid = outer * ceil_div(inner, self.ix * self.vec)
        self.kernel.launch(p.x.get_device(), grid, self.threads, p.x, out, R, inner)
        return out


def cuda_candidates() -> list[CudaReduction]:
    """The forward candidates, per dtype: rows (8, 32, 256 threads per row; scalar and 16-byte
    loads), split rows (a block per chunk), columns (scalar and 16-byte loads), row blocks (a block
    of 128 or 256 threads per row, 16-byte loads); float32 also column strips."""
    out: list[CudaReduction] = []
    for dtype, sfx in SUFFIX.items():
        vec = vector_width(dtype)
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
