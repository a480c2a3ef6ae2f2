"""Tuning spread over calls (tunable/session.py through a TunableOp), with a fake clock: every
decision rule of a session, deterministic."""

import threading
import time

import pytest
import torch

from tunekit.tunable import results_store, session, tuning, validators
from tunekit.tunable.find_fastest import find_fastest
from tunekit.tunable.margin_rule import floor_ms
from tunekit.tunable.session import DECISIVE, MIN_ROUNDS

from fakes import FakeClock, ScaleParams, make_op


CPU = validators.device_name(torch.device("cpu"))


def fresh_op(costs, **kw):
    clock = FakeClock()
    op = make_op(clock, costs, **kw)
    op.clock = clock
    return op, clock


def call_costs(op, clock, x, calls, **settings):
    """Run ``calls`` calls; per call, (clock ms spent, the candidate that ran the call's own result)."""
    out = []
    with tuning(**settings):
        for _ in range(calls):
            before, runs = clock(), dict(op.runs)
            op(ScaleParams(x))
            out.append(((clock() - before) * 1e3, {n: op.runs[n] - runs.get(n, 0) for n in op.runs}))
    return out


def test_tuning_is_spread_over_calls_each_within_its_step_and_finishes():
    op, clock = fresh_op({"ref": 2.0, "fast": 1.0, "medium": 1.5})
    x = torch.randn(64)
    costs = call_costs(op, clock, x, 80, tuning_step_ms=4.0, max_tuning_ms=1000.0)
    # a call's tuning starts no piece of work its recent pieces say would not fit (a piece longer
    # than predicted may still end past the step: here <= 2 ms x the sets), plus the call's own run
    assert all(ms <= 4.0 + 2.0 + 2.0 for ms, _ in costs), costs
    signature = ScaleParams(x).signature()
    entry = results_store().get("scale", signature, CPU)
    assert entry is not None and entry.complete and entry.choice == "fast"
    finished = next(i for i, (ms, runs) in enumerate(costs) if ms == pytest.approx(1.0))
    assert finished > 1  # it took several calls...
    assert all(ms == pytest.approx(1.0) for ms, _ in costs[finished:])  # ...then every call is the winner alone


@pytest.mark.parametrize("piece_ms, share_ms, per_call_ms",
                         [(3.0, 10.0, 6.0), (2.0, 10.0, 8.0), (15.0, 10.0, 15.0), (4.0, 10.0, 8.0), (2.4, 10.0, 7.2)])
def test_a_call_starts_no_piece_of_work_that_would_not_fit_its_share(piece_ms, share_ms, per_call_ms):
    """The per-call cap: four 2 ms pieces fit a 10 ms share and a fifth would not (without the
    look-ahead, the call ended at 10 ms or later); a piece longer than the share still runs, alone, so
    that tuning progresses; the last STEP_SLACK of the share is the call's own and a late piece's (a
    third 3 ms piece or a fourth 2.4 ms one would end past 8.5 ms)."""
    op, clock = fresh_op({"ref": 1.0, "fast": 0.5})
    with tuning(max_tuning_ms=1e6) as s:
        tuning_session = session.TuningSession(op, ScaleParams(torch.randn(8)), s, clock=clock)

    def pieces():
        while True:
            clock.advance(piece_ms)
            yield
    tuning_session._steps = pieces()
    spent = []
    for _ in range(5):
        before = clock()
        assert tuning_session.advance(share_ms) is False
        spent.append(round((clock() - before) * 1e3, 6))
    assert spent == [per_call_ms] * 5


def test_a_step_of_the_whole_budget_keeps_no_slack():
    """A step as large as the budget tunes in one blocking call: no share is left for the call's
    own work (four 2.4 ms pieces in a 10 ms step, as without STEP_SLACK)."""
    op, clock = fresh_op({"ref": 1.0, "fast": 0.5})
    with tuning(max_tuning_ms=10.0) as s:
        tuning_session = session.TuningSession(op, ScaleParams(torch.randn(8)), s, clock=clock)

    def pieces():
        while True:
            clock.advance(2.4)
            yield
    tuning_session._steps = pieces()
    before = clock()
    tuning_session.advance(10.0)
    assert round((clock() - before) * 1e3, 6) == 9.6


