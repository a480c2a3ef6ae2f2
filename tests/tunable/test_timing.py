"""Timers. The queued (blocking-kernel) timer's sizing and validity logic runs here against a fake
stream on a fake clock, so its behaviour is exact on a CPU machine; what needs CUDA is marked gpu."""

import time
from types import SimpleNamespace

import pytest
import torch

from tunekit.tunable import find_fastest, tuning
from tunekit.tunable.timing import (FIRST_SPIN_MS, MAX_ATTEMPTS, MAX_SPIN_MS, SPIN_FACTOR, SPIN_MARGIN_MS,
                                    CpuTimer, CudaGraphTimer, CudaQueuedTimer, SpinSizer, Timer, make_timer, queued_measure)

from fakes import FakeClock, ScaleParams, make_op


class FakeStream:
    """One CUDA stream on a fake clock: work runs in order, each item when the host has enqueued it
    and the item before it has ended. ``spin_scale`` < 1: the SM clock runs faster than calibrated.
    ``depth``: the launch queue's size; a launch into a full queue waits until the oldest item ends."""

    def __init__(self, clock: FakeClock, spin_scale: float = 1.0, depth: int = 10**9):
        self.clock = clock
        self.spin_scale = spin_scale
        self.depth = depth
        self.free = 0.0  # when the stream's last enqueued item ends (seconds)
        self.pending = []  # end times of enqueued items
        self.spins = []

    def _enqueue(self, ms):
        self.pending = [e for e in self.pending if e > self.clock.t]
        if len(self.pending) >= self.depth:
            self.clock.t = self.pending[len(self.pending) - self.depth]  # in order: sorted
            self.pending = [e for e in self.pending if e > self.clock.t]
        begin = max(self.free, self.clock.t)
        self.free = begin + ms / 1e3
        self.pending.append(self.free)

    def kernel(self, host_ms, device_ms):
        """A callable whose launch costs ``host_ms`` of host time and ``device_ms`` on the device."""
        def launch():
            self.clock.advance(host_ms)
            self._enqueue(device_ms)
        return launch

    # the Queue protocol
    def spin(self, ms):
        self.spins.append(ms)
        self._enqueue(ms * self.spin_scale)

    def record_start(self):
        self.start = max(self.free, self.clock.t)

    def record_end(self):
        self.end = max(self.free, self.clock.t)

    def start_done(self):
        return self.clock.t >= self.start

    def elapsed_ms(self):
        self.clock.t = max(self.clock.t, self.end)  # the host waits for the end event
        return (self.end - self.start) * 1e3


HOST_MS, DEVICE_MS = 0.006, 0.0015  # a 4 MB elementwise kernel: 6 us to launch, 1.5 us to run


# -- SpinSizer: pure sizing ------------------------------------------------------------------------
def test_first_guess_then_sized_from_the_previous_enqueue():
    s = SpinSizer()
    assert s.spin_ms(10) == FIRST_SPIN_MS
    s.record(enqueue_ms=0.1, reps=10, spin_ms=FIRST_SPIN_MS, valid=True)
    assert s.spin_ms(10) == pytest.approx(SPIN_FACTOR * 0.1 + SPIN_MARGIN_MS)
    assert s.spin_ms(20) == pytest.approx(SPIN_FACTOR * 0.2 + SPIN_MARGIN_MS)  # per repetition


def test_prior_stands_in_until_the_callable_has_history():
    s = SpinSizer()
    assert s.spin_ms(4, prior_ms_per_rep=0.05) == pytest.approx(SPIN_FACTOR * 0.2 + SPIN_MARGIN_MS)
    s.record(0.04, 4, 1.0, True)
    assert s.spin_ms(4, prior_ms_per_rep=0.05) == pytest.approx(SPIN_FACTOR * 0.04 + SPIN_MARGIN_MS)


def test_spin_is_capped_and_no_retry_at_the_cap():
    s = SpinSizer()
    s.record(enqueue_ms=50.0, reps=1, spin_ms=FIRST_SPIN_MS, valid=True)  # a slow callable
    assert s.spin_ms(1) == MAX_SPIN_MS
    s = SpinSizer(host_ms_per_rep=10.0, boost=2.0)
    assert s.spin_ms(1) == MAX_SPIN_MS
    assert s.record(10.0, 1, MAX_SPIN_MS, valid=False) is False  # longer is not allowed: flag, don't retry
    assert not s.blocked


