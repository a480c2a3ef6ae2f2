"""Which calls of torch's functions tunekit may take over, and the guard that keeps tunekit's own
torch calls away from :func:`tunekit.patch`.

Shared by every op's drop-in modules (``tunekit.nn``) and patch replacements (``tunekit.patch``),
which each op defines next to its public function.
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
- the call comes from inside tunekit: tunekit's candidates and fallbacks call torch's functions
  bound at import (never the patched attributes), but anything else a routed call reaches while
  tunekit runs it (a reference computed with ``torch.logsumexp``, a hook) must get torch's function,
  or it could come back to tunekit. A thread-local flag marks "inside".

Each check is one C call or attribute read: they run on every call of a patched function or a
drop-in module, in C++ once :mod:`tunekit.backends.fast_route` is built (the same checks, about 1 us
less per call on a 2-core CPU host).
"""

from __future__ import annotations

import threading

import torch
import torch.autograd.forward_ad as _forward_ad

from ...backends import fast_route, thread_context

__all__ = ["takes", "python_takes", "transformed", "state", "inside_tunekit", "off_thread", "bind", "plain_dims",
           "TUNEKIT_DTYPES"]

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


#: ``state.inside``: this thread is running a call tunekit took over. Each op's routed function
#: sets it around its call (a small function per op: a generic one, forwarding any arguments, costs
#: more host time per call)
state = _ThreadState()


def takes(x) -> bool:
    """True when tunekit computes ``x``'s call exactly as torch would (module docstring: the rule).

    ``torch.compiler.is_compiling()`` comes first: under torch.compile it is a constant that dynamo
    folds, so the tracer never meets the checks after it (:func:`python_takes`, or the same checks
    in C++ once :mod:`tunekit.backends.fast_route` is built: the first call starts its build).
    """
    return not _is_compiling() and _checks(x)


def python_takes(x) -> bool:
    """The rule's checks after ``is_compiling()``, in Python: what :func:`takes` asks until the C++
    ones are loaded, and where they cannot be built."""
    return (type(x) is _Tensor and x.dtype in TUNEKIT_DTYPES and x.layout is _strided
            and (x.is_cuda or x.is_cpu)
            and not state.inside
            and not _function_mode_enabled() and not _dispatch_stack_depth()
            and not transformed()
            and _jit_tracing_state() is None)


def _install(module) -> None:
    global _checks
    module.configure(_Tensor, state, _forward_ad, _functorch_interpreter)
    _checks = module.takes


def _first_checks(x) -> bool:
    """The first question: starts the C++ checks' build (a worker thread), answers in Python."""
    global _checks
    _checks = python_takes
    fast_route.when_loaded(_install)
    return python_takes(x)


_checks = _first_checks


def transformed() -> bool:
    """Whether forward-mode AD or a torch.func transform (``vmap``, ``grad``, ``jvp``, ...) is active:
    tunekit's kernels compute values only (a dual tensor's tangent would be dropped; a transform's
    wrapped tensors have no data pointer), so every op gives such calls to torch's function."""
    return _forward_ad._current_level >= 0 or _functorch_interpreter() is not None


def inside_tunekit() -> bool:
    """Whether this thread is running a call that tunekit took over (for tests and debugging)."""
    return state.inside


def off_thread(fn):
    """An op's ``off_thread`` (``tunable/session.py``): :func:`thread_context.off_thread` of ``fn`` with the worker
    marked inside tunekit while it runs, so that a patched torch function there runs torch's own. Unmarked, a
    patched F.gelu in the GEMM check's warm-up went into tunekit's gelu op on the worker and took the tuning lock,
    which a caller waiting for that warm-up held: a deadlock."""
    def inside(params):
        was, state.inside = state.inside, True
        try:
            return fn(params)
        finally:
            state.inside = was

    return thread_context.off_thread(inside)


def bind(args, kwargs, names, keyword_only=(), defaults=None):
    """The arguments by name as Python would bind them to ``f(*names, *, *keyword_only)``, or None
    when Python would refuse them (then torch's function runs, and gives its own error)."""
    if len(args) > len(names):
        return None
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in values or (key not in names and key not in keyword_only):
            return None
        values[key] = value
    for key in (*names, *keyword_only):
        if key not in values:
            if not defaults or key not in defaults:
                return None
            values[key] = defaults[key]
    return values


def plain_dims(dim) -> bool:
    """An int or a non-empty tuple / list of ints (not names, not bools, not an empty tuple, whose
    meaning torch has changed between versions)."""
    if type(dim) is int:
        return True
    return type(dim) in (tuple, list) and len(dim) > 0 and all(type(d) is int for d in dim)
