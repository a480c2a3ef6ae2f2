"""Triton candidates of logsumexp (kernels: ``tunekit.kernels.triton.logsumexp``); the gradient's
are in ``triton_backward.py``, built on :class:`TritonRows` here.

Every class sees the input as the contiguous (outer, R, inner) array of
:func:`~tunekit.ops._shared.reduction.reduction_view` and declines the other layout, so the tuner only times
kernels that fit:

- :class:`TritonRows` (inner = 1): ROWS rows per program (1 for long rows, 4-16 for rows of up to
  4 x BLOCK, e.g. 32768 x 64). Also the gradient rows kernel (``inputs=("dy", "x", "lse")``).
- :class:`TritonSplitRows` (inner = 1, few long rows: 4 x 16M): chunks of each row reduced to fp32
  partials, merged by a combine kernel; declined when one program per row already fills the GPU.
- :class:`TritonColumns` (inner > 1): tiles along inner reduced over R in place, split over R
  (partials + combine) when outer * inner alone gives too few programs.
- :class:`TritonBackwardColumns` (inner > 1): the gradient, one tile per program.
- :class:`TritonBackwardFlat` (any inner): the gradient as an elementwise op, BLOCK contiguous
  elements of one slice per program.
- :class:`TritonBackwardStatic` (any inner): the same with the shape compiled in (one kernel per
  shape, as torch.compile does), so dy and lse load as vectors.

All are :class:`TritonRows` subclasses, so tests that pick Triton candidates by
``isinstance(c, TritonRows)`` (to keep interpreter sizes small) find them all. Register the lists
:func:`triton_logsumexp_candidates` and :func:`triton_logsumexp_backward_candidates`.

Work split: about PROGRAMS_PER_SM programs per SM in all (a few thousand on an H100), and no fp32
lane sums more than MAX_TERMS terms (past ~2^13 a running sum starts to absorb small terms, as
``ops/_shared/reduction.py`` says). Triton is imported at the first
``supports``/``run`` so ``TRITON_INTERPRET=1`` can still be set before the kernels load.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...backends import triton as triton_backend
from ...backends.device import sm_count
from ...tunable.candidate import Candidate, hash_source
from .._shared.reduction import MAX_GRID, MAX_TERMS, ceil_div, reduction_view

__all__ = ["TritonRows", "TritonSplitRows", "TritonColumns", "triton_logsumexp_candidates", "ROWS_CONFIGS",
           "kernel_fn", "rows_name"]

KERNELS_MODULE = "logsumexp"
KERNELS_FILE = Path(__file__).resolve().parents[2] / "kernels" / "triton" / "logsumexp.py"
PROGRAMS_PER_SM = 16
#: programs aimed for without an SM count (the interpreter): an H100's worth, so CPU tests take the
#: same split/no-split paths a GPU would for shapes of the same proportions
DEFAULT_PROGRAMS = 2048


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def kernel_fn(name: str):
    """The named kernel, or None without triton (a broken kernels module raises)."""
    return triton_backend.kernel(KERNELS_MODULE, name)


@functools.cache
def _sources() -> str:
    """The kernels and their launchers: a change to either re-tunes."""
    return KERNELS_FILE.read_text() + Path(__file__).read_text()


def split(length: int, parallel: int, programs: int, tile: int) -> tuple[int, int]:
    """(chunk, splits): ``length`` cut into ``splits`` chunks of whole ``tile``s so ``parallel`` x
    splits programs make about ``programs``, and no lane of a tile sums more than MAX_TERMS terms."""
    want = ceil_div(programs, parallel)
    need = ceil_div(length, tile * MAX_TERMS)
    splits = max(1, min(max(want, need), ceil_div(length, tile)))
    chunk = ceil_div(ceil_div(length, splits), tile) * tile
    return chunk, ceil_div(length, chunk)


#: what a configuration is made of (TritonRows and its subclasses' constructor arguments)
_CONFIG_FIELDS = ("kernel_name", "inputs", "block", "num_warps", "rows_per_program", "programs", "block_r", "block_i")


class TritonRows(Candidate):
    """``kernel(*inputs, out, rows, cols, BLOCK, ROWS)`` with ``rows_per_program`` rows per program
    (a [ROWS, BLOCK] tile), for the last dim(s) of a contiguous input (inner = 1). ``inputs``: the
    params' tensors passed before the output (``x``; ``dy, x, lse`` for the gradient); the output,
    ``p.out``, is allocated by ``p.new_outputs()`` when None. ``programs`` overrides the number of
    programs aimed for (the split subclasses; tests use it to force or forbid splits)."""

    def __init__(self, name: str, kernel: str, *, inputs=("x",), block: int = 1024, num_warps: int = 4,
                 rows_per_program: int = 1, programs: int | None = None):
        for v in (block, rows_per_program):
            if v <= 0 or v & (v - 1):
                raise ValueError(f"tile sizes must be powers of two, got {v}")
        self.name, self.kernel_name, self.inputs = name, kernel, tuple(inputs)
        self.block, self.num_warps, self.rows_per_program = block, num_warps, rows_per_program
        self.programs = programs

    @property
    def backward(self) -> bool:
        return "dy" in self.inputs

    # -- checks --------------------------------------------------------------------------------------
    def supports(self, p) -> str | None:
        x = p.x
        why = triton_backend.device_problem(x.device)
        if why:
            return why
        view = reduction_view(p)
        if isinstance(view, str):
            return view
        outer, R, inner = view
        for name in self.inputs:
            t = getattr(p, name)
            if t.dtype != x.dtype or t.device != x.device:
                return "needs all tensors of one dtype on one device"
            if not t.is_contiguous():
                return "needs contiguous tensors"
            if name != "x" and t.numel() != outer * inner:
                return f"{name} needs one value per result ({outer * inner})"
        out = p.out
        size = x.numel() if self.backward else outer * inner
        if out is not None and (out.device != x.device or out.numel() != size):
            return "out has the wrong device or number of elements"
        why = self.layout(outer, R, inner, x.device)
        if why is not None:
            return why
        if self.grid(outer, R, inner, x.device) > MAX_GRID:
            return f"more than {MAX_GRID} programs"
        for name in self.kernel_names():
            kernel = kernel_fn(name)
            if kernel is None:
                return triton_backend.NO_TRITON
            why = triton_backend.device_problem(x.device, kernel)
            if why:
                return why
        return None

    def layout(self, outer: int, R: int, inner: int, device) -> str | None:
        """None when this kernel suits the view (beyond correctness: it is worth timing), else why not."""
        if inner != 1:
            return "reduces the last dimension(s) only (inner = 1): the columns candidates take the others"
        if self.rows_per_program > 1 and R > 4 * self.block:
            return f"rows longer than {4 * self.block}: the one-row-per-program candidates take them"
        if not self.backward and R > self.block * MAX_TERMS:
            return (f"rows longer than {self.block * MAX_TERMS} (over {MAX_TERMS} terms per fp32 lane sum): "
                    "the split candidates take them")
        return None

    def grid(self, outer: int, R: int, inner: int, device) -> int:
        return ceil_div(outer, self.rows_per_program)

    def kernel_names(self) -> tuple[str, ...]:
        return (self.kernel_name,)

    def target_programs(self, device) -> int:
        if self.programs is not None:
            return self.programs
        if device.type != "cuda":
            return DEFAULT_PROGRAMS
        return sm_count(device.index if device.index is not None else torch.cuda.current_device()) * PROGRAMS_PER_SM

    # -- launch --------------------------------------------------------------------------------------
    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        outer, R, inner = reduction_view(p)
        tensors = [getattr(p, name) for name in self.inputs]
        with triton_backend.on_device(x.device):
            self.launch(tensors, out, outer, R, inner)
        return out

    def prepare(self, p) -> None:
        """Compile this candidate's kernels for ``p`` without launching them (tuning calls it on a
        worker thread)."""
        if p.x.device.type == "cuda":
            with triton_backend.warming(p.x.device):
                self.run(p)

    def launch(self, tensors, out, outer: int, R: int, inner: int) -> None:
        triton_backend.launch(kernel_fn(self.kernel_name), (self.grid(outer, R, inner, out.device),),
            *tensors, out, outer, R, BLOCK=self.block, ROWS=self.rows_per_program, num_warps=self.num_warps)

    def source_hash(self) -> str:
        # the configuration's fields only: an attribute set on the instance later (a test's spy
        # on ``run``) must not change the hash
        config = sorted((k, v) for k, v in vars(self).items() if k in _CONFIG_FIELDS)
        return hash_source(_sources(), type(self).__name__, self.name, config)


def _combine(pm: torch.Tensor, ps: torch.Tensor, out: torch.Tensor, n_out: int, splits: int) -> None:
    """Merge partials laid out [splits, n_out] into ``out``: tiles of up to 2048 partials."""
    block_n = min(128, _pow2(n_out))
    block_k = min(_pow2(splits), max(1, 2048 // block_n))
    triton_backend.launch(kernel_fn("logsumexp_combine_kernel"), (ceil_div(n_out, block_n),),
        pm, ps, out, n_out, splits, BLOCK_K=block_k, BLOCK_N=block_n, num_warps=4)


class TritonSplitRows(TritonRows):
    """Few very long rows (4 x 16M, 64 x 1M): program (row, k) reduces chunk k of its row into an
    fp32 (max, sum) partial, then the combine kernel merges each row's partials: one program per
    row would leave most of the GPU idle. Declined when that split would be a single chunk."""

    def __init__(self, name: str, *, block: int = 4096, num_warps: int = 8, programs: int | None = None):
        super().__init__(name, "logsumexp_split_rows_kernel", block=block, num_warps=num_warps, programs=programs)

    def kernel_names(self):
        return (self.kernel_name, "logsumexp_combine_kernel")

    def plan(self, rows: int, cols: int, device) -> tuple[int, int]:
        return split(cols, rows, self.target_programs(device), self.block)

    def layout(self, outer, R, inner, device):
        if inner != 1:
            return "reduces the last dimension(s) only (inner = 1): the columns candidates take the others"
        if self.plan(outer, R, device)[1] == 1:
            return "rows too short or too many to split (one program per row fills the GPU): the rows candidates"
        return None

    def grid(self, outer, R, inner, device):
        return outer * self.plan(outer, R, device)[1]

    def launch(self, tensors, out, outer, R, inner):
        (x,) = tensors
        chunk, splits = self.plan(outer, R, x.device)
        pm = torch.empty((splits, outer), dtype=torch.float32, device=x.device)
        ps = torch.empty_like(pm)
        triton_backend.launch(kernel_fn(self.kernel_name), (outer * splits,),x, pm, ps, outer, R, chunk, splits,
                                                      BLOCK=self.block, num_warps=self.num_warps)
        _combine(pm, ps, out, outer, splits)


class TritonColumns(TritonRows):
    """A non-last dim (inner > 1), reduced in place: tiles [block_r, block_i] loaded along inner
    (coalesced), an online max/sum over R. When outer x inner / block_i programs are too few (dim 0
    of 4096 x 4096: 64), R is split too, into partials merged by the combine kernel."""

    def __init__(self, name: str, *, block_r: int = 32, block_i: int = 64, num_warps: int = 4,
                 programs: int | None = None):
        super().__init__(name, "logsumexp_columns_kernel", block=block_i, num_warps=num_warps,
                         rows_per_program=block_r, programs=programs)
        self.block_r, self.block_i = block_r, block_i

    def kernel_names(self):
        return (self.kernel_name, "logsumexp_combine_kernel")

    def layout(self, outer, R, inner, device):
        if inner == 1:
            return "reduces a non-last dimension only (inner > 1): the rows candidates take the last"
        return None

    def plan(self, outer: int, R: int, inner: int, device) -> tuple[int, int, int]:
        tiles_i = ceil_div(inner, self.block_i)
        chunk, splits = split(R, outer * tiles_i, self.target_programs(device), self.block_r)
        return tiles_i, chunk, splits

    def grid(self, outer, R, inner, device):
        tiles_i, _, splits = self.plan(outer, R, inner, device)
        return outer * tiles_i * splits

    def launch(self, tensors, out, outer, R, inner):
        (x,) = tensors
        tiles_i, chunk, splits = self.plan(outer, R, inner, x.device)
        n_out = outer * inner
        if splits > 1:
            pm = torch.empty((splits, n_out), dtype=torch.float32, device=x.device)
            ps = torch.empty_like(pm)
        else:
            pm = ps = out  # not written
        triton_backend.launch(kernel_fn(self.kernel_name), (outer * tiles_i * splits,),
            x, out, pm, ps, R, inner, n_out, tiles_i, splits, chunk,
            BLOCK_R=self.block_r, BLOCK_I=self.block_i, SPLIT=splits > 1, num_warps=self.num_warps)
        if splits > 1:
            _combine(pm, ps, out, n_out, splits)


#: (rows per program, BLOCK, warps) of the rows kernels, forward and backward
ROWS_CONFIGS = [(1, 1024, 4), (1, 4096, 8), (4, 256, 4), (16, 64, 4)]
SPLIT_CONFIGS = [(1024, 4), (4096, 8)]
#: (block_r, block_i, warps): inner of 64 and more, of 256 and more, small inner (5, 7, 16)
COLUMNS_CONFIGS = [(32, 64, 4), (8, 256, 4), (64, 16, 4)]


def rows_name(prefix: str, rows: int, block: int, warps: int) -> str:
    return f"{prefix}_triton_rows_" + (f"r{rows}_" if rows > 1 else "") + f"b{block}_w{warps}"


def triton_logsumexp_candidates() -> list[TritonRows]:
    """The Triton forward candidates to register on ``logsumexp_op``."""
    out: list[TritonRows] = [
        TritonRows(rows_name("logsumexp", r, b, w), "logsumexp_rows_kernel", block=b, num_warps=w, rows_per_program=r)
        for r, b, w in ROWS_CONFIGS]
    out += [TritonSplitRows(f"logsumexp_triton_split_b{b}_w{w}", block=b, num_warps=w) for b, w in SPLIT_CONFIGS]
    out += [TritonColumns(f"logsumexp_triton_columns_r{r}_i{i}_w{w}", block_r=r, block_i=i, num_warps=w)
            for r, i, w in COLUMNS_CONFIGS]
    return out
