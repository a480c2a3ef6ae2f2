"""Layouts of a reduction over adjacent dimensions (logsumexp and its gradient), shared by the CUDA C
and Triton candidates.

A contiguous input reduced over one dimension or a run of adjacent ones is an (outer, R, inner)
array reduced over R (:func:`reduction_view`): inner = 1 is *rows* (the last dimension), inner > 1
is *columns* (dim 0 of a matrix), read in place. Anything else (strided views, non-adjacent dims,
empty reductions) runs the op's default.

A thread (or a Triton lane) never sums more than ``MAX_TERMS`` terms: an fp32 running sum starts to
absorb small terms past ~2^13 of them, so a long row summed by few threads (a warp per row of 16M
elements) drifts outside the numerical check's tolerance.
"""

from __future__ import annotations

import math

from ...tunable.dtypes import KERNEL_DTYPES

__all__ = ["MAX_TERMS", "MAX_GRID", "ceil_div", "reduction_view", "extents"]

MAX_TERMS = 2**13
#: the most blocks (programs) one launch may have along its one grid dimension
MAX_GRID = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def reduction_view(p) -> tuple[int, int, int] | str:
    """``p.x`` seen as a contiguous (outer, R, inner) array reduced over R, or why it cannot be.

    Applies to a contiguous float32/float16/bfloat16 input reduced over one dimension or over a run
    of adjacent dimensions (``(1, 2)`` of a 4-D tensor), with a non-empty reduction and at least one
    result, writing a new output or a contiguous one of the input's dtype. The last dimension gives
    inner = 1 (rows); dim 0 of a 2-D tensor gives outer = 1 (columns).
    """
    x, dims = p.x, p.dims
    if x.dtype not in KERNEL_DTYPES:
        return "float32, float16 or bfloat16 only"
    if x.dim() == 0:
        return "needs at least one dimension"
    if dims != tuple(range(dims[0], dims[-1] + 1)):
        return "reduces adjacent dimensions only"
    if not x.is_contiguous():
        return "needs a contiguous input"
    outer, reduced, inner = extents(p)
    if reduced == 0 or outer * inner == 0:
        return "needs a non-empty reduction and a non-empty result"
    if p.out is not None and (not p.out.is_contiguous() or p.out.dtype != x.dtype):
        return "needs a contiguous output of the input's dtype"
    return outer, reduced, inner


def extents(p) -> tuple[int, int, int]:
    """(outer, R, inner) of params ``supports()`` accepted: no checks (the launch path)."""
    shape, dims = p.x.shape, p.dims
    outer, reduced = math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1])
    return outer, reduced, math.prod(shape[dims[-1] + 1:])
