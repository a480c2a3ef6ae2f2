"""The cached call's fast path: ``op.fast_call(x)`` runs the choice's *runner* for ``x``, or returns
None so the public function takes its general path.

Why: on a cached call of a small op host time is the whole cost, and issue 3's bar is torch's own
``F.silu`` (~5 us per call on an H200 host). The general path builds a params object, its cache
key and calls the candidate's ``run``: ~1 us of Python on top of allocation and launch. Here:

- a *runner* is a function of the input tensor alone with everything else bound when the choice
  was made (for a CUDA C kernel: its address, grid, the launch entry point; see
  ``Candidate.fast_runner``). ``TunableOp`` caches it next to the choice, under the same settings
  and cache key, for params in fast form (``params.fast_form()``: no ``out``, contiguous ``x``),
  and drops it with the choice.
- ``fast_call(x[, extra])``: for ``x`` exactly a ``torch.Tensor``, not requiring grad,
  contiguous, the key ``(x.dtype, x.numel(), x.data_ptr() & 15, x.device)`` (that is
  ``UnaryParams.cache_key()``; paired with ``extra``, as gelu's ``approximate``: ``(key, extra)``),
  the current settings, enabled, their runners, the runner for the key, ``runner(x)``.

The steps run in C++ (``FastCall`` of ``tunekit/backends/fast_call.cpp``, built at first use, which
reads the tensor's fields from the ``at::Tensor``) when the extension is available. Measured on an
H200 host (benchmarks/dispatch_overhead.py): ``fast_call(x)`` costs 0.15 us more than its runner
alone; with an earlier C version, which read the same fields through torch's Python accessors, a
cached call stayed 0.16-0.36 us above ``F.silu``, with this one it is 0.69 us below. :func:`python_fast_call` is the same in Python, used when the
extension cannot be built or ``TUNEKIT_FAST_CALL=0``; the tests run both.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import context

__all__ = ["make_fast_call", "python_fast_call", "native_fast_call"]


def python_fast_call(runners: dict) -> Callable:
    """``fast_call`` over ``runners`` (``{settings.cache_id: {cache key: runner}}``) in Python."""
    get_settings = context._current.get
    tensor = torch.Tensor

    def fast_call(x, *extra):
        if type(x) is not tensor or x.requires_grad or not x.is_contiguous():
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
        return None if runner is None else runner(x)

    return fast_call


def native_fast_call(runners: dict) -> Callable | None:
    """``fast_call`` over ``runners`` in C++, or None when the extension is unavailable."""
    from ..backends import fast_call

    module = fast_call.load()
    if module is None:
        return None
    return module.FastCall(runners, context._current, context, torch.Tensor)


def make_fast_call(runners: dict) -> Callable:
    """The C++ ``fast_call`` when it can be had, else the Python one."""
    return native_fast_call(runners) or python_fast_call(runners)
