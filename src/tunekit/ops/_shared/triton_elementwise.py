"""A Triton elementwise kernel from ``kernels/triton/activations.py`` as a candidate of an op.

Why Triton next to CUDA C and torch: one source covers float32, float16 and bfloat16 and every GPU
Triton targets, with no NVRTC, and it is often as fast as hand-vectorised CUDA C for elementwise
work. Block size and warp count are tuning knobs, so each configuration (a
:class:`~tunekit.tunable.config.Config` of ``BLOCK`` and ``num_warps``) is its own candidate and the
tuner times them like any other form.

The params carry the input tensors under the names in ``inputs`` (``("x",)`` forward,
``("dy", "x")`` backward) and ``out``: None (this candidate allocates) or a tensor to write, which
may be one of the inputs (in place; safe, every element is read before it is written). Triton is
imported at the first ``supports``/``run`` (:mod:`tunekit.backends.triton`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ...backends import triton as triton_backend
from ...tunable.candidate import Candidate, hash_source
from ...tunable.config import Config
from ...tunable.dtypes import KERNEL_DTYPES

__all__ = ["TritonElementwise", "KERNELS_FILE"]

KERNELS_MODULE = "activations"
KERNELS_FILE = Path(__file__).resolve().parents[2] / "kernels" / "triton" / "activations.py"

_source_text: str | None = None


class TritonElementwise(Candidate):
    """``kernel(*inputs, out, n, **constexprs, BLOCK=config.BLOCK, num_warps=config.num_warps)``."""

    def __init__(self, name: str, kernel: str, inputs: tuple[str, ...] = ("x",), *,
                 config: Config = Config(BLOCK=1024, num_warps=4),
                 constexprs: Callable[[object], dict] | None = None):
        block = config.BLOCK
        if block <= 0 or block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        self.name = name
        self.kernel_name = kernel
        self.inputs = tuple(inputs)
        self.config = config
        self.block, self.num_warps = block, config.num_warps
        self.constexprs = constexprs
        self._kernel = None

    def _tensors(self, p):
        return [getattr(p, name) for name in self.inputs]

    def supports(self, p) -> str | None:
        tensors = self._tensors(p)
        out = p.out
        if out is not None:
            tensors.append(out)
        first = tensors[0]
        device = first.device
        why = triton_backend.device_problem(device)
        if why:
            return why
        dtype, shape = first.dtype, first.shape
        if dtype not in KERNEL_DTYPES:
            return "float32, float16 or bfloat16 only"
        for t in tensors:
            if t.dtype != dtype:
                return "needs one dtype for all tensors"
            if t.device != device:
                return "needs all tensors on one device"
            if t.shape != shape:
                return "needs tensors of one shape"
            if not t.is_contiguous():
                return "needs contiguous tensors"
        kernel = self._kernel or self._load_kernel()
        if kernel is None:
            return triton_backend.NO_TRITON
        return triton_backend.device_problem(device, kernel)

    def _load_kernel(self):
        self._kernel = triton_backend.kernel(KERNELS_MODULE, self.kernel_name)
        return self._kernel

    def run(self, p):
        tensors = self._tensors(p)
        out = p.out
        if out is None:
            out = torch.empty_like(tensors[0])
        n = out.numel()
        if n == 0:
            return out
        kernel = self._kernel or self._load_kernel()
        if kernel is None:
            raise RuntimeError(triton_backend.NO_TRITON)
        extra = self.constexprs(p) if self.constexprs is not None else {}
        grid = ((n + self.block - 1) // self.block,)  # triton.cdiv, without touching the module
        with triton_backend.on_device(out.device):
            triton_backend.launch(kernel, grid, *tensors, out, n, **extra, BLOCK=self.block,
                                  num_warps=self.num_warps)
        return out

    def prepare(self, p) -> None:
        """Compile this configuration's kernel for ``p`` without launching it (tuning calls it on a
        worker thread, so the first real launch finds it compiled)."""
        if p.x.device.type == "cuda":
            with triton_backend.warming(p.x.device):
                self.run(p)

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernels and this launcher: a change to either re-tunes
            _source_text = KERNELS_FILE.read_text() + Path(__file__).read_text()
        return hash_source(_source_text, self.kernel_name, self.block, self.num_warps)
