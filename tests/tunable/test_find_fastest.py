"""find_fastest through a TunableOp, with a fake clock so timings are exact and tests deterministic."""

import pytest
import torch

import tunekit
from tunekit.tunable import find_fastest, tuning
from tunekit.tunable.find_fastest import MAX_ROUNDS, MIN_ROUNDS

from fakes import FakeClock, ScaleParams, make_op


def tuned(op, clock, x, **settings):
    with tuning(**settings) as s:
        return find_fastest(op, ScaleParams(x), s, clock=clock)


def test_chooses_the_fastest_and_records_every_candidate():
    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 1.0, "medium": 1.5})
    report = tuned(op, clock, torch.randn(100))
    assert report.choice == "fast"
    assert report.complete
    assert report.candidates["fast"].status == "chosen"
    assert report.candidates["fast"].time_ms == pytest.approx(1.0)
    assert report.candidates["ref"].status == "slower"
    assert report.candidates["ref"].time_ms == pytest.approx(2.0)
    assert report.candidates["medium"].time_ms == pytest.approx(1.5)


def test_default_keeps_its_place_within_the_margin():
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "fast": 0.98})
    report = tuned(op, clock, torch.randn(100))  # 2% faster, default margin 3%
    assert report.choice == "ref"
    assert "margin" in report.candidates["fast"].reason
    report = tuned(op, clock, torch.randn(100), margin=0.01)
    assert report.choice == "fast"


def test_probe_prunes_clearly_slower_candidates():
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "fast": 0.5, "sluggish": 10.0})
    report = tuned(op, clock, torch.randn(100))
    assert report.candidates["sluggish"].status == "pruned"
    assert report.candidates["sluggish"].time_ms == pytest.approx(10.0)
    assert op.runs["sluggish"] == 2  # numerical check + one probe, no timed rounds
    assert op.runs["fast"] >= 2 + MIN_ROUNDS
    assert report.choice == "fast"


def test_default_is_never_pruned():
    clock = FakeClock()
    op = make_op(clock, {"ref": 10.0, "fast": 1.0})
    report = tuned(op, clock, torch.randn(100))
    assert report.candidates["ref"].status == "slower"
    assert report.candidates["ref"].time_ms == pytest.approx(10.0)


def test_budget_covers_checks_and_marks_entry_incomplete():
    clock = FakeClock()
    op = make_op(clock, {"ref": 4.0, "a": 4.0, "b": 4.0, "c": 4.0})
    start = clock()
    report = tuned(op, clock, torch.randn(100), max_tuning_ms=6.0)
    assert not report.complete
    skipped = [n for n, r in report.candidates.items() if r.status == "skipped"]
    assert skipped, report.candidates  # the budget ran out while checking candidates
    assert report.choice == "ref"
    # it stops at the first step that starts past the deadline: at most one run of overshoot
    assert (clock() - start) * 1e3 <= 6.0 + 4.0


def test_budget_limits_rounds_and_still_picks_a_winner():
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "fast": 0.5})
    report = tuned(op, clock, torch.randn(100), max_tuning_ms=2.5)  # ref run + check + probes use it up
    assert not report.complete
    assert report.choice == "fast"


def test_rounds_scale_with_budget():
    """A budget too short for the rounds' ENOUGH_MS (5 rounds of 1.5 ms here) ends them sooner (after MIN_ROUNDS)."""
    clock = FakeClock()
    op = make_op(clock, {"ref": 0.1, "fast": 0.05})
    tuned(op, clock, torch.randn(100), max_tuning_ms=1000.0)
    many = op.runs["fast"]
    op.runs.clear()
    tuned(op, clock, torch.randn(100), max_tuning_ms=6.0)
    assert op.runs["fast"] < many


@pytest.mark.parametrize("behaviour, status, words", [
    ("unsupported", "unsupported", "needs a device"),
    ("wrong", "numerics", "outside rtol"),
    ("half", "numerics", "NaN where the reference is not"),
    ("raises", "error", "kernel exploded"),
    ("returns_new", "error", "other than the outputs"),
])
def test_bad_candidates_are_rejected_with_the_reason(behaviour, status, words):
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "bad": 0.1}, behaviours={"bad": behaviour})
    report = tuned(op, clock, torch.randn(1000))
    assert report.choice == "ref"
    assert report.candidates["bad"].status == status
    assert words in report.candidates["bad"].reason
    if behaviour == "unsupported":
        assert op.runs["bad"] == 0