def test_an_enqueue_that_keeps_outlasting_the_spin_blocks_retries_until_one_is_covered():
    s = SpinSizer(host_ms_per_rep=0.1)
    assert s.record(0.5, 1, 0.17, valid=False) is True  # once: maybe a hiccup, try a longer spin
    assert s.record(0.9, 1, 0.34, valid=False) is False  # again, grown with the spin: the host waits
    assert s.blocked and s.boost == 1.0 and s.spin_ms(1) == SPIN_MARGIN_MS
    assert s.record(0.9, 1, 0.17, valid=False) is False
    s.record(0.1, 1, 0.17, valid=True)
    assert not s.blocked


def test_invalid_doubles_the_spin_and_valid_decays_it_back():
    s = SpinSizer()
    s.record(0.1, 1, 1.0, True)
    base = s.spin_ms(1)
    assert s.record(0.1, 1, base, valid=False) is True
    assert s.spin_ms(1) == pytest.approx(2 * base)
    for _ in range(10):
        s.record(0.1, 1, s.spin_ms(1), True)
    assert s.boost == 1.0 and s.spin_ms(1) == pytest.approx(base)


# -- queued_measure against a fake stream ----------------------------------------------------------
def test_queued_measurement_is_device_time_when_launches_are_host_bound():
    clock = FakeClock()
    stream = FakeStream(clock)
    fn = stream.kernel(HOST_MS, DEVICE_MS)
    ms, valid, host = queued_measure(fn, 30, SpinSizer(), stream, clock)
    assert valid
    assert ms == pytest.approx(DEVICE_MS)
    assert host == pytest.approx(HOST_MS)


def test_without_a_covering_spin_the_interval_is_the_launch_rate_and_flagged():
    """What plain events measured: the host's launch rate, not the kernel."""
    clock = FakeClock()
    stream = FakeStream(clock)
    no_spin = SpinSizer(first_ms=0.0, cap_ms=0.0)
    ms, valid, _ = queued_measure(stream.kernel(HOST_MS, DEVICE_MS), 30, no_spin, stream, clock)
    assert not valid
    assert ms == pytest.approx(HOST_MS, rel=0.05)


def test_a_short_first_guess_is_detected_and_remeasured_with_a_longer_spin():
    clock = FakeClock()
    stream = FakeStream(clock)
    sizer = SpinSizer(first_ms=0.05)  # 30 launches take 0.18 ms to enqueue
    ms, valid, _ = queued_measure(stream.kernel(HOST_MS, DEVICE_MS), 30, sizer, stream, clock)
    assert valid and ms == pytest.approx(DEVICE_MS)
    assert len(stream.spins) == 2 and stream.spins[1] > 0.18


def test_retries_are_bounded_when_the_spin_keeps_falling_short():
    clock = FakeClock()
    stream = FakeStream(clock, spin_scale=0.01)  # the spin ends far sooner than asked, every time
    ms, valid, _ = queued_measure(stream.kernel(HOST_MS, DEVICE_MS), 30, SpinSizer(), stream, clock)
    assert not valid
    assert len(stream.spins) == MAX_ATTEMPTS
    assert ms > DEVICE_MS  # the host-bound interval, returned flagged


def test_a_callable_slower_to_enqueue_than_the_cap_is_measured_once_and_flagged():
    clock = FakeClock()
    stream = FakeStream(clock)
    sizer = SpinSizer()
    sizer.record(40.0, 1, 1.0, True)
    _, valid, _ = queued_measure(stream.kernel(40.0, 0.01), 1, sizer, stream, clock)
    assert not valid and stream.spins == [MAX_SPIN_MS]


def test_one_host_hiccup_doubles_the_spin_instead_of_sizing_it_from_the_hiccup():
    clock = FakeClock()
    stream = FakeStream(clock)
    fn = stream.kernel(HOST_MS, DEVICE_MS)
    sizer = SpinSizer()
    queued_measure(fn, 30, sizer, stream, clock)
    calls = []

    def hiccup_once():
        if not calls:
            clock.advance(5.0)  # a GC pause in the middle of the enqueue
        calls.append(1)
        fn()

    ms, valid, _ = queued_measure(hiccup_once, 30, sizer, stream, clock)
    assert valid and ms == pytest.approx(DEVICE_MS)
    assert stream.spins[-1] == pytest.approx(2 * stream.spins[-2])  # not 1.5 x 5 ms


def test_a_host_blocked_by_a_full_launch_queue_is_flagged_without_chasing_the_spin():
    """30 launches into an 8-deep queue: the host waits for the spin whatever its length."""
    clock = FakeClock()
    stream = FakeStream(clock, depth=8)
    sizer = SpinSizer()
    fn = stream.kernel(HOST_MS, DEVICE_MS)
    _, valid, _ = queued_measure(fn, 30, sizer, stream, clock)
    assert not valid and sizer.blocked
    assert len(stream.spins) == 2
    _, valid, _ = queued_measure(fn, 30, sizer, stream, clock)
    assert not valid and len(stream.spins) == 3  # one attempt, a token spin: it cannot be covered
    assert stream.spins[-1] == SPIN_MARGIN_MS


