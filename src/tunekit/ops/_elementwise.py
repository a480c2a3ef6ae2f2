"""What the elementwise ops (silu, gelu) share: their params and their Triton candidate lists.

- :class:`UnaryParams`: a forward call, ``x`` in, ``out`` written (None: allocate; ``x`` itself:
  in place).
- :class:`GradParams`: a backward call, ``dy`` and ``x`` in, ``out`` (dx) written.

Both key contiguous tensors by element count, not shape: every candidate but the default sees a
flat array, so (4096, 4096) and (16777216,) share one tuning result.
"""

from __future__ import annotations

from typing import Any

import torch

from ._triton_elementwise import TritonElementwise
from ..tunable.params import OpParams, tensor_key, tensor_signature

__all__ = ["UnaryParams", "GradParams", "TRITON_CONFIGS", "triton_candidates"]

#: (BLOCK, num_warps) of the Triton candidates, each its own candidate
TRITON_CONFIGS = [(1024, 4), (2048, 8), (4096, 8)]


def _layout_key(t: torch.Tensor):
    if t.is_contiguous():
        return (t.dtype, t.numel(), t.data_ptr() & 15, t.device)
    return (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.device)


def _destination(out, inputs) -> str:
    if out is None:
        return "new"
    for name, t in inputs:
        if out is t:
            return f"inplace:{name}"
    return tensor_signature(out, shape_matters=False)


class UnaryParams(OpParams):
    """``x`` in, ``out`` written. Subclasses set ``op_name`` (and may add arguments)."""

    inputs = ("x",)
    outputs = ("out",)
    __slots__ = ("x", "out")

    def __init__(self, x: torch.Tensor, out: torch.Tensor | None = None):
        self.x = x
        self.out = out

    def cache_key(self):
        x, out = self.x, self.out
        if out is None and x.is_contiguous():  # the common call, kept short: this runs on every call
            return (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
        tail = None if out is None else "inplace" if out is x else tensor_key(out)
        if x.is_contiguous():  # inlined _layout_key
            return (x.dtype, x.numel(), x.data_ptr() & 15, x.device, tail)
        return (x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.device, tail)

    def fast_form(self) -> bool:
        # the public functions' fast path: ``out`` None, ``x`` contiguous, whose key they build inline
        # as (x.dtype, x.numel(), x.data_ptr() & 15, x.device), the first branch of cache_key above
        return self.out is None and self.x.is_contiguous()

    def signature(self) -> str:
        x = self.x
        dest = _destination(self.out, [("x", x)]).replace("inplace:x", "inplace")
        return f"x={tensor_signature(x, shape_matters=False)} out={dest} {x.device.type}"

    def new_outputs(self):
        return {"out": torch.empty_like(self.x)}


class GradParams(OpParams):
    """``dy`` (the incoming gradient) and ``x`` (the forward input) in, ``out`` (dx) written."""

    inputs = ("dy", "x")
    outputs = ("out",)
    __slots__ = ("dy", "x", "out")

    def __init__(self, dy: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None):
        self.dy = dy
        self.x = x
        self.out = out

    def cache_key(self):
        out = self.out
        if out is None or out is self.dy or out is self.x:
            tail = None if out is None else "inplace:dy" if out is self.dy else "inplace:x"
        else:
            tail = tensor_key(out)
        return (_layout_key(self.dy), _layout_key(self.x), tail)

    def signature(self) -> str:
        dy, x = self.dy, self.x
        dest = _destination(self.out, [("dy", dy), ("x", x)])
        return (f"dy={tensor_signature(dy, shape_matters=False)} x={tensor_signature(x, shape_matters=False)} "
                f"out={dest} {x.device.type}")

    def new_outputs(self):
        return {"out": torch.empty_like(self.x)}


def with_arguments(spec: dict[str, Any], **arguments) -> dict[str, Any]:
    """``spec()`` plus the op's non-tensor arguments (needed to rebuild a call offline)."""
    return {**spec, "arguments": arguments}


def triton_candidates(prefix: str, kernel: str, inputs: tuple[str, ...], constexprs=None) -> list[TritonElementwise]:
    """``<prefix>_triton_b<BLOCK>_w<warps>`` for every entry of :data:`TRITON_CONFIGS`."""
    return [TritonElementwise(f"{prefix}_triton_b{block}_w{warps}", kernel, inputs, block=block, num_warps=warps,
                              constexprs=constexprs)
            for block, warps in TRITON_CONFIGS]