def test_numerical_check_off_lets_a_wrong_candidate_win():
    """Shows the check is what rejects it (and that turning it off is the user's explicit choice)."""
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "bad": 0.1}, behaviours={"bad": "wrong"})
    report = tuned(op, clock, torch.randn(100), numerical_check=False)
    assert report.choice == "bad"


def test_failing_candidate_never_reaches_the_user():
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "bad": 0.1}, behaviours={"bad": "raises"})
    op.clock = clock
    x = torch.randn(64)
    torch.testing.assert_close(op(ScaleParams(x)), 2 * x)


def test_default_error_reaches_the_user():
    op = make_op(None, {"ref": 1.0, "other": 1.0}, behaviours={"ref": "raises"})
    with pytest.raises(RuntimeError, match="kernel exploded"):
        op(ScaleParams(torch.randn(8)))


def test_runs_on_a_real_clock_too():
    op = make_op(None, {"ref": 0.0, "other": 0.0})
    with tuning() as s:
        report = find_fastest(op, ScaleParams(torch.randn(1000)), s)
    assert report.choice in ("ref", "other")
    assert all(r.time_ms and r.time_ms > 0 for r in report.candidates.values())
    assert report.tuning_ms < tunekit.settings().max_tuning_ms + 50


def test_times_are_per_call_when_inputs_are_rotated(monkeypatch):
    """With several input sets (as on a GPU with L2 to overflow), times are still per call."""
    import importlib

    ff = importlib.import_module("tunekit.tunable.screen")  # where the input sets are made

    monkeypatch.setattr(ff, "l2_cache_bytes", lambda device: 10**6)
    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 1.0, "sluggish": 9.0})
    x = torch.randn(1000)
    assert len(ff.input_sets(ScaleParams(x), ScaleParams(x))) > 1
    report = tuned(op, clock, x, max_tuning_ms=10_000)
    assert report.candidates["fast"].time_ms == pytest.approx(1.0)
    assert report.candidates["ref"].time_ms == pytest.approx(2.0)
    assert report.candidates["sluggish"].time_ms == pytest.approx(9.0)  # pruned: its probe, per call


def _budget(ms):
    from tunekit.tunable.screen import Budget as _Budget
    return _Budget(ms, FakeClock())


def test_a_host_time_tie_break_needs_the_head_to_head_to_confirm_the_tie():
    """The tie seen in the rounds' medians is re-measured pairwise before host time may break it:
    a challenger 3% slower is refused, one within HOST_TIE accepted, and the order alternates."""
    from tunekit.tunable.host_time import CONFIRM_PAIRS, HOST_TIE, confirmed_tie
    order = []

    def measure(name, ms):
        def run():
            order.append(name)
            return ms
        return run

    tied, ratio = confirmed_tie(measure("choice", 1.0), measure("other", 1.03), _budget(100))
    assert not tied and ratio == pytest.approx(1.03)
    assert len(order) == 2 * CONFIRM_PAIRS and order[:4] == ["choice", "other", "other", "choice"]
    tied, ratio = confirmed_tie(measure("choice", 1.0), measure("other", 1.0 + HOST_TIE / 2), _budget(100))
    assert tied and ratio == pytest.approx(1.0 + HOST_TIE / 2)


def test_the_confirmation_stops_at_the_budget_after_min_rounds_pairs():
    from tunekit.tunable.host_time import confirmed_tie
    calls = []

    def measure():
        calls.append(1)
        return 1.0
    assert confirmed_tie(measure, measure, _budget(-1.0))[0]
    assert len(calls) == 2 * MIN_ROUNDS


class Tied:
    """A candidate that counts its runs (the host-time tie-break's tests)."""

    def __init__(self, name):
        self.name, self.calls = name, 0

    def run(self, p):
        self.calls += 1


