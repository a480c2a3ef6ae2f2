"""Candidates of a row reduction (logsumexp): kernels that see a contiguous input as (rows, cols)
and reduce the last dimension, one result per row.

``rows_and_cols(p)`` says whether params fit that view: a contiguous float32/float16/bfloat16
input of at least one dimension, reduced over its last dimension only, with at least one row and
one column (an empty reduction is the default's: -inf everywhere), and a contiguous output.
The other layouts (other dims, tuples of dims, strided views) run the default.
"""

from __future__ import annotations

import functools
import math

import torch

from ..backends import nvrtc
from ..tunable.candidate import Candidate, hash_source

__all__ = ["DTYPES", "reduction_view", "rows_and_cols", "CudaRows"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 256
BLOCKS_PER_SM = 2048 // BLOCK


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


class CudaRows(Candidate):
    """``kernel(const T* x, T* out, long long rows, long long cols)`` from ``filename``, with
    ``threads_per_row`` threads per row (rows per 256-thread block = 256 / threads_per_row) and
    ``vec`` elements per load (rows must then start on 16-byte boundaries)."""

    #: elements one thread may sum: past ~2^13 terms an fp32 running sum starts to absorb small
    #: terms (measured: a warp per row of 16M elements was rejected by the numerical check)
    MAX_PER_THREAD = 2**13

    def __init__(self, filename: str, name: str, dtype: torch.dtype, *, vec: int, threads_per_row: int):
        self.name = name
        self.dtype = dtype
        self.vec = vec
        self.rows_per_block = BLOCK // threads_per_row
        self.max_cols = threads_per_row * self.MAX_PER_THREAD
        self.kernel = nvrtc.kernel(filename, name)

    def supports(self, p) -> str | None:
        x = p.x
        if x.device.type != "cuda":
            return "needs a CUDA device"
        if x.dtype != self.dtype:
            return f"{str(self.dtype).removeprefix('torch.')} only"
        view = rows_and_cols(p)
        if isinstance(view, str):
            return view
        if view[1] > self.max_cols:
            return f"rows longer than {self.max_cols} (fp32 sums of more than {self.MAX_PER_THREAD} terms per thread)"
        if self.vec > 1 and (x.data_ptr() % 16 or view[1] % self.vec):
            return f"rows must start 16-byte aligned (cols a multiple of {self.vec}, x aligned)"
        return nvrtc.available()

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        rows, cols = x.numel() // x.shape[-1], x.shape[-1]
        index = x.get_device()
        grid = min((rows + self.rows_per_block - 1) // self.rows_per_block, _sm_count(index) * BLOCKS_PER_SM * 4)
        self.kernel.launch(index, grid, BLOCK, x, out, rows, cols)
        return out

    def source_hash(self) -> str:
        return hash_source(self.kernel.source_hash(), self.name, self.vec, self.rows_per_block, BLOCK)
