"""Params: an op's inputs and outputs, the signature that names their performance behaviour, and the
proxies that let tuning run candidates without touching the user's buffers.

Each op subclasses :class:`OpParams` (see ``tunekit/ops/silu.py``). It lists its tensor fields in
``inputs`` and ``outputs`` and gives:

- ``cache_key()``: a cheap hashable tuple, used on every call. It must separate everything the
  signature separates (it may separate more: two keys can share one signature).
- ``signature()``: the readable string results are stored under: op-relevant shape, dtype,
  strides/contiguity, the 16-byte alignment class of each pointer, device kind.
- ``new_outputs()``: the outputs the op allocates when the user passes none.

Tuning never runs a candidate on the user's tensors when that candidate would write them (the
PreTuning/PostTuning pitfall of ONNX Runtime's TunableOp): :func:`make_trial` gives every candidate fresh outputs filled
with NaN, and copies of every buffer that is both read and written, laid out exactly like the
originals (shape, strides, alignment class) so they run the same code path at the same speed.
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar, Hashable

import torch

from .dtypes import short_name

__all__ = ["OpParams", "make_trial", "overlaps", "empty_exact", "clone_exact", "tensor_signature", "tensor_key",
           "with_arguments"]



class OpParams:
    """Base class of an op's params. Subclasses set ``op_name``, ``inputs``, ``outputs``."""

    op_name: ClassVar[str] = ""
    #: tensor fields only read
    inputs: ClassVar[tuple[str, ...]] = ()
    #: tensor fields written (None on the user path means "allocate")
    outputs: ClassVar[tuple[str, ...]] = ()

    def cache_key(self) -> Hashable:  # pragma: no cover - abstract
        raise NotImplementedError

    def signature(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def new_outputs(self) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def fast_form(self) -> bool:
        """Whether the public function's fast path reaches these params by ``cache_key()`` alone
        (see ``tunable_op``): then a candidate's runner may be cached for that key. No by default."""
        return False

    @property
    def device(self) -> torch.device:
        return getattr(self, self.inputs[0]).device

    def bytes_moved(self) -> int:
        """Fewest bytes the op must move through memory: each input read once, each output written once."""
        total = 0
        for name in self.inputs + self.outputs:
            t = getattr(self, name)
            if t is None and name in self.outputs:
                t = self.new_outputs()[name]
            total += t.numel() * t.element_size()
        return total

    def spec(self) -> dict[str, Any]:
        """A JSON-able description from which the inputs could be rebuilt (for offline tuning).

        An output that *is* one of the inputs (in place) also names it (``"same_as": "x"``): the
        signature says ``inplace``, and a rebuild must alias the two again (``tunekit.offline``)."""
        out = {"op": self.op_name}
        for name in self.inputs + self.outputs:
            t = getattr(self, name)
            out[name] = None if t is None else {
                "shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch."),
                "align": t.data_ptr() % 16, "device": t.device.type,
            }
            same = next((i for i in self.inputs if getattr(self, i) is t), None) if name in self.outputs else None
            if t is not None and same is not None:
                out[name]["same_as"] = same
        return out

    def replace(self, **fields) -> "OpParams":
        """A shallow copy with some fields swapped."""
        new = copy.copy(self)
        for name, value in fields.items():
            setattr(new, name, value)
        return new

    def mutated(self) -> tuple[str, ...]:
        """Inputs that are also written: an output field that overlaps an input's memory."""
        names = []
        for i in self.inputs:
            a = getattr(self, i)
            for o in self.outputs:
                b = getattr(self, o)
                if b is not None and overlaps(a, b):
                    names.append(i)
                    break
        return tuple(names)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {name: getattr(self, name) for name in self.inputs + self.outputs}

    def __repr__(self) -> str:
        try:
            return f"<{type(self).__name__} {self.signature()}>"
        except Exception:  # a repr must never raise
            return f"<{type(self).__name__}>"


def with_arguments(spec: dict[str, Any], **arguments) -> dict[str, Any]:
    """``spec()`` plus an op's non-tensor arguments, which rebuilding the call offline needs
    (``tunekit.offline.rebuild`` passes them to the params' constructor by name)."""
    return {**spec, "arguments": arguments}


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of ``a`` and ``b`` intersect."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, a1 = _byte_span(a)
    b0, b1 = _byte_span(b)
    return a0 < b1 and b0 < a1


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + _span_elements(t) * t.element_size()


