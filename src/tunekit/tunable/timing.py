"""Timers: how long one run of a callable takes on a device.

- CPU: a host clock (``time.perf_counter`` unless a test injects a fake one) around the runs.
- CUDA, eager launches (the default): :class:`CudaQueuedTimer`, nvbench's "blocking kernel". A spin
  kernel (``torch.cuda._sleep``) is enqueued first and holds the stream while the host enqueues the
  start event, every timed run and the end event; when it ends, the GPU runs them back to back, so
  the interval between the events is device time only. Plain events around eager launches
  (:class:`CudaEventTimer`, ``queued=False``) measure the host's launch rate whenever a kernel takes
  less device time than its launch takes host time (small elementwise kernels: a few us on the
  device, more than that to launch), and then rank candidates by launch cost, not device time.
- CUDA, ``graph=True``: the replay of a CUDA graph of the runs, queued behind a spin like an eager
  launch (:class:`CudaGraphTimer`): also device time only, at the price of one capture per candidate.

A ``Timer`` measures ``fn`` repeated ``reps`` times and returns milliseconds per repetition.
Rotation over several input sets (cold L2) is the caller's ``fn``: see ``find_fastest``.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from . import driver_graph, isolation

__all__ = ["Timer", "CpuTimer", "CudaEventTimer", "CudaQueuedTimer", "CudaGraphTimer", "SpinSizer",
           "queued_measure", "sleep_cycles_per_ms", "make_timer", "l2_cache_bytes"]


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
    """Time between two events on the current stream around eager launches: device time only when
    the GPU outruns the host; for kernels shorter than their launch, the host's launch rate."""

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


# -- queued (blocking-kernel) timing ---------------------------------------------------------------
#: the spin lasts this many times the host time the previous enqueue of the callable took, plus
#: SPIN_MARGIN_MS (the end event's record and the validity query come after the runs)
SPIN_FACTOR = 1.5
SPIN_MARGIN_MS = 0.02
#: the spin before anything is known about the callable's host cost: ~100 launches at 10 us
FIRST_SPIN_MS = 1.0
#: a slow-to-enqueue callable must not make the GPU idle-spin for long (the budget is 50 ms)
MAX_SPIN_MS = 20.0
#: measurements of one call to ``measure``: the first and at most this many minus one re-measurements
MAX_ATTEMPTS = 3
#: an invalid measurement doubles the spin of the callable's next ones, up to this many times
MAX_BOOST = 16.0


@dataclass
class SpinSizer:
    """How long the spin before one callable's next measurement must last (pure: no CUDA).

    The spin must outlast the host's enqueue of the timed runs. The predictor is the host time a
    covered (valid) enqueue of the same callable took, per repetition. Before the callable has one:
    ``prior_ms_per_rep`` (the timer's largest per-rep host time of a valid measurement so far:
    candidates of one op launch alike) or else ``first_ms``; the first measurement's enqueue time,
    covered or not, then replaces that guess.

    A measurement the spin did not cover (the GPU reached the start event before the host had
    enqueued the end event) doubles ``boost``, the spin's multiplier, rather than sizing from its
    enqueue time: one host hiccup (a GC pause) would otherwise make the next spins as long as the
    hiccup. Covered measurements let ``boost`` decay towards 1, so a systematic shortfall (the SM
    clock above its calibration) costs a re-measurement now and then, not long spins for good.

    Two uncovered measurements in a row whose enqueue outlasted the spin asked for mean the host
    waits for the device (a callable that synchronises, or more launches than the launch queue
    holds: the host blocks until the spin ends): a longer spin cannot help, so the sizer is
    ``blocked``: from then on a token spin (``margin_ms``: the measurement costs what plain events
    would), no re-measurements, measurements flagged, until one is covered again.
    """

    factor: float = SPIN_FACTOR
    margin_ms: float = SPIN_MARGIN_MS
    first_ms: float = FIRST_SPIN_MS
    cap_ms: float = MAX_SPIN_MS
    host_ms_per_rep: float | None = None
    boost: float = 1.0
    suspect: bool = False  # the last measurement was uncovered and its enqueue outlasted the spin
    blocked: bool = False

    def spin_ms(self, reps: int, prior_ms_per_rep: float | None = None) -> float:
        if self.blocked:
            return self.margin_ms
        per_rep = self.host_ms_per_rep if self.host_ms_per_rep is not None else prior_ms_per_rep
        want = self.first_ms if per_rep is None else self.factor * per_rep * reps + self.margin_ms
        return min(self.cap_ms, want * self.boost)

    def record(self, enqueue_ms: float, reps: int, spin_ms: float, valid: bool) -> bool:
        """Learn from one measurement; True when it was invalid and a re-measurement can do better
        (not when blocked, nor when the spin was already at the cap: a longer one is not allowed)."""
        per_rep = enqueue_ms / max(1, reps)
        if valid:
            self.host_ms_per_rep = per_rep
            self.boost = max(1.0, self.boost * 0.8)
            self.suspect = self.blocked = False
            return False
        outlasted = enqueue_ms >= 0.8 * spin_ms
        if outlasted and self.suspect:
            self.blocked, self.suspect, self.boost = True, False, 1.0
        if self.blocked:
            return False
        self.suspect = outlasted
        if self.host_ms_per_rep is None:
            self.host_ms_per_rep = per_rep  # the first real number replaces the guess
        else:
            self.boost = min(MAX_BOOST, self.boost * 2.0)
        return spin_ms < self.cap_ms


