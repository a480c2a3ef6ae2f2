"""How tunekit's CUDA work stays out of a user's CUDA graph captures: streams of its own, and the calling
thread's capture mode set while it works (THREAD_LOCAL for tuning, RELAXED for the backends' loads).

tunekit works beside the user's threads: tuning times candidates (eager launches, CUDA-graph captures of its
own, synchronizations, allocations) on the caller's thread; a session's warm-ups and the kernels' builds run
on worker threads. Any other thread of the user's may be capturing a graph meanwhile.

**Streams.** A stream any other code can be handed is a hazard:

- ``torch.cuda.Stream()`` takes the next of a pool of 32 streams per device and priority, round robin: after 31
  other requests it hands out the stream the user is capturing on, and tunekit's launches join (and break) the
  user's graph (H100, ``tests/backends/test_capture_safety.py``);
- ``torch.cuda.graph(g)`` without ``stream=`` captures on one stream shared by the whole process
  (``torch.cuda.graph.default_capture_stream``): a user capturing that way on one thread while tuning captures on
  another puts both captures on one stream.

A stream made here with ``cuStreamCreate`` belongs to nobody else. It is non-blocking (no implicit
synchronization with the legacy default stream, which torch's default stream is: a capture forbids that), made in
the device's primary context (the one torch uses) pushed for the call, so any thread may ask, whatever its
current context. Each live thread has its own (:func:`stream_for_thread`); a thread's streams pass to later
threads when it ends; streams are made, never destroyed.

**Capture modes.** While a thread captures in the default (global) mode, the driver refuses "unsafe" calls
(``cudaMalloc``, a device synchronization, a module load) from every thread whose own mode is GLOBAL (the
default), and invalidates that capture. :func:`apart` makes the calling thread THREAD_LOCAL for a block: other
threads' captures no longer refuse its calls, while a capture of its own still does (tuning's graph timing
relies on that: a candidate that cannot be captured fails its capture and is timed eagerly, never from an
incomplete graph). :func:`relaxed` makes it RELAXED: nothing is refused, not even during its own capture; the
backends' module loads and allocations use it (a tunekit op met inside the user's capture may load a kernel).

**Beside a user's capture.** Tuning's graphs are captured through the driver (``driver_graph``: a torch graph's
capture takes the shared random-number generator out of capture mode) and tuning synchronizes streams, never the
device (a device-wide synchronize fails any capture in progress): a whole tuning beside a user's open capture,
random draws in it included, leaves that capture whole (``tests/backends/test_capture_safety.py``). What stays
unsafe is torch's own: ``torch.cuda.graph()``'s entry synchronizes the device, so a user entering it while tuning
captures on another thread fails, and so does tuning's capture (timed eagerly then, with a warning); no thread may
draw random numbers eagerly while another captures (``benchmarks/results/concurrent_capture_probe-*``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import weakref

import torch

__all__ = ["create_handle", "new_stream", "stream_for_thread", "apart", "relaxed", "driver_library", "check"]

#: cuStreamCreate's flag (cuda.h): no implicit synchronization with the legacy default stream
STREAM_NON_BLOCKING = 1
#: CUstreamCaptureMode (cuda.h): a THREAD_LOCAL thread is refused unsafe calls by its own captures only; a RELAXED
#: thread by none
CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED = 1, 2

_local = threading.local()
_free: dict[int, list] = {}  # device index -> streams of threads that ended
_free_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def driver_library():
    """libcuda through ctypes (the library torch already loaded)."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("no CUDA driver library (libcuda) could be loaded")


def check(result: int, what: str) -> None:
    """Raises RuntimeError naming ``what`` unless ``result`` is CUDA_SUCCESS."""
    if int(result) != 0:
        raise RuntimeError(f"{what} failed: CUresult {int(result)}")


def create_handle(index: int, driver=None) -> int:
    """A new non-blocking stream of device ``index``'s primary context (its ``CUstream`` as an int). The
    context is retained (torch holds it for the process too) and pushed only for the call: the thread's
    current context, if any, is current again afterwards, whether or not the creation failed."""
    driver = driver or driver_library()
    device, context, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    check(driver.cuDeviceGet(ctypes.byref(device), int(index)), f"cuDeviceGet({index})")
    check(driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), f"cuDevicePrimaryCtxRetain({index})")
    check(driver.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
    try:
        check(driver.cuStreamCreate(ctypes.byref(stream), STREAM_NON_BLOCKING), "cuStreamCreate")
    finally:
        driver.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    return int(stream.value or 0)


def new_stream(device: torch.device) -> torch.cuda.ExternalStream:
    """A new stream of tunekit's own on ``device`` (see the module docstring)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.ExternalStream(create_handle(index), device=torch.device("cuda", index))


class _Token:
    """Held by a thread's local storage alone: collected when the thread ends, handing its streams back."""


def _hand_back(held: dict) -> None:
    with _free_lock:
        for index, stream in held.items():
            _free.setdefault(index, []).append(stream)


def stream_for_thread(device: torch.device) -> torch.cuda.ExternalStream:
    """This thread's own stream on ``device``: two live threads never share one (two captures, or a capture and a
    worker's launches, on one stream would mix). A thread's streams go back to a free list when it ends and the
    next thread that needs one takes it, so there are never more streams than threads that used them at once
    (and the caching allocator's blocks freed on a stream are found again by its next thread)."""
    held = _local.__dict__.get("held")
    if held is None:
        held = _local.held = {}
        _local.token = _Token()
        weakref.finalize(_local.token, _hand_back, held)
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = held.get(index)
    if stream is None:
        with _free_lock:
            free = _free.get(index)
            stream = free.pop() if free else None
        held[index] = stream = stream if stream is not None else new_stream(torch.device("cuda", index))
    return stream


@contextlib.contextmanager
def _capture_mode(mode: int, driver=None):
    """The calling thread's capture mode ``mode`` for a block, the mode it had restored after. Before CUDA is
    initialised there is no capture to protect and nothing is changed (``driver``: tests pass a fake)."""
    if driver is None:
        if not torch.cuda.is_initialized():
            yield
            return
        driver = driver_library()
    value = ctypes.c_int(mode)
    check(driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(value)), "cuThreadExchangeStreamCaptureMode")
    try:  # value now holds the thread's mode before
        yield
    finally:
        driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(value))


def apart(driver=None):
    """A block whose calls another thread's capture neither refuses nor is invalidated by, while the thread's own
    captures still refuse unsafe calls (THREAD_LOCAL): how tuning runs."""
    return _capture_mode(CAPTURE_MODE_THREAD_LOCAL, driver)


def relaxed(driver=None):
    """A block whose driver calls (module loads, ``cudaMalloc``) no capture in progress, in any thread or this
    one, refuses or is invalidated by (RELAXED). These calls are not captured (a load or an allocation is never
    part of a graph); what the block launches on a capturing stream still is."""
    return _capture_mode(CAPTURE_MODE_RELAXED, driver)