def test_a_tie_break_is_spread_over_calls_that_run_the_device_time_choice_and_stored_once_ended(monkeypatch):
    """The host-time tie-break (CUDA only: faked here, three pieces of 15 ms) is pieces of the session's work: no two
    in one 20 ms call, the calls meanwhile run the device-time choice, the entry is stored only once it ended, with
    its verdict."""
    pieces = []

    def tie_break(report, survivors, times, remeasure, params, base, budget):
        for i in range(3):
            clock.advance(15.0)
            pieces.append(i)
            yield
        report.choice = "medium"

    monkeypatch.setattr(session, "host_time_steps", tie_break)
    monkeypatch.setattr(session.TuningSession, "_breaks_ties", lambda self, rounds_done: rounds_done)
    op, clock = fresh_op({"ref": 2.0, "fast": 1.0, "medium": 1.02})
    x = torch.randn(64)
    signature, calls = ScaleParams(x).signature(), []
    with tuning(tuning_step_ms=20.0, max_tuning_ms=1000.0):
        while results_store().get("scale", signature, CPU) is None:
            before = len(pieces)
            name = op.resolve(ScaleParams(x)).candidate.name
            if pieces:
                calls.append((len(pieces) - before, name))
    assert [n for n, _ in calls] == [1, 1, 1, 0]  # a piece a call, then the call that ends the session
    assert [name for _, name in calls] == ["fast", "fast", "fast", "medium"]  # the device-time choice meanwhile
    assert results_store().get("scale", signature, CPU).choice == "medium"


def test_calls_run_the_default_until_a_challenger_is_decisive_then_the_challenger():
    op, clock = fresh_op({"ref": 10.0, "fast": 1.0})
    x = torch.randn(64)
    with tuning(tuning_step_ms=1.0, max_tuning_ms=1000.0):
        r = op.resolve(ScaleParams(x))
        assert r.candidate.name == "ref" and not r.cache and "in progress" in r.why
        seen = [op.resolve(ScaleParams(x)).candidate.name for _ in range(6)]
    assert "fast" in seen and seen[-1] == "fast"  # checked and probed 10x faster: runs from then on


