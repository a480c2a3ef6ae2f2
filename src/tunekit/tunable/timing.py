"""Timers: how long one run of a callable takes on a device.

- CPU: a host clock (``time.perf_counter`` unless a test injects a fake one) around the runs.
- CUDA: events recorded on the current stream around the runs (device time, no host sync in
  between), or around the replay of a CUDA graph of the runs (``graph=True``), which takes the
  host's launch cost out of the number.

A ``Timer`` measures ``fn`` repeated ``reps`` times and returns milliseconds per repetition.
Rotation over several input sets (cold L2) is the caller's ``fn``: see ``find_fastest``.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["Timer", "CpuTimer", "CudaEventTimer", "CudaGraphTimer", "make_timer", "l2_cache_bytes"]


class Timer:
    #: a measurement should last at least this long to be well above the timer's resolution
    target_ms: float = 0.1

    def measure(self, fn: Callable[[], None], reps: int = 1) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def prepare(self, fn: Callable[[], None], reps: int) -> Callable[[], float]:
        """A zero-argument measurement of ``fn`` x ``reps`` (graph timers capture here, once)."""
        return lambda: self.measure(fn, reps)


class CpuTimer(Timer):
    target_ms = 0.5

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock

    def measure(self, fn, reps=1):
        clock = self.clock
        t0 = clock()
        for _ in range(reps):
            fn()
        return (clock() - t0) * 1e3 / reps


class CudaEventTimer(Timer):
    """Device time between two events on the current stream."""

    target_ms = 0.05

    def __init__(self, device: torch.device):
        self.device = device
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def measure(self, fn, reps=1):
        stream = torch.cuda.current_stream(self.device)
        self.start.record(stream)
        for _ in range(reps):
            fn()
        self.end.record(stream)
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / reps


class CudaGraphTimer(CudaEventTimer):
    """Captures ``fn`` x ``reps`` once into a CUDA graph, then times its replays with events."""

    def prepare(self, fn, reps):
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()  # warm-up on the capture stream, as torch.cuda.graphs recommends
        torch.cuda.current_stream(self.device).wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()

        def measure_replay():
            return self.measure(graph.replay, 1) / reps

        measure_replay.graph = graph  # keep it (and its memory pool) alive as long as the closure
        return measure_replay


def make_timer(device: torch.device, *, graph: bool = False, clock: Callable[[], float] = time.perf_counter) -> Timer:
    if device.type == "cuda":
        return CudaGraphTimer(device) if graph else CudaEventTimer(device)
    return CpuTimer(clock)


def l2_cache_bytes(device: torch.device) -> int:
    """Last-level cache size that timed inputs must overflow to be cold (0 on CPU: not rotated)."""
    if device.type != "cuda":
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
