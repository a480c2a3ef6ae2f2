"""CUDA graphs of tuning's timed runs, captured with the driver's stream capture, not ``torch.cuda.CUDAGraph``.

Why not torch's graph: every ``torch.cuda.CUDAGraph`` capture registers the device's default random-number
generator (one per device, shared by every thread), and its ``capture_end`` takes that generator out of capture
mode. A tuning capture that began and ended inside a user's capture on another thread so ended the user's too: the
user's next random draw in its graph raised "Attempt to increase offset for a CUDA generator not in capture mode".
Captured with ``cuStreamBeginCapture`` instead, the user's graph stayed whole, random draws included (H100,
``benchmarks/results/concurrent_capture_probe-*``). Both kinds of graph read the same device time, within 1.3%
(H200, ``graph_timer_driver_vs_torch-*``).

Memory: the runs allocate (a candidate's new output, a workspace). While this thread captures, its allocations
go to a private pool of torch's caching allocator that lives as long as the graph and is then released, as a torch
graph's pool is (its memory freed at the allocator's next emptying): the replays write only memory the allocator
hands nobody else. Not ``torch.cuda.MemPool``: its destructor empties the allocator's cache, which torch forbids
while any thread captures; beside a user's capture the process aborted (H200).

``available()`` is false on a torch without these allocator calls (before 2.8); the timer then uses torch's
graphs (``timing.CudaGraphTimer``), and tuning beside a user's capture is not safe there.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from typing import Callable

import torch

from . import isolation

__all__ = ["DriverGraph", "capture", "available"]


_POOL_CALLS = ("_graph_pool_handle", "_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool",
               "_cuda_releasePool")


def available() -> bool:
    return all(hasattr(torch._C, name) for name in _POOL_CALLS)


class _Pool:
    """A private pool of torch's caching allocator, as a torch graph's: this thread's allocations go to it while
    ``routing()``; ``release()`` once, when nothing will run in its memory again."""

    def __init__(self, index: int):
        self.index, self.id, self.made = index, torch._C._graph_pool_handle(), False

    @contextlib.contextmanager
    def routing(self):
        torch._C._cuda_beginAllocateCurrentThreadToPool(self.index, self.id)  # makes the pool, its use count 1
        self.made = True
        try:
            yield
        finally:
            torch._C._cuda_endAllocateToPool(self.index, self.id)

    def release(self) -> None:
        """Once, and only for a pool routing made (releasing one never made fails torch's assertion)."""
        if self.made:
            self.made = False
            torch._C._cuda_releasePool(self.index, self.id)


def _destroy(driver, graph_exec: int, graph: int, pool: _Pool) -> None:
    """Runs on whichever thread drops the graph or collects garbage, maybe while a user's thread captures: RELAXED,
    so that capture refuses none of these calls. Their results are not checked: nothing is left to do on failure."""
    with isolation.relaxed():
        driver.cuGraphExecDestroy(ctypes.c_void_p(graph_exec))
        driver.cuGraphDestroy(ctypes.c_void_p(graph))
        pool.release()


class DriverGraph:
    """An instantiated graph and the memory pool its runs allocated from; ``replay()`` launches it on the
    device's current stream (where a timer's events are)."""

    def __init__(self, graph_exec: int, graph: int, pool: _Pool, device: torch.device, driver):
        self.device, self.pool, self._exec, self._driver = device, pool, graph_exec, driver
        finalizer = weakref.finalize(self, _destroy, driver, graph_exec, graph, pool)
        finalizer.atexit = False  # at exit the context goes with the process

    def replay(self) -> None:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        isolation.check(self._driver.cuGraphLaunch(ctypes.c_void_p(self._exec), ctypes.c_void_p(stream)),
                        "cuGraphLaunch")


def _end(driver, handle) -> int:
    """Ends the stream's capture whatever its state; the graph's handle (0 when the capture was invalidated)."""
    graph = ctypes.c_void_p()
    result = driver.cuStreamEndCapture(handle, ctypes.byref(graph))
    if result and graph.value:
        driver.cuGraphDestroy(graph)
    isolation.check(result, "cuStreamEndCapture (a call the capture refused invalidates it)")
    return graph.value


def capture(fn: Callable[[], None], reps: int, stream: torch.cuda.Stream, device: torch.device,
            driver=None) -> DriverGraph:
    """The graph of ``fn`` x ``reps`` captured on ``stream`` (one no other code uses: ``isolation``) in
    THREAD_LOCAL mode: another thread's calls stay legal meanwhile, this thread's unsafe calls fail the capture.
    ``fn`` runs once before, outside the capture and the pool (lazy loads, first allocations, workspaces kept for
    good). ``driver``: tests pass a fake."""
    driver = driver or isolation.driver_library()
    pool = _Pool(device.index if device.index is not None else torch.cuda.current_device())
    try:
        return _captured(fn, reps, stream, device, driver, pool)
    except BaseException:
        pool.release()
        raise


def _captured(fn, reps, stream, device, driver, pool: _Pool) -> DriverGraph:
    handle = ctypes.c_void_p(stream.cuda_stream)
    with torch.cuda.stream(stream):
        fn()  # outside the pool too, as torch's graphs: what it keeps for good (a workspace) stays in the main pool
    with pool.routing(), torch.cuda.stream(stream):
        isolation.check(driver.cuStreamBeginCapture_v2(handle, isolation.CAPTURE_MODE_THREAD_LOCAL),
                        "cuStreamBeginCapture")
        try:
            for _ in range(reps):
                fn()
        except BaseException:
            try:
                partial = _end(driver, handle)
                if partial:
                    driver.cuGraphDestroy(ctypes.c_void_p(partial))
            except RuntimeError:
                pass  # the run's own error is the one to report
            raise
        graph = _end(driver, handle)
    graph_exec = ctypes.c_void_p()
    result = driver.cuGraphInstantiateWithFlags(ctypes.byref(graph_exec), ctypes.c_void_p(graph), ctypes.c_ulonglong(0))
    if result:
        driver.cuGraphDestroy(ctypes.c_void_p(graph))
        isolation.check(result, "cuGraphInstantiateWithFlags")
    return DriverGraph(graph_exec.value, graph, pool, device, driver)
