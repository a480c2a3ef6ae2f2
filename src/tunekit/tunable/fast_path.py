"""The cached call's fast path: ``op.fast_call(x)`` runs the choice's *runner* for ``x``, or returns
None so the public function takes its general path.

Why: on a cached call of a small op host time is the whole cost, and the bar is torch's own
``F.silu``. The general path builds a params object, its cache key and calls the candidate's
``run``: about a microsecond of Python on top of allocation and launch. Here:

- a *runner* is a function of the input tensor alone with everything else bound when the choice
  was made (for a CUDA C kernel: its address, grid, the launch entry point; see
  ``Candidate.fast_runner``). ``TunableOp`` caches it next to the choice, under the same settings
  and cache key, for params in fast form (``params.fast_form()``: no ``out``, contiguous ``x``),
  and drops it with the choice.
- ``fast_call(x[, extra])``: for ``x`` exactly a ``torch.Tensor``, contiguous, carrying no forward-mode
  tangent (a runner's kernel would drop it) and not a torch.func transform's wrapped tensor, the key
  ``(x.dtype, x.numel(), x.data_ptr() & 15, x.device)`` (that is ``UnaryParams.cache_key()``; paired with
  ``extra``, as gelu's ``approximate``: ``(key, extra)``),
  the current settings, enabled, their runners, the runner for the key, ``runner(x)``; for ``x``
  requiring grad only when the runner is one of the op's ``differentiable`` ones: torch's own
  function, whose result gets torch's autograd node as ``F.silu``'s does (the C++ autograd call,
  ``ops/_shared/grad_call.py``, added 2-4 us to that on the CPU host: a Python forward callback
  and a node built by hand).

:func:`python_fast_call` is these steps in Python, the runtime's own. The same steps in C++
(``FastCall`` of ``tunekit/backends/fast_call.cpp``, which reads the tensor's fields from the
``at::Tensor``) are what the ops inject where the extension builds
(:func:`tunekit.backends.fast_call.make_fast_call`); ``benchmarks/suites/dispatch_overhead.py`` measures
both against torch's call.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.autograd.forward_ad as _forward_ad

from . import context

#: a torch.func transform's innermost level, or None (its wrapped tensors have no data pointer)
_functorch = torch._C._functorch.peek_interpreter_stack

__all__ = ["python_fast_call", "install_python_fast_call"]


def python_fast_call(runners: dict, differentiable: frozenset = frozenset()) -> Callable:
    """``fast_call`` over ``runners`` (``{settings.cache_id: {cache key: runner}}``) in Python;
    ``differentiable``: the runners that may take a tensor requiring grad."""
    get_settings = context._current.get
    tensor = torch.Tensor

    def fast_call(x, *extra):
        if type(x) is not tensor or not x.is_contiguous():
            return None
        if _forward_ad._current_level >= 0 or _functorch() is not None:  # tangents, transforms: torch's
            return None
        s = get_settings() or context._defaults
        if not s.enabled:
            return None
        table = runners.get(s.cache_id)
        if table is None:
            return None
        key = (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
        try:
            runner = table.get((key, *extra) if extra else key)
        except TypeError:  # an unhashable argument: the general path gives the clear error
            return None
        if runner is None or (x.requires_grad and not _named(runner, differentiable)):
            return None
        return runner(x)

    return fast_call


def _named(runner, differentiable) -> bool:
    try:
        return runner in differentiable
    except TypeError:  # an unhashable runner: not named (the C++ fast call's answer too)
        return False


def install_python_fast_call(runners: dict, install: Callable[[Callable], None],
                             differentiable: frozenset = frozenset()) -> None:
    """A TunableOp's default ``fast_calls``: ``install`` the Python fast call over ``runners``."""
    install(python_fast_call(runners, differentiable))
