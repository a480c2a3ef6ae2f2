"""A Triton elementwise kernel from ``kernels/triton/activations.py`` as a candidate of an op.

Why Triton next to CUDA C and torch: one source covers float32, float16 and bfloat16 and every GPU
Triton targets, with no NVRTC, and it is often as fast as hand-vectorised CUDA C for elementwise
work. Block size and warp count are tuning knobs, so each (block, num_warps) pair is its own
candidate and the tuner times them like any other form.

The params carry the input tensors under the names in ``inputs`` (``("x",)`` forward,
``("dy", "x")`` backward) and ``out``: None (this candidate allocates) or a tensor to write, which
may be one of the inputs (in place; safe, every element is read before it is written).

Triton is imported lazily, on the first ``supports``/``run``, so ``import tunekit`` never imports
it, and tests can set ``TRITON_INTERPRET=1`` (run the kernels on CPU tensors) before it loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from ..tunable.candidate import Candidate, hash_source

__all__ = ["TritonElementwise"]

KERNELS_FILE = Path(__file__).resolve().parent.parent / "kernels" / "triton" / "activations.py"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_TRITON = "needs triton (pip install 'tunekit[triton]')"

_module = None  # tunekit.kernels.triton.activations once loaded
_missing: str | None = None  # why it cannot load, once tried
_source_text: str | None = None


def _load():
    """The kernels module, or None with ``_missing`` set. Tried once per process."""
    global _module, _missing
    if _module is None and _missing is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            _missing = NO_TRITON
        else:  # outside the try: a broken kernels module must raise, not read as "no triton"
            from ..kernels.triton import activations

            _module = activations
    return _module


def _interpreted(kernel) -> bool:
    """True when ``kernel`` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


class TritonElementwise(Candidate):
    def __init__(self, name: str, kernel: str, inputs: tuple[str, ...] = ("x",), *, block: int = 1024,
                 num_warps: int = 4, constexprs: Callable[[object], dict] | None = None):
        if block <= 0 or block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        self.name = name
        self.kernel_name = kernel
        self.inputs = tuple(inputs)
        self.block = block
        self.num_warps = num_warps
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
        if device.type != "cuda" and not (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
            return "needs a CUDA device"
        dtype, shape = first.dtype, first.shape
        if dtype not in DTYPES:
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
            return _missing
        if device.type == "cpu" and not _interpreted(kernel):
            return "Triton kernels were compiled for the GPU (TRITON_INTERPRET=1 set after they loaded)"
        return None

    def _load_kernel(self):
        module = _load()
        if module is not None:
            self._kernel = getattr(module, self.kernel_name)
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
            raise RuntimeError(_missing)
        extra = self.constexprs(p) if self.constexprs is not None else {}
        grid = ((n + self.block - 1) // self.block,)  # triton.cdiv, without touching the module
        device = out.device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):  # Triton launches on the current device's current stream
                kernel[grid](*tensors, out, n, **extra, BLOCK=self.block, num_warps=self.num_warps)
        else:
            kernel[grid](*tensors, out, n, **extra, BLOCK=self.block, num_warps=self.num_warps)
        return out

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernels and this launcher: a change to either re-tunes
            _source_text = KERNELS_FILE.read_text() + Path(__file__).read_text()
        return hash_source(_source_text, self.kernel_name, self.block, self.num_warps)
