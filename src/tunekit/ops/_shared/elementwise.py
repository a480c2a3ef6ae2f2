"""What the elementwise ops (silu, gelu) share: their params, their candidate lists, and the
tunable op they build on.

- :class:`UnaryParams`: a forward call, ``x`` in, ``out`` written (None: allocate; ``x`` itself:
  in place).
- :class:`GradParams`: a backward call, ``dy`` and ``x`` in, ``out`` (dx) written.

Both key contiguous tensors by element count, not shape: every candidate but the default sees a
flat array, so (4096, 4096) and (16777216,) share one tuning result.
"""

from __future__ import annotations

import functools

import torch

from . import routing
from .cuda_elementwise import cuda_candidates
from .grad_call import recorder_slot
from .triton_elementwise import TritonElementwise
from ...backends.fast_call import make_fast_call
from ...tunable.config import Config
from ...tunable.params import OpParams, tensor_key, tensor_signature
from ...tunable.tunable_op import TunableOp

__all__ = ["UnaryParams", "GradParams", "TRITON_CONFIGS", "triton_candidates", "cuda_candidates", "elementwise_op"]

#: the Triton candidates' configurations, each its own candidate
TRITON_CONFIGS = [Config(BLOCK=1024, num_warps=4), Config(BLOCK=2048, num_warps=8), Config(BLOCK=4096, num_warps=8)]


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


def triton_candidates(prefix: str, kernel: str, inputs: tuple[str, ...], constexprs=None) -> list[TritonElementwise]:
    """``<prefix>_triton_b<BLOCK>_w<warps>`` for every configuration of :data:`TRITON_CONFIGS`."""
    return [TritonElementwise(config.name(f"{prefix}_triton", BLOCK="b", num_warps="w"), kernel, inputs,
                              config=config, constexprs=constexprs)
            for config in TRITON_CONFIGS]


def elementwise_op(name: str, params_type: type[OpParams], grad_kind: str | None = None, **options) -> TunableOp:
    """A tunable op whose cached calls of a contiguous tensor take the fast path in C++ where the
    extension builds (:func:`tunekit.backends.fast_call.make_fast_call`); with ``grad_kind`` ("silu",
    "gelu"), tensors requiring grad too, once torch's node can be recorded (``grad_call.py``)."""
    fast_calls = make_fast_call if grad_kind is None else functools.partial(make_fast_call,
                                                                            recorder=recorder_slot(grad_kind))
    op = TunableOp(name, params_type, fast_calls=fast_calls, **options)
    op.off_thread = routing.off_thread  # the screen and the check's warm-up on workers online: no call stalls for them
    return op
