"""Plans: a call decided for a Triton kernel, replayed from C++ at the host cost of torch's own call.

A routed call (``routes.py``) hands a layout whose GEMMs are all torch's to torch's function from
C++. A layout decided for a Triton candidate still took the general path on every call: 33.5-48.8 us
of host time per call against torch's 19.7 (777 x 1555 x 333, H100,
``benchmarks/results/gemm_triton_host-NVIDIA_H100_80GB_HBM3.txt``), so a challenger had to save
10 us of device time to be chosen. Everything such a call passes its kernels but the pointers
follows from its layout key (sizes, strides, dtype, alignment, settings). So the general path, after
a call of such a layout, records the decided candidate's launches once (nothing launches:
``backends/triton_static.recording``) and keeps them as a ``KernelPlan`` (``backends/fast_plan.cpp``)
in the route table; later calls of the layout allocate the result, patch the pointers and launch,
from C++.

Planned: calls autograd does not record, decided for a CUDA C decode kernel (``cuda_decode.py``: one
launch, recorded by ``triton_static.record_launch``) or a :class:`TritonGemm` of a kind whose every
launch is a kept kernel and whose only buffers are the result, a split-K workspace (the one
temporary, and only with split-K) and Triton's scratch (``matmul``, ``skinny``, ``tma``, ``wrapped``, ``wrapped_static``, ``swapped``; ``padded`` copies operands with
torch first). Not planned
(None: the general path keeps the call, as before): operands that share an address (which slot is
whose would be a guess), params whose tensors are not the call's operands (a fold that copied),
a result that is not the candidate's output viewed, a launch only Triton can make, a device
other than CUDA, and any argument of a type a slot cannot hold.
"""

from __future__ import annotations

import struct

import torch

from .cuda_decode import CudaDecode
from .triton_candidates import TritonGemm
from ...backends import fast_plan, triton_static
from ...backends.device import raw_stream
from ...backends.fast_launch import driver_entry_point
from ...backends.fast_plan import SLOT_CONSTANT, SLOT_OPERAND, SLOT_RESULT, SLOT_SCRATCH, SLOT_TEMPORARY

__all__ = ["PLANNED_KINDS", "LATER", "plannable", "possible", "refusal", "make", "slots_of"]

#: the TritonGemm kinds whose calls can be planned
PLANNED_KINDS = frozenset({"matmul", "skinny", "tma", "wrapped", "wrapped_static", "swapped"})
_MASK = (1 << 64) - 1
#: what :func:`make` returns while the plans' extension is being built (ask again on a later call)
LATER = object()


class _Unplannable(Exception):
    """A recorded argument no slot can hold."""


def plannable(candidate) -> bool:
    """Whether calls decided for ``candidate`` can be planned (its kind's launches are all kept kernels
    and it allocates no buffer but the result, a workspace and scratch; or it is a CUDA C decode kernel,
    one launch into the result)."""
    return isinstance(candidate, TritonGemm) and candidate.kind in PLANNED_KINDS or isinstance(candidate, CudaDecode)


def _temporaries(candidate) -> int:
    """The buffers besides the result a plannable candidate allocates per call: split-K's workspace."""
    config = getattr(candidate, "config", None)  # a Triton configuration (CUDA C decode kernels have none)
    return 1 if config is not None and config.SPLIT_K > 1 else 0


def _slot(value, sources: dict, temporaries: list) -> tuple[int, int]:
    """A recorded argument as a slot; a tensor not among ``sources`` (pointer -> slot) becomes a new
    temporary when it is a whole fresh buffer (its storage's start)."""
    t = type(value)
    if value is None:
        return SLOT_CONSTANT, 0
    if value is triton_static.SCRATCH:
        return SLOT_SCRATCH, 0
    if t is float:  # Triton passes Python floats as fp32 parameters
        return SLOT_CONSTANT, struct.unpack("<I", struct.pack("<f", value))[0]
    if t is int or t is bool:
        return SLOT_CONSTANT, int(value) & _MASK
    if isinstance(value, torch.Tensor):
        pointer = value.data_ptr()
        if pointer not in sources:
            storage = value.untyped_storage()
            if storage.data_ptr() != pointer:
                raise _Unplannable("a view into a buffer that is neither an operand nor the result")
            sources[pointer] = (SLOT_TEMPORARY, len(temporaries))
            temporaries.append(storage.nbytes())
        return sources[pointer]
    raise _Unplannable(f"an argument of type {t.__name__}")