def test_wall_time_is_about_the_enqueue_not_spin_plus_enqueue():
    clock = FakeClock()
    stream = FakeStream(clock)
    fn = stream.kernel(HOST_MS, DEVICE_MS)
    sizer = SpinSizer()
    queued_measure(fn, 30, sizer, stream, clock)  # learns the enqueue time
    t0 = clock()
    queued_measure(fn, 30, sizer, stream, clock)
    wall = (clock() - t0) * 1e3
    spin = stream.spins[-1]
    assert wall == pytest.approx(max(spin, 30 * HOST_MS) + 30 * DEVICE_MS)
    assert wall < 30 * HOST_MS * SPIN_FACTOR + SPIN_MARGIN_MS + 30 * DEVICE_MS + 1e-9


# -- CudaQueuedTimer with a fake queue -------------------------------------------------------------
def test_prepared_measurement_sizes_its_spin_from_its_own_previous_enqueue():
    clock = FakeClock()
    stream = FakeStream(clock)
    timer = CudaQueuedTimer(torch.device("cuda"), queue=stream, clock=clock)
    measure = timer.prepare(stream.kernel(HOST_MS, DEVICE_MS), 10)
    assert measure() == pytest.approx(DEVICE_MS)
    assert measure() == pytest.approx(DEVICE_MS)
    assert stream.spins[0] == FIRST_SPIN_MS
    assert stream.spins[1] == pytest.approx(SPIN_FACTOR * 10 * HOST_MS + SPIN_MARGIN_MS)
    assert (timer.measurements, timer.invalid, timer.last_valid) == (2, 0, True)


def test_a_new_callable_starts_from_the_largest_host_cost_seen():
    clock = FakeClock()
    stream = FakeStream(clock)
    timer = CudaQueuedTimer(torch.device("cuda"), queue=stream, clock=clock)
    cheap, dear = stream.kernel(HOST_MS, DEVICE_MS), stream.kernel(2 * HOST_MS, DEVICE_MS)
    timer.measure(dear, 5)
    timer.measure(cheap, 5)
    assert stream.spins[-1] == pytest.approx(SPIN_FACTOR * 10 * HOST_MS + SPIN_MARGIN_MS)  # dear's cost, 5 reps
    timer.measure(cheap, 5)
    assert stream.spins[-1] == pytest.approx(SPIN_FACTOR * 5 * HOST_MS + SPIN_MARGIN_MS)  # its own now


def test_a_graph_replay_is_timed_behind_a_spin_so_its_launch_latency_is_left_out(monkeypatch):
    """One replay of a long kernel (reps = 1, as tuning gives a 0.18 ms kernel): with events around it on
    an idle GPU, the interval began before the graph arrived and carried the launch's host latency."""
    clock = FakeClock()
    stream = FakeStream(clock)
    timer = CudaGraphTimer(torch.device("cuda"), queue=stream, clock=clock)
    replay = stream.kernel(0.02, 0.181)  # 20 us to launch the graph, 0.181 ms of device time
    monkeypatch.setattr(timer, "_capture", lambda fn, reps: SimpleNamespace(replay=replay))
    measure = timer.prepare(None, 1)
    assert [measure() for _ in range(3)] == pytest.approx([0.181] * 3)
    assert (timer.invalid, len(stream.spins)) == (0, 3)
    assert measure.graph.replay is replay
    assert timer.prior_ms_per_rep is None  # a replay's launch says nothing about an eager run's


def test_make_timer_on_cpu_is_the_host_clock_whatever_the_flags():
    for queued in (True, False):
        assert isinstance(make_timer(torch.device("cpu"), queued=queued), CpuTimer)


def test_tuning_rounds_stop_on_their_wall_time_not_their_measured_time():
    """A timer whose measurements take longer than they report (a queued timer's spin and enqueue):
    the rounds stop when the budget cannot hold another one, as measured by the clock."""

    class SlowWallTimer(Timer):
        def __init__(self, clock):
            self.clock = clock

        def measure(self, fn, reps=1):
            t0 = self.clock()
            for _ in range(reps):
                fn()
            ms = (self.clock() - t0) * 1e3
            self.clock.advance(3 * ms)  # wall time 4x the reported time
            return ms / reps

    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "fast": 0.9})
    start = clock()
    with tuning(max_tuning_ms=100.0) as s:
        report = find_fastest(op, ScaleParams(torch.randn(100)), s, clock=clock, timer=SlowWallTimer(clock))
    assert report.choice == "fast"
    assert (clock() - start) * 1e3 <= 100.0