def test_a_device_bound_choice_measures_no_other_candidates_host_time():
    """The host-time tie-break starts with a short measure of the choice: when its host time is
    hidden behind its device time, no tied candidate is run (each measure waits for its queued
    kernels: 0.2 s of one call for three tied 0.4 ms GEMMs), and the choice stands."""
    from tunekit.tunable.host_time import prefer_less_host_time
    from tunekit.tunable.session import TuningReport

    x = torch.randn(8)
    choice, other = Tied("choice"), Tied("other")
    report = TuningReport("choice", True)

    def decide(device_ms):
        choice.calls = other.calls = 0
        prefer_less_host_time(report, [choice, other], {"choice": device_ms, "other": device_ms},
                              remeasure=None, params=ScaleParams(x), base=ScaleParams(x), budget=_budget(100))

    decide(1.0)  # 1 ms of device time against a Python call's few microseconds: device-bound
    assert choice.calls == 8 and other.calls == 0 and report.choice == "choice"
    decide(1e-6)  # a nanosecond kernel: host-bound, so both are measured
    assert other.calls > 0 and choice.calls > 8


def test_the_host_time_tie_break_is_pieces_of_work_with_the_finalists_measured_again_together():
    """A session spreads the tie-break over calls like the rest of its work: in one piece it was the longest part of
    the call that ended a logsumexp tuning (8.8 of 12.8 ms, H100). host_time_steps yields after the choice's short
    measure and after each tied candidate's host time (one candidate's calls a piece); the two finalists' host times
    are taken again in one piece (measured in separate calls, a difference could come from the calls' moment); then
    the device-time head-to-head, a pair a piece, and the host-cheaper candidate is chosen."""
    import time as _time

    from tunekit.tunable.host_time import CONFIRM_PAIRS, host_time_steps
    from tunekit.tunable.session import TuningReport

    class Slow(Tied):
        def run(self, p):
            super().run(p)
            _time.sleep(1e-4)  # 100 us of host time a call: clearly host-bound against a nanosecond kernel

    x = torch.randn(8)
    tied = [Slow("choice"), Tied("a"), Tied("b")]
    report = TuningReport("choice", True, {})
    steps = host_time_steps(report, tied, {c.name: 1e-6 for c in tied}, remeasure=lambda name, ms: lambda: 1.0,
                            params=ScaleParams(x), base=ScaleParams(x), budget=_budget(100))
    pieces, last, more = [], [0, 0, 0], True
    while more:
        more = next(steps, StopIteration) is not StopIteration
        now = [c.calls for c in tied]
        pieces.append([b - a for a, b in zip(last, now)])
        last = now
    assert pieces[:4] == [[8, 0, 0], [160, 0, 0], [0, 160, 0], [0, 0, 160]]  # the short measure, then one each
    together = [p for p in pieces if sum(n > 0 for n in p) > 1]
    assert len(together) == 1 and together[0][0] == 160  # the finalists again: the choice and the cheaper one
    assert len(pieces) >= 4 + 1 + 2 + CONFIRM_PAIRS  # then two captures and the pairs, a piece each
    assert report.choice in ("a", "b") and "tied on device time" in report.candidates["choice"].reason


def test_each_timed_measurement_lasts_the_timers_target_the_graph_timers_half_a_millisecond():
    """The rounds repeat a candidate until a measurement lasts the timer's target: for the graph timer 0.5 ms
    (replays of one pass, 0.05 ms, ranked ~13 us kernels by something other than their time on an H100:
    ``benchmarks/results/logsumexp_backward_rank_probe-NVIDIA_H100_80GB_HBM3.txt``)."""
    from tunekit.tunable.timing import CpuTimer, CudaGraphTimer, CudaQueuedTimer

    assert CudaGraphTimer.target_ms == 0.5 and CudaQueuedTimer.target_ms == 0.05  # eager fallback: as before
    clock = FakeClock()
    op = make_op(clock, {"ref": 0.02, "fast": 0.01})
    reps = []

    class RecordingTimer(CpuTimer):
        target_ms = CudaGraphTimer.target_ms  # CpuTimer's own is 0.5 too: this is the graph timer's

        def prepare(self, fn, n):
            reps.append(n)
            return super().prepare(fn, n)

    with tuning() as s:
        report = find_fastest(op, ScaleParams(torch.randn(100)), s, clock=clock, timer=RecordingTimer(clock))
    assert report.choice == "fast" and report.complete
    assert reps and min(reps) * 0.01 >= 0.5 - 1e-9  # the fastest candidate's 0.01 ms per run, 50 runs a replay