def slots_of(launches: list, operands: tuple, out: torch.Tensor) -> tuple[tuple, tuple] | None:
    """(temporaries, launch tuples) of ``KernelPlan`` for recorded ``launches`` whose tensors are the
    ``operands`` (by address), ``out`` (the result) or fresh buffers; None when one cannot be a slot."""
    sources = {t.data_ptr(): (SLOT_OPERAND, i) for i, t in enumerate(operands) if t is not None}
    sources[out.data_ptr()] = (SLOT_RESULT, 0)
    temporaries: list[int] = []
    made = []
    try:
        for function, grid, block, shared, scratch, values in launches:
            slots = tuple(_slot(v, sources, temporaries) for v in values)
            made.append((function, *grid, block, shared, scratch, slots))
    except _Unplannable:
        return None
    return tuple(temporaries), tuple(made)


_asked = []


def _start_build() -> None:
    """Build the plans' extension on its worker, asked once (a later call's :func:`make` finds it loaded)."""
    if not _asked:
        _asked.append(True)
        fast_plan.when_loaded(lambda module: None)


def possible(candidate=None) -> bool:
    """Whether calls decided for ``candidate`` (None: a Triton one) can be planned here: the plans' extension
    not refused (built, or building) and, for a Triton kernel, kept Triton launches in use. Where not, the
    decided call takes the general path."""
    kept_launches = isinstance(candidate, CudaDecode) or triton_static.enabled()
    return kept_launches and not fast_plan.unavailable_now()


def _distinct(operands: tuple) -> list[int] | None:
    pointers = [t.data_ptr() for t in operands if t is not None]
    return pointers if len(set(pointers)) == len(pointers) else None


def refusal(candidate, params, operands: tuple, result: torch.Tensor) -> str | None:
    """Why calls laid out as ``operands`` decided for ``candidate`` on ``params`` cannot be planned, from
    what is known before recording (None: they can, if its launches record)."""
    if not plannable(candidate):
        return "not a kind whose launches are all kept kernels"
    if not result.is_contiguous():
        return "a result that is not contiguous"
    if params.out is not None:
        return "an out= given"
    pointers = _distinct(operands)
    if pointers is None:
        return "operands that share an address (which slot is whose would be a guess)"
    if any(t is not None and t.data_ptr() not in pointers for t in (params.a, params.b, getattr(params, "c", None))):
        return "params whose tensors are not the call's operands (a fold that copied)"
    if not result.is_cuda:
        return "not a CUDA result"
    if isinstance(candidate, TritonGemm) and not triton_static.enabled():
        return "no kept Triton launches here (kept launches off)"
    return None


def _record(candidate, params, operands: tuple, result: torch.Tensor) -> tuple | None:
    """(temporaries, launch tuples) of ``candidate``'s call on ``params``, recorded, not launched; None
    where a launch only Triton makes, an argument no slot holds, an output that is not the result's
    buffer, or a temporary it should not have (only split-K has one: its workspace)."""
    try:
        with triton_static.recording() as launches:
            out = candidate.run(params)
    except triton_static.NotStatic:
        return None
    if out.numel() != result.numel() or not out.is_contiguous() or out.data_ptr() in _distinct(operands):
        return None
    made = slots_of(launches, operands, out)
    return made if made is not None and len(made[0]) == _temporaries(candidate) else None


def make(candidate, params, operands: tuple, result: torch.Tensor):
    """A plan for calls laid out as ``operands`` (positional, as the form's torch function takes them)
    decided for ``candidate`` on ``params`` (the call's GEMM), whose general-path result was
    ``result``; None where it cannot be made (:func:`refusal`, :func:`_record`); :data:`LATER` while
    the extension is being built (on its worker: no call waits for it)."""
    if refusal(candidate, params, operands, result) is not None:
        return None
    native = fast_plan.loaded()
    if native is None:
        if fast_plan.unavailable_now():
            return None
        _start_build()
        return LATER
    made = _record(candidate, params, operands, result)
    if made is None:
        return None
    temporaries, launch_tuples = made
    return native.KernelPlan(driver_entry_point(), len(operands), result.get_device(), raw_stream,
                             tuple(result.shape), tuple(result.stride()), temporaries, launch_tuples)
