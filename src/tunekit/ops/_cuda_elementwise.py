"""A CUDA C elementwise kernel ``kernel(const T* x, T* y, long long n)`` as a candidate of an op
whose params have ``x`` and ``out`` (silu now, gelu next).

``supports`` says why it cannot run: not on a CUDA device, NVRTC missing, another dtype, a
non-contiguous tensor, or a pointer not aligned for the kernel's load width (``x[1:]`` of float16
is 2 bytes off a 16-byte boundary, so the 16-byte forms decline it and never read it).
"""

from __future__ import annotations

import torch

from ..backends import nvrtc
from ..tunable.candidate import Candidate, hash_source

__all__ = ["CudaElementwise"]

BLOCK = 256


class CudaElementwise(Candidate):
    def __init__(self, filename: str, name: str, dtype: torch.dtype, load_bytes: int, per_thread: int):
        self.name = name
        self.dtype = dtype
        self.load_bytes = load_bytes
        self.per_thread = per_thread
        self.kernel = nvrtc.kernel(filename, name)
        self.elements_per_block = BLOCK * per_thread

    def supports(self, p) -> str | None:
        x, out = p.x, p.out
        if x.device.type != "cuda":
            return "needs a CUDA device"
        if x.dtype != self.dtype:
            return f"{str(self.dtype).removeprefix('torch.')} only"
        missing = nvrtc.available()
        if missing:
            return missing
        if not x.is_contiguous() or (out is not None and not out.is_contiguous()):
            return "needs contiguous tensors"
        for name, t in (("x", x), ("out", out)):
            if t is not None and t.data_ptr() % self.load_bytes:
                return f"{name} is not {self.load_bytes}-byte aligned (offset {t.data_ptr() % 16} mod 16)"
        return None

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else torch.empty_like(x)
        n = x.numel()
        if n:
            grid = (n + self.elements_per_block - 1) // self.elements_per_block
            self.kernel.launch(x.device.index, grid, BLOCK, x, out, n)
        return out

    def source_hash(self) -> str:
        return hash_source(self.kernel.source_hash(), self.name, self.load_bytes, self.per_thread, BLOCK)
