"""Triton candidates of rms_norm and its gradient (kernels: ``tunekit.kernels.triton.rms_norm``).

Both hold a whole row in registers (``BLOCK``: the row length rounded up to a power of two, up to
:data:`MAX_ROW`), for contiguous inputs whose weight has the input's dtype: torch's default takes
every other form (longer rows, strides, float64). A configuration is a value: rows per program and
warps for the forward; warps and programs per SM for the gradient, whose programs each sum their
rows' share of ``dweight`` in float32 (one partial row per program, added at the end).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .params import RmsNormBackwardParams, RmsNormParams, epsilon, row_count
from .._shared.reduction import MAX_GRID, ceil_div
from ...backends import triton as triton_backend
from ...backends.device import sm_count
from ...tunable.candidate import Candidate, hash_source

__all__ = ["TritonRmsNorm", "TritonRmsNormBackward", "triton_rms_norm_candidates",
           "triton_rms_norm_backward_candidates", "MAX_ROW"]

KERNELS_FILE = Path(__file__).resolve().parents[2] / "kernels" / "triton" / "rms_norm.py"
#: the longest row a program holds in registers (16-bit: 32 KB)
MAX_ROW = 16384
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: (rows per program, warps) of the forward; (warps, programs per SM) of the gradient
FORWARD_CONFIGS = [(1, 4), (1, 8), (4, 4), (2, 8)]
BACKWARD_CONFIGS = [(4, 2), (8, 2), (8, 4)]
#: programs the gradient aims for without an SM count (the interpreter)
DEFAULT_PROGRAMS = 264


def kernel_fn(name: str):
    return triton_backend.kernel("rms_norm", name)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def _sources() -> str:
    """The kernels and their launchers: a change to either re-tunes."""
    return KERNELS_FILE.read_text() + Path(__file__).read_text()


class _TritonRows(Candidate):
    kernel_name = ""
    tensors: tuple[str, ...] = ()

    def supports(self, p) -> str | None:
        x = p.x
        why = triton_backend.device_problem(x.device)
        if why:
            return why
        if x.dtype not in _DTYPES:
            return "float16 / bfloat16 / float32 only (torch's default takes float64)"
        n = p.weight.numel()
        if not 0 < n <= MAX_ROW:
            return f"rows of 1 to {MAX_ROW} elements (one row in registers)"
        for name in self.tensors:
            t = getattr(p, name)
            if t.dtype != x.dtype or t.device != x.device or not t.is_contiguous():
                return "contiguous tensors of one dtype on one device"
        for name in type(p).outputs:
            out = getattr(p, name)
            if out is not None and not out.is_contiguous():
                return "contiguous outputs"
        if self.grid(p) > MAX_GRID:
            return f"more than {MAX_GRID} programs"
        kernel = kernel_fn(self.kernel_name)
        if kernel is None:
            return triton_backend.NO_TRITON
        return triton_backend.device_problem(x.device, kernel)

    def prepare(self, p) -> None:
        """Compile the kernel for ``p`` without launching it (tuning calls it on a worker thread)."""
        if p.x.device.type == "cuda":
            with triton_backend.warming(p.x.device):
                self.run(p)

    def source_hash(self) -> str:
        # the configuration only: an attribute set on the instance later (a test's spy) must not re-tune
        return hash_source(_sources(), type(self).__name__, self.name)


class TritonRmsNorm(_TritonRows):
    """``rows`` rows per program, one row per warp group: few rows of a short row per program keep a
    full tile of loads in flight."""

    kernel_name = "rms_norm_forward_kernel"
    tensors = ("x", "weight")

    def __init__(self, rows: int = 1, num_warps: int = 4):
        self.name = f"rms_norm_triton_r{rows}_w{num_warps}"
        self.rows, self.num_warps = rows, num_warps

    def grid(self, p: RmsNormParams) -> int:
        return ceil_div(row_count(p.x, p.normalized_shape), self.rows)

    def run(self, p: RmsNormParams) -> torch.Tensor:
        out = p.out if p.out is not None else p.new_outputs()["out"]
        n = p.weight.numel()
        grid = self.grid(p)
        if grid:
            with triton_backend.on_device(p.x.device):
                triton_backend.launch(kernel_fn(self.kernel_name), (grid,), p.x, p.weight, out,
                                      row_count(p.x, p.normalized_shape), n, epsilon(p.x, p.eps),
                                      BLOCK=_pow2(n), ROWS=self.rows, num_warps=self.num_warps)
        return out


class TritonRmsNormBackward(_TritonRows):
    """dx row by row, dweight as one float32 partial row per program, then their sum."""

    kernel_name = "rms_norm_backward_kernel"
    tensors = ("dy", "x", "weight")

    def __init__(self, num_warps: int = 4, programs_per_sm: int = 2):
        self.name = f"rms_norm_backward_triton_w{num_warps}_p{programs_per_sm}"
        self.num_warps, self.programs_per_sm = num_warps, programs_per_sm

    def _programs(self, device) -> int:
        if device.type != "cuda":
            return DEFAULT_PROGRAMS
        return sm_count(device.index if device.index is not None else torch.cuda.current_device()) * self.programs_per_sm

    def grid(self, p: RmsNormBackwardParams) -> int:
        return min(row_count(p.x, p.normalized_shape), self._programs(p.x.device))

    def run(self, p: RmsNormBackwardParams):
        outs = p.new_outputs() if p.out is None or p.dweight is None else None
        dx = p.out if p.out is not None else outs["out"]
        dweight = p.dweight if p.dweight is not None else outs["dweight"]
        n, rows = p.weight.numel(), row_count(p.x, p.normalized_shape)
        grid = self.grid(p)
        if not grid:
            dweight.zero_()
            return dx, dweight
        partial = torch.empty(grid, n, dtype=torch.float32, device=p.x.device)
        with triton_backend.on_device(p.x.device):
            triton_backend.launch(kernel_fn(self.kernel_name), (grid,), p.dy, p.x, p.weight, dx, partial, rows, n,
                                  epsilon(p.x, p.eps), ceil_div(rows, grid), BLOCK=_pow2(n), num_warps=self.num_warps)
        dweight.view(-1).copy_(partial.sum(0) if grid > 1 else partial[0])
        return dx, dweight


def triton_rms_norm_candidates() -> list[TritonRmsNorm]:
    return [TritonRmsNorm(r, w) for r, w in FORWARD_CONFIGS]


def triton_rms_norm_backward_candidates() -> list[TritonRmsNormBackward]:
    return [TritonRmsNormBackward(w, p) for w, p in BACKWARD_CONFIGS]
