"""What logsumexp's CUDA C candidates share (``kernels/cuda/logsumexp*.cu``): the launch constants,
the work split, the checks every candidate makes, and the merge pass of split reductions.

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
"""

from __future__ import annotations

import torch

from ...backends import cuda, nvrtc
from ...backends.device import sm_count
from ...tunable.candidate import Candidate, hash_source
from ...tunable.dtypes import short_name
from .._shared.reduction import MAX_TERMS, ceil_div, reduction_view

__all__ = ["BLOCK", "BLOCKS_PER_SM", "IX", "CudaReduction", "split_chunk", "vector_width"]

BLOCK = 256
BLOCKS_PER_SM = 2048 // BLOCK
#: columns kernels: threads along inner x along R (kernels/cuda/logsumexp*.cu)
IX = 32
#: splits a warp merges per result (4 loads per lane); more go to a block per result
#: (kernels/cuda/logsumexp.cu: combine, combine_wide)
WARP_MERGE_SPLITS = 4 * 32


def vector_width(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one 16-byte access."""
    return 16 // torch.empty(0, dtype=dtype).element_size()


def split_chunk(length: int, parallel: int, sms: int, *, threads: int, tile: int, min_tiles: int = 1,
                waves: int = 1) -> tuple[int, int]:
    """(chunk, splits) cutting ``length`` so ``parallel`` x splits work items give every SM about
    ``waves`` x BLOCKS_PER_SM blocks (more, smaller items shrink the last partial wave where no
    merge pass has to pay for them: the gradient), yet each chunk holds at least ``min_tiles`` whole
    ``tile``s (a block's fixed costs, and the partials a split writes, stay small next to its reads)
    and no thread sums more than MAX_TERMS terms (``threads`` threads share a chunk). Chunks are
    whole tiles, so vector loads stay aligned."""
    want = min(ceil_div(sms * BLOCKS_PER_SM * waves, parallel), max(1, length // (tile * min_tiles)))
    need = ceil_div(length, threads * MAX_TERMS)
    splits = max(1, min(max(want, need), ceil_div(length, tile)))
    chunk = ceil_div(ceil_div(length, splits), tile) * tile
    return chunk, ceil_div(length, chunk)


def combine_grid(n: int, sms: int) -> int:
    """Blocks of the combine kernel: a warp per result, grid-stride past a few waves."""
    return min(ceil_div(n, BLOCK // 32), sms * BLOCKS_PER_SM * 4)


class CudaReduction(Candidate):
    """Checks shared by the CUDA C candidates: device, dtype, layout, vector alignment, NVRTC."""

    inputs = ("x",)

    def __init__(self, name: str, filename: str, kernel: str, dtype: torch.dtype, *, vec: int, unroll: int):
        self.name, self.dtype, self.vec, self.unroll = name, dtype, vec, unroll
        self.kernel = cuda.kernel(filename, kernel)
        self.combine = cuda.kernel("logsumexp.cu", f"logsumexp_combine_{short_name(dtype)}")
        self.combine_wide = cuda.kernel("logsumexp.cu", f"logsumexp_combine_wide_{short_name(dtype)}")

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

    def prepare(self, p) -> None:
        """Compile and load the kernels ``run(p)`` launches (its own, and a merge pass where ``p``'s launch
        is split) on ``p``'s device: tuning calls it on a worker thread, so the first run does not wait
        for NVRTC (nor for the C launch extension's build, on a machine's first use)."""
        index = p.x.get_device()
        for kernel in (self.kernel, *self.merges(p)):
            kernel.address(index)
        cuda.direct_launch()

    def merges(self, p) -> tuple:
        """The merge kernels ``run(p)`` launches: none here (a form that merges says when). Loading both
        for every candidate took two module loads, 0.6-1.3 ms each, of a shipped choice's first call (H100)."""
        return ()

    def merge_kernel(self, splits: int):
        """A warp per result while 4 loads per lane cover the splits, else a block per result."""
        return self.combine if splits <= WARP_MERGE_SPLITS else self.combine_wide

    def source_hash(self) -> str:
        return hash_source(self.kernel.source_hash(), self.name, self.kernel.name, self.vec, self.unroll, BLOCK, IX)

    def merge_partials(self, index: int, partials: torch.Tensor, out: torch.Tensor, n: int, splits: int,
                       split_stride: int, result_stride: int) -> None:
        """The second pass: out[j] from partials[j * result_stride + k * split_stride], k < splits.
        A warp per result while 4 loads per lane cover the splits, else a block per result;
        launched as a dependent of the first pass (its launch latency hides behind that pass's
        last wave)."""
        sms, kernel = sm_count(index), self.merge_kernel(splits)
        grid = combine_grid(n, sms) if splits <= WARP_MERGE_SPLITS else min(n, sms * BLOCKS_PER_SM * 4)
        kernel.launch_dependent(index, grid, BLOCK, partials, out, n, splits, split_stride, result_stride)