@pytest.mark.parametrize("target_ms, rounds", [(0.5, 5), (1.0, MIN_ROUNDS), (2.0, MIN_ROUNDS), (0.05, MAX_ROUNDS)])
def test_timed_rounds_stop_once_each_candidate_is_measured_enough(target_ms, rounds):
    """With budget to spare, the rounds end once a candidate's samples add up to ENOUGH_MS (2.5 ms), never before
    MIN_ROUNDS: 5 rounds of the graph timer's 0.5 ms replays, 3 of 1 ms samples, 3 of 2 ms (enough after 2, yet
    MIN_ROUNDS); the eager timers' 0.05 ms samples go on to MAX_ROUNDS as before."""
    from tunekit.tunable.timed_rounds import ENOUGH_MS
    from tunekit.tunable.timing import CpuTimer

    assert ENOUGH_MS == 2.5
    clock = FakeClock()
    op = make_op(clock, {"ref": 0.02, "fast": 0.01})
    samples = []

    class CountingTimer(CpuTimer):
        def prepare(self, fn, reps):
            measure = super().prepare(fn, reps)

            def counted():
                samples.append(reps)
                return measure()
            return counted

    CountingTimer.target_ms = target_ms
    with tuning(max_tuning_ms=1000.0) as s:
        report = find_fastest(op, ScaleParams(torch.randn(100)), s, clock=clock, timer=CountingTimer(clock))
    assert report.choice == "fast" and report.complete
    assert len(samples) == 2 * rounds  # both candidates timed, one sample each per round


def test_after_a_failed_capture_eager_measurements_last_the_eager_timers_target(monkeypatch):
    """A graph timer with a long target (here 5 ms, 5-6 runs of the fastest) whose capture fails for one candidate:
    the eager measurements from then on repeat the runs to the eager timer's own target (0.5 ms: 1 run),
    not the graph timer's."""
    from tunekit.tunable import TunekitWarning, timed_rounds
    from tunekit.tunable.timing import CpuTimer

    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 1.0, "medium": 1.5})
    graph_reps, eager_reps = [], []

    class LongGraphTimer(CpuTimer):
        target_ms = 5.0

        def prepare(self, fn, reps):
            before = dict(op.runs)
            fn()
            if op.runs["fast"] > before.get("fast", 0):
                raise RuntimeError("operation not permitted when stream is capturing")
            graph_reps.append(reps)
            return super().prepare(fn, reps)

    class EagerTimer(CpuTimer):
        def prepare(self, fn, reps):
            eager_reps.append(reps)
            return super().prepare(fn, reps)

    monkeypatch.setattr(timed_rounds, "make_timer", lambda device, graph, clock: EagerTimer(clock))
    with tuning() as s, pytest.warns(TunekitWarning, match="timed eagerly"):
        report = find_fastest(op, ScaleParams(torch.randn(100)), s, clock=clock, timer=LongGraphTimer(clock))
    assert report.choice == "fast"
    assert graph_reps and min(graph_reps) >= 5 and eager_reps and set(eager_reps) == {1}


def test_a_candidate_that_cannot_be_captured_is_timed_eagerly_with_a_warning():
    """A graph timer whose capture fails for one candidate (here: every "fast" capture): the session times on
    eager launches from then on and says so, naming the candidate; the choice is still the fastest."""
    from tunekit.tunable import TunekitWarning
    from tunekit.tunable.timing import CpuTimer

    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 1.0, "medium": 1.5})

    class CapturingTimer(CpuTimer):
        def prepare(self, fn, reps):
            before = dict(op.runs)
            fn()  # the capture's warm-up run: which candidate it is
            if op.runs["fast"] > before.get("fast", 0):
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().prepare(fn, reps)

    with tuning() as s, pytest.warns(TunekitWarning, match="fast could not be timed in a CUDA graph"):
        report = find_fastest(op, ScaleParams(torch.randn(100)), s, clock=clock, timer=CapturingTimer(clock))
    assert report.choice == "fast" and report.complete
