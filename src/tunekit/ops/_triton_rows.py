"""Triton candidates of a row reduction (logsumexp) and its gradient.

:class:`TritonRows` launches a kernel of ``tunekit.kernels.triton.logsumexp`` with one program per
row of the (rows, cols) view given by :func:`~tunekit.ops._rows.rows_and_cols`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from pathlib import Path

import torch

from ._rows import rows_and_cols
from ..tunable.candidate import Candidate, hash_source

__all__ = ["TritonRows"]


class TritonRows(Candidate):
    """A Triton kernel of ``tunekit.kernels.triton.logsumexp`` launched with one program per row.
    ``inputs`` names the params' tensors passed before the output (``x``; ``dy, x, lse`` for the
    gradient); ``output`` names the output field, allocated by ``p.new_outputs()`` when None."""

    MODULE = "tunekit.kernels.triton.logsumexp"

    def __init__(self, name: str, kernel: str, *, inputs=("x",), block: int = 1024, num_warps: int = 4):
        self.name, self.kernel_name, self.inputs = name, kernel, tuple(inputs)
        self.block, self.num_warps = block, num_warps

    @functools.cached_property
    def _kernel(self):
        try:
            import triton  # noqa: F401
        except ImportError:
            return None
        return getattr(importlib.import_module(self.MODULE), self.kernel_name)

    def supports(self, p) -> str | None:
        x = p.x
        if x.device.type != "cuda" and not (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
            return "needs a CUDA device"
        view = rows_and_cols(p)
        if isinstance(view, str):
            return view
        for name in self.inputs:
            t = getattr(p, name)
            if t.dtype != x.dtype or not t.is_contiguous() or t.device != x.device:
                return "needs contiguous tensors of one dtype on one device"
        if self._kernel is None:
            return "needs triton (pip install 'tunekit[triton]')"
        if x.device.type == "cpu" and type(self._kernel).__name__ != "InterpretedFunction":
            return "Triton kernels were compiled for the GPU (TRITON_INTERPRET=1 set after they loaded)"
        return None

    def run(self, p):
        x = p.x
        out = p.out if p.out is not None else p.new_outputs()["out"]
        rows, cols = x.numel() // x.shape[-1], x.shape[-1]
        tensors = [getattr(p, name) for name in self.inputs]
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            self._kernel[(rows,)](*tensors, out, cols, BLOCK=self.block, num_warps=self.num_warps)
        return out

    def source_hash(self) -> str:
        text = (Path(__file__).parent.parent / "kernels" / "triton" / "logsumexp.py").read_text()
        return hash_source(text, Path(__file__).read_text(), self.kernel_name, self.block, self.num_warps)