# -- on a GPU --------------------------------------------------------------------------------------
def _host_busy(us):
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_sleep_calibration_is_plausible_and_cached(cuda):
    from tunekit.tunable.timing import sleep_cycles_per_ms

    rate = sleep_cycles_per_ms(cuda)
    assert 3e5 < rate < 4e6  # 0.3 to 4 GHz
    t0 = time.perf_counter()
    assert sleep_cycles_per_ms(cuda) == rate
    assert time.perf_counter() - t0 < 1e-3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(0.05 * rate))  # hold the stream so the events bracket the spin alone
    start.record()
    torch.cuda._sleep(int(1.0 * rate))
    end.record()
    end.synchronize()
    assert 0.8 < start.elapsed_time(end) < 1.5  # asked for 1 ms


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_queued_time_of_a_host_bound_kernel_is_its_device_time(cuda):
    x = torch.zeros(1024, device=cuda)

    def fn():
        x.add_(1)
        _host_busy(20)  # launches 20 us apart: plain events measure the host, not the kernel

    fn()
    torch.cuda.synchronize()
    plain = make_timer(cuda, queued=False).measure(fn, 50)
    timer = make_timer(cuda)
    assert isinstance(timer, CudaQueuedTimer)
    queued = min(timer.measure(fn, 50) for _ in range(5))
    assert plain > 19e-3
    assert queued < 0.3 * plain, (queued, plain)
    assert timer.last_valid


@pytest.mark.gpu
@pytest.mark.gpu_timing
@pytest.mark.parametrize("numel", [1 << 20, 1 << 22])
def test_queued_agrees_with_graph_replay(cuda, numel):
    """4 MB and 16 MB fp32 inputs, rotated over enough buffers to read them cold from memory."""
    l2 = torch.cuda.get_device_properties(cuda).L2_cache_size
    n = max(2, min(16, -(-2 * l2 // (8 * numel))))
    xs = [torch.randn(numel, device=cuda) for _ in range(n)]
    ys = [torch.empty_like(x) for x in xs]

    def run_all():
        for x, y in zip(xs, ys):
            torch.mul(x, 2.0, out=y)

    run_all()
    torch.cuda.synchronize()
    queued = make_timer(cuda).prepare(run_all, 4)
    graph = make_timer(cuda, graph=True).prepare(run_all, 4)
    q = sorted(queued() for _ in range(11))[5]
    g = sorted(graph() for _ in range(11))[5]
    # eager launches run ~1 us apart back to back (a graph's ~0.1 us): measured on an H200, queued
    # read 1.2-1.3x graph for 2 MB kernels. The gap per launch, not a ratio, is what must stay small.
    assert q > 0.95 * g and (q - g) / n < 2e-3, (q, g, n)


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_a_spin_that_cannot_cover_the_enqueue_is_flagged_and_a_free_one_is_not(cuda):
    x = torch.zeros(1024, device=cuda)

    def fn():
        x.add_(1)
        _host_busy(100)

    fn()
    torch.cuda.synchronize()
    capped = CudaQueuedTimer(cuda, sizer=lambda: SpinSizer(first_ms=0.05, cap_ms=0.05))
    capped.measure(fn, 10)  # 1 ms to enqueue behind a 50 us spin
    assert not capped.last_valid and capped.invalid == 1
    timer = CudaQueuedTimer(cuda)
    timer.measure(fn, 10)
    timer.measure(fn, 10)
    assert timer.last_valid


@pytest.mark.gpu
@pytest.mark.gpu_timing
def test_one_replay_per_measurement_reads_what_twenty_read(cuda):
    """Tuning times a 0.18 ms kernel one replay per measurement: the host's launch of the replay must not be
    in the time (it was: 0.185-0.211 ms for a 0.181 ms kernel on an H100, and two identical candidates
    read 1.065x apart). What stays is the graph's start on the device, the same for every candidate:
    2.3 us on an H100 (48.9 us per replay of one 46.6 us kernel); the bound leaves 1.2 us for other GPUs."""
    x = torch.randn(1 << 24, device=cuda)
    y = torch.empty_like(x)

    def run():
        torch.mul(x, 2.0, out=y)

    run()
    one = make_timer(cuda, graph=True).prepare(run, 1)
    twenty = make_timer(cuda, graph=True).prepare(run, 20)
    g1 = sorted(one() for _ in range(11))[5]
    g20 = sorted(twenty() for _ in range(11))[5]
    assert g1 - g20 < 3.5e-3, (g1, g20)
