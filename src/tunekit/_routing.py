"""Which calls of torch's silu / gelu / logsumexp tunekit may take over, and the guard that keeps
tunekit's own torch calls away from :func:`tunekit.patch`.

Shared by :mod:`tunekit.nn` (the modules) and :mod:`tunekit.patch` (torch's functions replaced).
The rule: a call goes to tunekit only where tunekit computes exactly what torch would, autograd
included; everything else runs the torch function it came from, unchanged, so a result is never
wrong and torch's own errors stay torch's. :func:`takes` says no when

- the input is not a plain ``torch.Tensor`` (``type(x) is torch.Tensor``): subclasses
  (``nn.Parameter``, FakeTensor, DTensor, ...) and ``__torch_function__`` types keep torch's dispatch
  to their overrides;
- its dtype is not float16 / bfloat16 / float32 / float64 (integers, complex, float8: torch raises
  or promotes as it does), its layout is not strided (sparse), or it is not on the CPU or a CUDA
  device (meta, mps, xla, ...);
- torch.compile / torch.export is tracing (the graph gets torch's op, which the compiler can fuse),
  TorchScript is tracing (``torch.jit.trace`` records only ops that go through the dispatcher, and
  tunekit's CUDA C / Triton kernels do not), a ``__torch_function__`` or ``__torch_dispatch__`` mode
  is active (a mode such as ``with torch.device(...)`` or a FLOP counter must see torch's op),
  a functorch transform runs (``vmap`` / ``grad`` wrap tensors that keep type ``torch.Tensor``),
  or forward-mode AD is on (tunekit's autograd Functions have no JVP; a dual tensor's tangent
  would be dropped);
- the call comes from inside tunekit: tunekit's default candidates and fallbacks call
  ``torch.logsumexp`` and ``F.silu(..., inplace=True)``; while those are patched, such a call must
  reach torch, or it would come back to tunekit forever. A thread-local flag marks "inside".

These checks cost about 0.7 us per call on the host (each is one C call or attribute read).
"""

from __future__ import annotations

import threading

import torch
import torch.autograd.forward_ad as _forward_ad

from .ops.gelu import gelu as _tunekit_gelu
from .ops.logsumexp import logsumexp as _tunekit_logsumexp
from .ops.silu import silu as _tunekit_silu

__all__ = ["takes", "run_silu", "run_gelu", "run_logsumexp", "inside_tunekit", "TUNEKIT_DTYPES"]

#: dtypes for which tunekit's ops give torch's results (float64 runs torch's kernel inside tunekit)
TUNEKIT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

_Tensor = torch.Tensor
_strided = torch.strided
_is_compiling = torch.compiler.is_compiling
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_stack_depth = torch._C._len_torch_dispatch_stack
_functorch_interpreter = torch._C._functorch.peek_interpreter_stack
_jit_tracing_state = torch._C._get_tracing_state


class _ThreadState(threading.local):
    #: a class default, so that every thread reads False without a failed lookup first
    inside = False


_state = _ThreadState()


def takes(x) -> bool:
    """True when tunekit computes ``x``'s call exactly as torch would (module docstring: the rule).

    ``torch.compiler.is_compiling()`` comes first: under torch.compile it is a constant that dynamo
    folds, so the tracer never meets the thread-local or mode checks after it.
    """
    return (not _is_compiling()
            and type(x) is _Tensor and x.dtype in TUNEKIT_DTYPES and x.layout is _strided
            and (x.is_cuda or x.is_cpu)
            and not _state.inside
            and not _function_mode_enabled() and not _dispatch_stack_depth()
            and _forward_ad._current_level < 0 and _functorch_interpreter() is None
            and _jit_tracing_state() is None)


def run_silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """:func:`tunekit.silu` with the "inside tunekit" flag set, so that the torch functions tunekit
    calls reach torch even while they are patched. Only called after :func:`takes` said yes, which
    it never does inside, so the flag is False on entry and goes back to False (the same for the
    two below; three small functions rather than one generic, which cost 0.3 us more per call)."""
    state = _state
    state.inside = True
    try:
        return _tunekit_silu(x, inplace=True) if inplace else _tunekit_silu(x)
    finally:
        state.inside = False


def run_gelu(x: torch.Tensor, approximate: str, inplace: bool = False) -> torch.Tensor:
    state = _state
    state.inside = True
    try:
        return _tunekit_gelu(x, approximate, inplace=True) if inplace else _tunekit_gelu(x, approximate)
    finally:
        state.inside = False


def run_logsumexp(x: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    state = _state
    state.inside = True
    try:
        return _tunekit_logsumexp(x, dim, keepdim)
    finally:
        state.inside = False


def inside_tunekit() -> bool:
    """Whether this thread is running a call that tunekit took over (for tests and debugging)."""
    return _state.inside
