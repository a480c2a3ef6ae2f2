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
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .device import current_device
from .driver import check, libcuda

__all__ = ["bind", "launch_hook", "capture_relaxed"]

#: CUstreamCaptureMode (cuda.h): a thread in RELAXED mode may make calls a capture forbids (loads,
#: allocations) while a stream is captured, in this thread or another
_CAPTURE_MODE_RELAXED = 2


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


@contextlib.contextmanager
def capture_relaxed():
    """A block whose driver calls (module loads, ``cudaMalloc``) a graph capture in progress, in any
    thread, neither refuses nor is invalidated by: the calling thread's capture mode is RELAXED
    inside, restored after. These calls are not captured (a load or an allocation is never part of a
    graph); what the block launches on a capturing stream still is. Before CUDA is initialised there
    is no capture to protect and nothing is changed."""
    if not torch.cuda.is_initialized():
        yield
        return
    driver = libcuda()
    err, before = driver.cuThreadExchangeStreamCaptureMode(_CAPTURE_MODE_RELAXED)
    check(err, "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        driver.cuThreadExchangeStreamCaptureMode(before)