class Queue(Protocol):
    """The device side of a queued measurement (CUDA in :class:`_CudaQueue`, fakes in tests)."""

    def spin(self, ms: float) -> None: ...
    def record_start(self) -> None: ...
    def record_end(self) -> None: ...
    def start_done(self) -> bool: ...
    def elapsed_ms(self) -> float: ...  # waits for the end event


def queued_measure(fn, reps: int, sizer: SpinSizer, queue: Queue, clock: Callable[[], float],
                   prior_ms_per_rep: float | None = None) -> tuple[float, bool, float]:
    """(ms per rep, valid, host enqueue ms per rep) of ``fn`` x ``reps`` behind a spin.

    Valid: the spin was still running when the end event had been enqueued, so the GPU ran the
    timed work back to back. An invalid measurement (the interval may include host gaps, as plain
    events would) is repeated with a longer spin, up to ``MAX_ATTEMPTS`` measurements; the last one
    is returned, flagged, if none was valid.
    """
    for attempt in range(MAX_ATTEMPTS):
        spin = sizer.spin_ms(reps, prior_ms_per_rep)
        queue.spin(spin)
        t0 = clock()
        queue.record_start()
        for _ in range(reps):
            fn()
        queue.record_end()
        valid = not queue.start_done()
        enqueue_ms = (clock() - t0) * 1e3
        retry = sizer.record(enqueue_ms, reps, spin, valid)
        ms = queue.elapsed_ms()
        if valid or not retry or attempt == MAX_ATTEMPTS - 1:
            return ms / reps, valid, enqueue_ms / reps
    raise AssertionError("unreachable")  # pragma: no cover


_CYCLES_PER_MS: dict[int, float] = {}


def sleep_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on ``device``, measured once, cached.

    Three 400k-cycle spins (0.2-0.4 ms each), each timed with events behind a short spin of its
    own (so launch latency is not in the interval); the largest rate is kept: the spin's cycles run
    at the SM clock, and the fastest clock seen gives the shortest spin per cycle, so a spin sized
    with it lasts at least as long as asked unless the clock rises further (the validity check
    catches that).
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    rate = _CYCLES_PER_MS.get(index)
    if rate is not None:
        return rate
    cycles = 400_000
    with torch.cuda.device(index):
        stream = torch.cuda.current_stream()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # loads the kernel
        rates = []
        for _ in range(3):
            torch.cuda._sleep(100_000)
            start.record(stream)
            torch.cuda._sleep(cycles)
            end.record(stream)
            end.synchronize()
            ms = start.elapsed_time(end)
            if ms > 0:
                rates.append(cycles / ms)
    rate = max(rates) if rates else 2.0e6  # 2 GHz: long spins rather than short ones
    _CYCLES_PER_MS[index] = rate
    return rate


