"""A decided kernel sequence replayed from C++ (``fast_plan.cpp``: ``KernelPlan``).

Why: a GEMM signature whose tuned choice is a Triton kernel still ran tunekit's general path on every
call (form checks, params, the cache key, the candidate's argument lists, the kept kernel's key over
its 37 arguments): 33.5-48.8 us of host time per call against 19.7 for torch's, H100
(``benchmarks/results/gemm_triton_host-NVIDIA_H100_80GB_HBM3.txt``). So such a challenger had to
save 10 us of device time to be chosen at all. A plan is that call's launches recorded once per
layout (``tunekit/ops/gemm/launch_plans.py``): every argument but the pointers is fixed by the
layout, so a call allocates the result (and a split-K workspace), patches the pointers and calls
the driver's ``cuLaunchKernel``, from C++, as torch's own call allocates and launches.

Built like :mod:`tunekit.backends.fast_call` (the same compiler, flags, cache and
``TUNEKIT_FAST_CALL`` switch: off, or not buildable, and no plan is made: the general path runs,
with the same results), on a worker thread at the first GEMM call, never waited for.
"""

from __future__ import annotations

from . import extension, thread_context
from .fast_call import _flags

__all__ = ["build", "load", "loaded", "unavailable", "unavailable_now", "when_loaded", "SLOT_CONSTANT", "SLOT_OPERAND", "SLOT_RESULT",
           "SLOT_TEMPORARY", "SLOT_SCRATCH"]

#: a slot's kinds (fast_plan.cpp): a constant, an operand's pointer, the result's, a temporary's, the scratch's
SLOT_CONSTANT, SLOT_OPERAND, SLOT_RESULT, SLOT_TEMPORARY, SLOT_SCRATCH = range(5)


_extension = extension.built_at_first_use("fast_plan.cpp", "tunekit_fast_plan", flags=_flags,
                                          thread_name="tunekit-fast-plan-build")
build, unavailable = _extension.build, _extension.unavailable


@extension.once
def _load():
    """The module with the context hook installed (a thread whose first CUDA work is a planned call
    gets the device's primary context bound, and its launch retried), or None, and why."""
    module, reason = _extension._load()
    if module is not None:
        module.set_context_hook(thread_context.launch_hook)
    return module, reason


def load():
    """The built module (``KernelPlan``), or None (see :func:`unavailable`); may build (seconds)."""
    return _load()[0]


def unavailable_now() -> bool:
    """True once loading was tried and failed (off, or not buildable); False while untried or built."""
    return _load.done() and _load()[0] is None


def loaded():
    """The module if it is loaded already, else None: never waits for a build."""
    return _load()[0] if _load.done() else None


#: ``when_loaded(install)``: ``install(module)`` once loaded, built on a worker of its own meanwhile
when_loaded = extension.when_loaded_by(_load, "tunekit-fast-plan-build")
