"""A device's primary context made current in the calling thread, for driver calls made there.

The driver API (module loads, ``cuLaunchKernel``) works in the calling thread's current context. A
thread whose first CUDA work is a tunekit launch has none: torch's runtime calls bind the primary
context lazily, and torch skips ``cudaSetDevice`` when the device asked for is already the thread's
current one (device 0 in a fresh thread), so ``with torch.cuda.device(0)`` binds nothing there. The
launch then fails with CUDA_ERROR_INVALID_CONTEXT (201).

Launches pay nothing for this on the common path: the C and C++ launchers call :func:`launch_hook`
only after the driver refused a launch, and retry once when it bound a context (no context was
current). Module loads (a worker thread may compile and load kernels) call :func:`bind` first.

Module loads and a preparation's allocations also run inside :func:`capture_relaxed`: tunekit's
worker threads compile, load and allocate whenever a tuning session asks, a user's capture running
or not, and while any thread captures a CUDA graph in the default (global) mode the driver may refuse
such calls and invalidate the capture. On the H100 an allocation from a worker did
(``benchmarks/experiments/capture_module_load.py``); module loads did not, but the API names them
among the calls a capture may forbid, so they are guarded too.

:func:`off_thread` makes a function of an op's params (a tuning session's support screen, the numerical check's
warm-up: imports, kernel loads, launches, allocations, syncs) safe on a worker thread: RELAXED, and on a stream
tunekit created for the thread (``tunable/isolation.py``), never one of torch's pooled streams (one of those may
be the user's capture stream). Run on
a worker plainly (the thread's default stream, the default capture mode), its launches and syncs broke a CUDA graph
the user's thread was capturing (H100, f3a9e6c): the warm-up then went back into a call, where its 0.2-0.5 s
stalled the call that met the first check (``gemm_stall_trace-before-*``).
"""

from __future__ import annotations

import functools

import torch

from .device import current_device
from .driver import check, libcuda
from ..tunable import isolation

__all__ = ["bind", "launch_hook", "capture_relaxed", "off_thread"]


@functools.lru_cache(maxsize=None)
def _primary_context(index: int):
    """Device ``index``'s primary context, retained once per process (torch uses the same one and
    never releases it either)."""
    driver = libcuda()
    err, device = driver.cuDeviceGet(index)
    check(err, f"cuDeviceGet({index})")
    err, context = driver.cuDevicePrimaryCtxRetain(device)
    check(err, f"cuDevicePrimaryCtxRetain({index})")
    return context


def bind(index: int | None = None) -> bool:
    """Make device ``index``'s primary context current in this thread when no context is (``index``
    None: the thread's current device as torch sees it); True when it did. A context already
    current is left alone: another device's is the caller's to switch (``torch.cuda.device``)."""
    driver = libcuda()
    err, context = driver.cuCtxGetCurrent()
    check(err, "cuCtxGetCurrent")
    if int(context) != 0:
        return False
    (err,) = driver.cuCtxSetCurrent(_primary_context(current_device() if index is None else index))
    check(err, "cuCtxSetCurrent")
    return True


def launch_hook() -> bool:
    """What the C / C++ launchers call after a failed launch: :func:`bind` for the current device,
    True when the launch is worth retrying. Never raises: the launch's own error is the one to
    report."""
    try:
        return bind()
    except Exception:
        return False


#: the calling thread RELAXED for a block (``tunable/isolation.py``): loads and allocations that a user's
#: capture in another thread neither refuses nor is invalidated by
capture_relaxed = isolation.relaxed


def off_thread(fn):
    """``fn(params)`` made safe on a worker thread while any thread may capture a CUDA graph: for CUDA params,
    the device's context bound, the thread RELAXED (:func:`capture_relaxed`) and ``fn`` on tunekit's own non-blocking
    stream there, synchronized before returning (what ``fn`` loads and runs has ended). An op's ``off_thread``
    (``tunable/session.py`` runs the support screen and the check's warm-up so); the wrapper's ``worth(params)`` says
    where a worker is worth it (CUDA: backends and kernels load lazily; on the CPU the work is short)."""
    @functools.wraps(fn)
    def run(params):
        device = params.device
        if device.type != "cuda":
            return fn(params)
        bind(device.index)
        with torch.cuda.device(device), capture_relaxed():
            side = isolation.stream_for_thread(device)
            with torch.cuda.stream(side):
                result = fn(params)
            side.synchronize()
        return result

    run.worth = lambda params: params.device.type == "cuda"
    return run
