"""The gradient's default candidate: ``dx = dy * exp(x - lse)`` in one fused pass wherever a CUDA C
kernel can run the layout, torch's composite otherwise.

Why not torch's composite alone: in 16-bit it must compute in float32 (``x - lse`` rounded to
bfloat16 alone is off by up to 3% of the gradient), and the upcasts, the subtraction, the
exponential, the product and the downcast are six passes over the data: about twice torch eager's
own (16-bit, less accurate) backward. A default is what runs before tuning has decided and after
it has kept the default, so it must be neither slower than eager nor less accurate than float32
math: the fused kernels read x, dy and lse once, compute in float32 and write dx once.

The pick: the first of the fused kernels whose ``supports`` accepts the params (16-byte forms where
alignment allows, scalar forms for any alignment, rows or columns forms for slices too short for the
flat ones), cached per cache key; strided inputs, float64, the CPU and machines without NVRTC run
the composite. The fused kernels are also candidates of their own (tuning may find a faster one).
"""

from __future__ import annotations

import inspect
from typing import Callable

from .cuda_backward import CudaColumnsBackward, CudaFlatBackward, CudaRowsBackward
from .cuda_common import vector_width
from .cuda_forward import SUFFIX
from ...tunable.candidate import Candidate, hash_source

__all__ = ["FusedGradient"]


def _fused_kernels() -> list:
    """Per dtype, in order of preference: flat 16-byte x2, flat 16-byte, flat scalar, rows (8 threads
    a row, scalar), columns (scalar)."""
    out = []
    for dtype, sfx in SUFFIX.items():
        vec = vector_width(dtype)
        out += [CudaFlatBackward(f"logsumexp_backward_flat_{sfx}_vec_x2", dtype, vec=vec, packs=2),
                CudaFlatBackward(f"logsumexp_backward_flat_{sfx}_vec", dtype, vec=vec, packs=1),
                CudaFlatBackward(f"logsumexp_backward_flat_{sfx}", dtype, vec=1, packs=4),
                CudaRowsBackward(f"logsumexp_backward_rows8_{sfx}", dtype, vec=1, threads_per_row=8, unroll=4),
                CudaColumnsBackward(f"logsumexp_backward_columns_{sfx}", dtype, vec=1, unroll=8)]
    return out


class FusedGradient(Candidate):
    """The default (see the module docstring). ``composite(params)`` runs what no fused kernel takes."""

    name = "fused_logsumexp_backward"

    def __init__(self, composite: Callable):
        self.composite = composite
        self.kernels = _fused_kernels()
        self._picked: dict = {}  # cache key -> the kernel that runs it (None: the composite)

    def supports(self, p) -> str | None:
        return None  # the composite runs anything

    def pick(self, p):
        """The fused kernel for ``p``, or None for the composite."""
        key = p.cache_key()
        try:
            return self._picked[key]
        except KeyError:
            pass
        kernel = None
        if p.x.device.type == "cuda":
            kernel = next((k for k in self.kernels if k.dtype == p.x.dtype and k.supports(p) is None), None)
        self._picked[key] = kernel
        return kernel

    def run(self, p):
        kernel = self.pick(p)
        return self.composite(p) if kernel is None else kernel.run(p)

    def prepare(self, p) -> None:
        kernel = self.pick(p)
        if kernel is not None:
            kernel.prepare(p)

    def source_hash(self) -> str:
        # the composite's source, not its bytecode: the same hash under every Python version
        return hash_source(super().source_hash(), inspect.getsource(self.composite),
                           *[k.source_hash() for k in self.kernels])