def test_budget_spent_with_a_decisive_challenger_takes_it():
    op, clock = fresh_op({"ref": 4.0, "fast": 1.0})
    x = torch.randn(64)
    with tuning(max_tuning_ms=10.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
    assert report.choice == "fast" and not report.complete
    assert "decisive" in report.candidates["fast"].reason


def test_budget_spent_with_an_ambiguous_challenger_keeps_the_default():
    ratio = 1.0 / (DECISIVE * 0.95)  # faster than the margin, not decisive
    op, clock = fresh_op({"ref": 4.0, "close": 4.0 * ratio})
    x = torch.randn(64)
    with tuning(max_tuning_ms=12.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
    assert not report.complete
    assert report.choice == "ref" and "only a decisive lead counts" in report.candidates["close"].reason
    with tuning(max_tuning_ms=1000.0, tuning_step_ms=float("inf")) as s:  # with the rounds: the margin rule
        assert find_fastest(op, ScaleParams(x), s, clock=clock).choice == "close"


def test_a_challenger_must_save_more_device_time_than_its_call_adds_on_the_host():
    """op.challenger_host_ms: a 10% faster challenger saving 0.4 ms is kept out by a 0.5 ms floor, one
    saving 0.6 ms is not (fake times in ms)."""
    op, clock = fresh_op({"ref": 4.0, "close": 3.6})
    op.challenger_host_ms = 0.5
    x = torch.randn(64)
    with tuning(max_tuning_ms=1000.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
        assert report.choice == "ref" and report.complete
        assert "less than the 500.0 us of host time" in report.candidates["close"].reason
        op2, clock2 = fresh_op({"ref": 6.0, "close": 5.4})
        op2.challenger_host_ms = 0.5
        assert find_fastest(op2, ScaleParams(x), s, clock=clock2).choice == "close"


def test_a_floor_per_candidate_chooses_the_fastest_challenger_that_saves_its_own():
    """op.challenger_floor(params, candidate): the fastest challenger, whose call costs the host 2 ms
    more, saves only 1.5 ms and is kept out; the next, whose call costs nothing more, saves 1.0 ms and
    is chosen; with every floor at 2 ms the default stays (fake times in ms)."""
    op, clock = fresh_op({"ref": 4.0, "fastest": 2.5, "next": 3.0})
    floors = {"fastest": 2.0, "next": 0.0, "ref": 2.0}
    seen = []

    def rule(params, candidate):
        seen.append((type(params).__name__, params.out))
        return floors[candidate.name]
    op.challenger_floor = rule
    x = torch.randn(64)
    with tuning(max_tuning_ms=1000.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
        assert report.choice == "next" and report.complete
        assert report.candidates["next"].reason == "the fastest that saves its floor"
        assert "less than the 2000.0 us of host time" in report.candidates["fastest"].reason
        assert set(seen) == {("ScaleParams", None)}  # the call as made: an out it left to the op, not the trial's
        floors["next"] = 2.0
        op.forget()
        assert find_fastest(op, ScaleParams(x), s, clock=clock).choice == "ref"
    assert floor_ms(op, ScaleParams(x), op.candidate("next")) == 2.0
    op.challenger_floor = None
    op.challenger_host_ms = 0.25
    assert floor_ms(op, ScaleParams(x), op.candidate("next")) == 0.25


def test_a_challenger_that_fails_the_numerical_check_never_runs_however_fast():
    op, clock = fresh_op({"ref": 10.0, "wrong": 0.01, "nan": 0.01}, behaviours={"wrong": "wrong", "nan": "half"})
    x = torch.randn(64)
    costs = call_costs(op, clock, x, 30, tuning_step_ms=2.0, max_tuning_ms=1000.0)
    for ms, runs in costs:  # the check runs them once each, on proxies; no call ever returns their result
        assert runs.get("ref", 0) >= 1
    result = op(ScaleParams(x))
    torch.testing.assert_close(result, 2 * x)
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert entry.choice == "ref" and entry.candidates["wrong"].status == "numerics"


def test_every_call_during_tuning_gives_the_right_values():
    op, clock = fresh_op({"ref": 3.0, "fast": 1.0, "wrong": 0.1}, behaviours={"wrong": "wrong"})
    for i in range(25):
        x = torch.randn(64)  # one signature, fresh values every call: each answer must be 2x
        with tuning(tuning_step_ms=2.0, max_tuning_ms=1000.0):
            torch.testing.assert_close(op(ScaleParams(x)), 2 * x)


def test_the_session_tunes_its_own_copy_of_the_inputs():
    """The caller may change its tensor between calls: checks compare candidates on the session's copy."""
    op, clock = fresh_op({"ref": 3.0, "fast": 1.0})
    x = torch.randn(64)
    with tuning(tuning_step_ms=2.0, max_tuning_ms=1000.0):
        op(ScaleParams(x))
        for _ in range(80):
            x.add_(1.0)  # in place, same signature
            torch.testing.assert_close(op(ScaleParams(x)), 2 * x)
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert entry.choice == "fast" and entry.candidates["fast"].status == "chosen"


def test_an_incomplete_entry_is_resumed_by_the_next_process_from_its_choice():
    op, clock = fresh_op({"ref": 4.0, "fast": 1.0})
    x = torch.randn(64)
    with tuning(max_tuning_ms=10.0, tuning_step_ms=float("inf")):
        op(ScaleParams(x))
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert entry.choice == "fast" and not entry.complete
    op.forget()  # a new process
    with tuning(max_tuning_ms=1000.0, tuning_step_ms=1.0):
        r = op.resolve(ScaleParams(x))
        assert r.candidate.name == "fast" and "in progress" in r.why  # the stored choice runs meanwhile
        while not r.cache:
            r = op.resolve(ScaleParams(x))
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert entry.complete and entry.choice == "fast"


def compiled_on_release(op, name: str):
    """Give candidate ``name`` a prepare() (a compile) that blocks until the returned Event is set;
    the list gets each params it prepared."""
    compiled, prepared = threading.Event(), []
    wrapped = op.candidate(name)

    class Prepared:  # the fake candidate, plus a prepare() that blocks until the test says
        def __init__(self):
            self.name, self.run, self.supports = wrapped.name, wrapped.run, wrapped.supports
            self.source_hash = wrapped.source_hash

        @staticmethod
        def prepare(params):
            compiled.wait(timeout=30)
            prepared.append(params)

    op.candidates[op.candidates.index(wrapped)] = op._by_name[name] = Prepared()
    return compiled, prepared


def wait_until(done) -> None:
    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:  # the worker finishes on its own
        time.sleep(0.001)


def test_background_preparation_is_never_waited_for_by_a_call():
    """A candidate with prepare() (a compile) is prepared on the worker thread: calls before it is
    ready run the incumbent and return at once (no wait); a call after it is ready checks it."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    compiled, prepared = compiled_on_release(op, "fast")
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
        for _ in range(3):
            assert op.resolve(ScaleParams(x)).candidate.name == "ref"
        assert op.runs["fast"] == 0 and not prepared
        session = next(iter(op._sessions.values()))
        assert session.waited_ms == 0.0
        compiled.set()
        wait_until(lambda: prepared)
        for _ in range(200):
            r = op.resolve(ScaleParams(x))
            if r.cache:
                break
    assert prepared and r.candidate.name == "fast" and op.runs["fast"] >= 2 + MIN_ROUNDS


def test_candidates_with_nothing_to_compile_leave_part_of_the_budget_to_those_compiling():
    """Eight ready candidates (cuBLASLt's algorithms: no compile) would spend the whole budget before the
    compiled one (a Triton kernel, 8x faster) is ready: they stop at PREPARED_RESERVE of it, the calls
    run the default while it compiles, and once ready it is checked, probed and, decisive, chosen."""
    slow = {f"ready{i}": 3.9 for i in range(8)}
    op, clock = fresh_op({"ref": 4.0, **slow, "fast": 0.5})
    compiled, prepared = compiled_on_release(op, "fast")
    x = torch.randn(64)
    budget = 40.0
    with tuning(tuning_step_ms=5.0, max_tuning_ms=budget):
        for _ in range(50):
            assert op.resolve(ScaleParams(x)).candidate.name == "ref"
        try:
            under_way = next(iter(op._sessions.values()))
            spent = under_way.budget.spent_ms()
            assert 0 < op.runs["ready0"] and op.runs["ready7"] == 0  # the ready ones ran until the reserve
            assert budget * (1 - session.PREPARED_RESERVE) <= spent < budget
            assert under_way.parked()  # nothing left to do but wait: calls no longer resume the session
        finally:
            compiled.set()  # a failed assertion must not leave the worker blocked for the next tests
        wait_until(lambda: prepared)
        for _ in range(200):
            r = op.resolve(ScaleParams(x))
            if r.cache:
                break
    assert r.candidate.name == "fast", r.why
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert entry.choice == "fast" and entry.candidates["fast"].status == "chosen"


def test_without_compiles_under_way_ready_candidates_use_the_whole_budget():
    slow = {f"ready{i}": 3.9 for i in range(8)}
    op, clock = fresh_op({"ref": 4.0, **slow, "fast": 0.5})
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=40.0):
        for _ in range(100):
            if op.resolve(ScaleParams(x)).cache:
                break
    entry = results_store().get("scale", ScaleParams(x).signature(), CPU)
    assert not entry.complete and entry.candidates["ready4"].status != "skipped"


def test_explain_completes_a_tuning_in_progress():
    from tunekit.tunable import explain

    op, clock = fresh_op({"ref": 2.0, "fast": 1.0})
    x = torch.randn(64)
    with tuning(tuning_step_ms=1.0, max_tuning_ms=1000.0):
        assert not op.resolve(ScaleParams(x)).cache
        e = explain(op, x)
    assert e.chosen == "fast" and e.complete


def test_the_support_screen_is_not_charged_to_the_budget(monkeypatch):
    """The screen's first run in a process imports the backends (Triton's GEMM kernels: ~0.4 s on the
    H200 host): charged to a 200 ms budget, it left no candidate checked."""
    op, clock = fresh_op({"ref": 4.0, "fast": 1.0})
    screen = session.supports

    def slow_first_import(c, p):
        clock.advance(1000.0)
        return screen(c, p)
    monkeypatch.setattr(session, "supports", slow_first_import)
    x = torch.randn(64)
    with tuning(max_tuning_ms=100.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
    assert report.choice == "fast" and report.complete, report.candidates
    assert report.tuning_ms < 100.0