class _CudaQueue:
    """Spin kernel and events on the device's current stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.cycles_per_ms = sleep_cycles_per_ms(device)

    def spin(self, ms):
        with torch.cuda.device(self.device):
            torch.cuda._sleep(max(1, int(ms * self.cycles_per_ms)))

    def record_start(self):
        self.start.record(torch.cuda.current_stream(self.device))

    def record_end(self):
        self.end.record(torch.cuda.current_stream(self.device))

    def start_done(self):
        return self.start.query()

    def elapsed_ms(self):
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


class CudaQueuedTimer(Timer):
    """Device time of eager launches run back to back: the blocking-kernel method (module docstring).

    One :class:`SpinSizer` per prepared measurement, and per callable given to ``measure`` (held
    weakly). A measurement's wall time is about max(spin, enqueue) + device time: the spin overlaps
    the host's enqueue instead of adding to it. ``measurements``, ``invalid`` (measurements returned
    without a covering spin) and ``last_valid`` say how it went.
    """

    target_ms = 0.05

    def __init__(self, device: torch.device, *, queue: Queue | None = None,
                 clock: Callable[[], float] = time.perf_counter, sizer: Callable[[], SpinSizer] = SpinSizer):
        self.device = device
        self.queue = queue if queue is not None else _CudaQueue(device)
        self.clock = clock
        self.new_sizer = sizer
        self._sizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.prior_ms_per_rep: float | None = None
        self.measurements = 0
        self.invalid = 0
        self.last_valid = True

    def _measure(self, fn, reps, sizer, learn: bool = True):
        """One queued measurement; ``learn``: its host cost per rep may raise the prior of callables
        measured later (not a graph replay's: one launch of many runs, unlike an eager run's)."""
        ms, valid, host = queued_measure(fn, reps, sizer, self.queue, self.clock, self.prior_ms_per_rep)
        if valid and learn:  # an uncovered enqueue may have waited for the device: not a host cost
            self.prior_ms_per_rep = max(host, self.prior_ms_per_rep or 0.0)
        self.measurements += 1
        self.invalid += not valid
        self.last_valid = valid
        return ms

    def measure(self, fn, reps=1):
        try:
            sizer = self._sizers.get(fn)
            if sizer is None:
                sizer = self._sizers[fn] = self.new_sizer()
        except TypeError:  # not weak-referenceable: no history
            sizer = self.new_sizer()
        return self._measure(fn, reps, sizer)

    def prepare(self, fn, reps):
        sizer = self.new_sizer()
        return lambda: self._measure(fn, reps, sizer)


class CudaGraphTimer(CudaQueuedTimer):
    """Captures ``fn`` x ``reps`` once into a CUDA graph, then times its replays behind a spin.
    ``measure`` (tuning's one-shot probes) is the queued timer's: device time without a capture.
    Back-to-back eager launches run about a microsecond apart where a graph's kernels run about a
    tenth of that apart, so for kernels of a few microseconds queued times include a sizeable gap
    that graph times leave out, and a graph replay costs less wall time per timed run
    (``benchmarks/results/tuning_timer_check-*``).

    A replay is queued like an eager launch (the spin covers the host's ``cudaGraphLaunch``): with
    plain events the start event ran on an idle GPU before the graph reached it, so each replay
    carried the launch's host latency: on an H100, one replay of a 0.181 ms kernel read 0.185-0.211
    ms and the same kernel, timed as two candidates, 1.065x apart (``same_kernel_order_probe-*``).

    A replay lasts about ``target_ms`` (0.5 ms; a tuning's rounds set ``reps`` from it): replays of one pass
    over the input sets (the queued timer's 0.05 ms) ranked kernels of ~13 us by something other than their
    time: on an H100 the logsumexp gradient's static Triton kernel read 13.9 us against 13.2 in longer
    replays, its rows kernel 13.5 against 13.3, so tuning chose the rows kernel, 1-4% slower head to head
    (``benchmarks/results/logsumexp_backward_rank_probe-NVIDIA_H100_80GB_HBM3.txt``)."""

    target_ms = 0.5

    def prepare(self, fn, reps):
        graph = self._capture(fn, reps)
        sizer = self.new_sizer()

        def measure_replay():
            return self._measure(graph.replay, 1, sizer, learn=False) / reps

        measure_replay.graph = graph  # the graph (and its memory pool): alive as long as the measurement
        return measure_replay

    def _capture(self, fn, reps):
        """The graph of ``fn`` x ``reps``, captured on this thread's own stream (``isolation``: never a pooled
        stream or torch.cuda.graph's shared default capture stream, either of which a user's capture in
        another thread may be using), in thread_local mode (other threads' CUDA calls stay legal meanwhile;
        this thread's unsafe calls fail the capture, unless the thread was made RELAXED), through the driver
        (``driver_graph``: torch's graphs share the device's random-number generator state with a user's
        capture). Not ``torch.cuda.graph()``: its entry synchronizes the device, which fails any capture in
        progress in another thread."""
        side = isolation.stream_for_thread(self.device)
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        try:
            if driver_graph.available():
                return driver_graph.capture(fn, reps, side, self.device)
            return _torch_graph(fn, reps, side)
        finally:
            current.wait_stream(side)


def _torch_graph(fn, reps, side):
    """``torch.cuda.CUDAGraph`` of ``fn`` x ``reps`` on ``side``: where torch lacks ``driver_graph``'s pool
    calls (before 2.8)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        fn()  # warm-up on the capture stream, as torch.cuda.graphs recommends
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for _ in range(reps):
                fn()
        except BaseException:
            with contextlib.suppress(Exception):  # the run's own error is the one to report
                graph.capture_end()
            raise
        graph.capture_end()
    return graph


def make_timer(device: torch.device, *, graph: bool = False, queued: bool = True,
               clock: Callable[[], float] = time.perf_counter) -> Timer:
    """The timer for ``device``. CUDA: graph replays with ``graph``; else device time of eager
    launches behind a spin (``queued``, the default) or plain events around them (``queued=False``:
    host-bound for short kernels, what a caller's eager loop experiences). ``clock`` is the CPU
    timer's; CUDA timers use the real host clock."""
    if device.type == "cuda":
        if graph:
            return CudaGraphTimer(device)
        if queued and hasattr(torch.cuda, "_sleep"):
            return CudaQueuedTimer(device)
        return CudaEventTimer(device)
    return CpuTimer(clock)


def l2_cache_bytes(device: torch.device) -> int:
    """Last-level cache size that timed inputs must overflow to be cold (0 on CPU: not rotated)."""
    if device.type != "cuda":
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
