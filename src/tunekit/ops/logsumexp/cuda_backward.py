"""logsumexp's gradient ``dx = dy * exp(x - lse)`` as CUDA C candidates
(``kernels/cuda/logsumexp_backward.cu``): rows, columns, and flat (any layout, the elementwise
layout: one block per tile of a slice)."""

from __future__ import annotations

import torch

from .cuda_common import BLOCK, CudaReduction, vector_width
from .cuda_forward import SUFFIX, CudaColumns, CudaRows
from .._shared.reduction import ceil_div, extents

__all__ = ["CudaRowsBackward", "CudaColumnsBackward", "CudaFlatBackward", "cuda_backward_candidates"]


class CudaRowsBackward(CudaRows):
    """``dx = dy * exp(x - lse)`` over rows, ``threads_per_row`` threads each; rows are cut into
    chunks whenever they are too few to fill the GPU (no merge needed)."""

    inputs = ("dy", "x", "lse")

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, threads_per_row: int, unroll: int):
        CudaReduction.__init__(self, name, "logsumexp_backward.cu", name, dtype, vec=vec, unroll=unroll)
        self.threads_per_row, self.split, self.max_cols = threads_per_row, True, None
        self.rows_per_block = BLOCK // threads_per_row

    def merges(self, p) -> tuple:  # split rows write their own gradient: nothing to merge
        return ()

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        # items for ~1.3 waves of resident blocks leave most SMs idle in the second wave; more, smaller
        # items shrink that partial last wave (no merge pass pays for them here)
        index, grid, rows, cols, chunk, splits = self._work(p, split={"min_tiles": 4, "waves": 8})
        self.kernel.launch(index, grid, BLOCK, p.dy, p.x, p.lse, out, rows, cols, chunk, splits)
        return out


class CudaColumnsBackward(CudaColumns):
    """``dx = dy * exp(x - lse)`` over columns, in the forward's block layout."""

    inputs = ("dy", "x", "lse")

    def __init__(self, name: str, dtype: torch.dtype, *, vec: int, unroll: int):
        CudaReduction.__init__(self, name, "logsumexp_backward.cu", name, dtype, vec=vec, unroll=unroll)

    def merges(self, p) -> tuple:  # split columns write their own gradient: nothing to merge
        return ()

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        index, grid, outer, R, inner, chunk, splits = self._work(p)
        self.kernel.launch(index, grid, BLOCK, p.dy, p.x, p.lse, out, outer, R, inner, chunk, splits)
        return out


class CudaFlatBackward(CudaReduction):
    """``dx = dy * exp(x - lse)`` as the elementwise op it is: every slice (R x inner contiguous
    elements of one outer index) cut into tiles of BLOCK x vec x ``packs`` elements, one block per
    tile, each thread ``packs`` vector loads in flight: the activations' layout, with every load of
    a thread issued at once and no loop, where the rows and columns forms walk a chunk of R per
    thread in a loop and keep fewer bytes in flight
    (``benchmarks/results/logsumexp_backward_stores-<device>.md`` compares them)."""

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
        if inner >= 2**31 or outer * ceil_div(R * inner, self.tile) >= 2**31:
            return "too large for one launch (2^31 blocks, inner sizes below 2^31)"
        return None

    def run(self, p):
        out = p.out if p.out is not None else p.new_outputs()["out"]
        outer, R, inner = extents(p)
        tiles = ceil_div(R * inner, self.tile)
        self.kernel.launch(p.x.get_device(), outer * tiles, BLOCK, p.dy, p.x, p.lse, out, R * inner, inner, tiles)
        return out


def cuda_backward_candidates() -> list[CudaReduction]:
    """The gradient's candidates, per dtype: rows (8, 32 threads per row scalar; 32, 256 with 16-byte
    loads), columns (scalar and 16-byte loads), flat (scalar x 4; one or two 16-byte loads)."""
    out: list[CudaReduction] = []
    for dtype, sfx in SUFFIX.items():
        vec = vector_width(dtype)
        for layout, tpr, v, unroll in (("rows8", 8, 1, 4), ("warp", 32, 1, 8), ("warp", 32, vec, 4), ("block", 256, vec, 4)):
            tail = "_vec" if v > 1 else ""
            out.append(CudaRowsBackward(f"logsumexp_backward_{layout}_{sfx}{tail}", dtype, vec=v, threads_per_row=tpr,
                                        unroll=unroll))
        for v, unroll, tail in ((1, 8, ""), (vec, 4, "_vec")):
            out.append(CudaColumnsBackward(f"logsumexp_backward_columns_{sfx}{tail}", dtype, vec=v, unroll=unroll))
        for v, packs, tail in ((1, 4, ""), (vec, 1, "_vec"), (vec, 2, "_vec_x2")):
            out.append(CudaFlatBackward(f"logsumexp_backward_flat_{sfx}{tail}", dtype, vec=v, packs=packs))
    return out