def _span_elements(t: torch.Tensor) -> int:
    """Elements between the first and the last one addressed, inclusive (strides are never negative)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def tensor_key(t: torch.Tensor | None) -> Hashable:
    """The fast per-call identity of a tensor's layout (goes into ``cache_key``)."""
    if t is None:
        return None
    return (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.device)


def tensor_signature(t: torch.Tensor, *, shape_matters: bool = True) -> str:
    """Readable layout: ``f16[4096,4096]`` or ``f16[n=16777216]``, plus strides when not contiguous, ``@align``.

    ``shape_matters=False`` (elementwise ops) writes only the element count for contiguous tensors,
    since their candidates see a flat array.
    """
    dtype = short_name(t.dtype)
    contiguous = t.is_contiguous()
    if contiguous and not shape_matters:
        dims = f"n={t.numel()}"
    else:
        dims = ",".join(str(s) for s in t.shape)
    layout = "" if contiguous else "/s" + ",".join(str(s) for s in t.stride())
    return f"{dtype}[{dims}]{layout}@{t.data_ptr() % 16}"


def empty_exact(t: torch.Tensor) -> torch.Tensor:
    """Uninitialised memory laid out exactly like ``t``: shape, strides, dtype, device, and the pointer's
    offset modulo 16 bytes (so vectorised candidates see the same alignment as on the real tensor)."""
    span = _span_elements(t)
    if span == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    size = t.element_size()
    pad = max(1, 16 // size)
    base = torch.empty(span + pad, dtype=t.dtype, device=t.device)
    want = t.data_ptr() % 16
    offset = ((want - base.data_ptr() % 16) % 16) // size if want % size == 0 else 0
    return base.as_strided(t.shape, t.stride(), offset)


def clone_exact(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (every element of its memory span, gaps too) laid out as :func:`empty_exact`."""
    new = empty_exact(t)
    span = _span_elements(t)
    if span:
        src = t.as_strided((span,), (1,), t.storage_offset())
        dst = new.as_strided((span,), (1,), new.storage_offset())
        dst.copy_(src)
    return new


def _poison(t: torch.Tensor) -> torch.Tensor:
    """Fill the whole memory span with NaN (or a sentinel for integer dtypes) so unwritten elements show."""
    span = _span_elements(t)
    if span:
        flat = t.as_strided((span,), (1,), t.storage_offset())
        if t.dtype.is_floating_point or t.dtype.is_complex:
            flat.fill_(math.nan)
        elif t.dtype == torch.bool:
            flat.fill_(True)
        else:
            flat.fill_(torch.iinfo(t.dtype).max)
    return t


def make_trial(params: OpParams, *, copy_inputs: bool = False) -> OpParams:
    """Params for running one candidate during tuning, leaving the user's buffers alone.

    Outputs are fresh and filled with NaN (laid out like the user's ``out=`` when given, otherwise as
    the op would allocate). Inputs that an output overlaps (in-place ops) are copied, and the output
    keeps pointing at the copy. Other inputs are shared read-only unless ``copy_inputs`` (used to build
    several input sets so timed runs find them cold in L2).
    """
    fields: dict[str, torch.Tensor] = {}
    mutated = set(params.mutated())
    for name in params.inputs:
        t = getattr(params, name)
        fields[name] = clone_exact(t) if (copy_inputs or name in mutated) else t
    allocated = None
    for name in params.outputs:
        t = getattr(params, name)
        if t is None:
            if allocated is None:
                allocated = params.new_outputs()
            fields[name] = _poison(allocated[name])
            continue
        alias = next((i for i in params.inputs if i in mutated and getattr(params, i) is t), None)
        if alias is None:
            alias = next((i for i in mutated if _same_layout(getattr(params, i), t)), None)
        fields[name] = fields[alias] if alias is not None else _poison(empty_exact(t))
    return params.replace(**fields)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def output_tensors(result) -> tuple[torch.Tensor, ...]:
    """The tensors of a candidate's result (a tensor or a tuple/list of them)."""
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, (tuple, list)):
        return tuple(result)
    raise TypeError(f"a candidate returned {type(result).__name__}, expected a tensor or a tuple of tensors")


def trial_outputs(params: OpParams) -> tuple[torch.Tensor, ...]:
    return tuple(getattr(params, name) for name in params.outputs)
