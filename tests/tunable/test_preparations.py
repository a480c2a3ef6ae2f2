"""Background preparations (tunable/preparations.py): a session parked on its compiles runs its
incumbent from the op's cache without the resolve path, resumes once a compile ended; compiles that
will not be checked are cancelled."""

import threading
import time

import torch

from tunekit.tunable import preparations, tuning
from tunekit.tunable.preparations import ParkedChoice, Preparations

from fakes import FakeClock, ScaleParams, make_op


def _blocking_candidate(op, name: str, gate: threading.Event, prepared: list):
    """Replace ``name`` in ``op`` by the same fake with a prepare() that blocks until ``gate`` is set."""
    fake = op.candidate(name)

    class Prepared:
        def __init__(self):
            self.name, self.run, self.supports, self.source_hash = fake.name, fake.run, fake.supports, fake.source_hash

        @staticmethod
        def prepare(params):
            gate.wait(timeout=30)
            prepared.append(name)

    op.candidates[op.candidates.index(fake)] = op._by_name[name] = Prepared()


def _wait_for(test, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not test() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert test()


def test_a_parked_session_runs_its_incumbent_from_the_cache_without_resolving(monkeypatch):
    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 0.5})
    op.clock = clock
    gate, prepared = threading.Event(), []
    _blocking_candidate(op, "fast", gate, prepared)
    resolves = []
    resolve = op.resolve
    monkeypatch.setattr(op, "resolve", lambda *a, **k: resolves.append(1) or resolve(*a, **k))
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0) as s:
        for _ in range(3):  # the session starts, then stops: its only challenger is compiling
            torch.testing.assert_close(op(ScaleParams(x)), x * 2)
        parked = op._choices[s.cache_id][ScaleParams(x).cache_key()]
        assert isinstance(parked, ParkedChoice) and parked.name == "ref"
        before, (calls_before,) = len(resolves), op.session_calls().values()
        for _ in range(50):
            torch.testing.assert_close(op(ScaleParams(x)), x * 2)
        assert len(resolves) == before, "a parked session's calls must not go through resolve"
        assert op.session_calls() == {(s.cache_id, ScaleParams(x).signature()): calls_before + 50}  # each counted
        assert calls_before >= 2  # the calls that resumed it were counted too
        assert op.runs["fast"] == 0 and op.tuning_in_progress(ScaleParams(x))
        gate.set()
        _wait_for(lambda: prepared)
        _wait_for(lambda: not parked.session.parked())  # the done-callback counts after prepare returns
        for _ in range(200):
            op(ScaleParams(x))
            if not op.tuning_in_progress(ScaleParams(x)):
                break
        assert len(resolves) > before  # resumed once the compile ended
        assert op.decision(ScaleParams(x)).candidate.name == "fast"
        assert op._choices[s.cache_id][ScaleParams(x).cache_key()] is op.candidate("fast")


def _occupy_workers(gate: threading.Event) -> list:
    """Keep every preparation worker busy until ``gate`` is set; their futures."""
    started = threading.Semaphore(0)

    def hold():
        started.release()
        gate.wait(timeout=30)
    futures = [preparations.preparer().submit(hold) for _ in range(preparations.PREPARE_WORKERS)]
    for _ in futures:
        assert started.acquire(timeout=30)
    return futures


def _release(gate: threading.Event, held: list) -> None:
    """Let the workers go and wait until every queued preparation ran or was cancelled."""
    gate.set()
    for f in held:
        f.result(timeout=30)
    preparations.preparer().submit(lambda: None).result(timeout=30)  # the queue drained


def test_preparations_not_started_are_cancelled_and_counted_as_ended():
    gate, ran = threading.Event(), []
    held = _occupy_workers(gate)
    try:
        p = Preparations()
        p.start("a", ran.append, "a")
        p.start("b", ran.append, "b")
        assert not p.ready("a") and p.ready("never started") and p.first_pending() is not None
        p.cancel("a")
        assert p.ready("a") and not p.ready("b") and p.finished == 1
        p.cancel()
        assert p.ready("b") and p.first_pending() is None and p.finished == 2
    finally:
        _release(gate, held)
    assert ran == []


def test_a_finished_or_forgotten_session_leaves_no_compile_queued():
    """forget() drops the sessions: their compiles that have not started never run."""
    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 0.5, "medium": 1.0})
    op.clock = clock
    gate, prepared = threading.Event(), []
    _blocking_candidate(op, "fast", gate, prepared)
    _blocking_candidate(op, "medium", gate, prepared)
    held = _occupy_workers(gate)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
            op(ScaleParams(torch.randn(64)))
            session = next(iter(op._sessions.values()))
            op.forget()
        assert session.preparations.first_pending() is None
    finally:
        _release(gate, held)
    assert prepared == []


def _compiling_op(costs: dict, cap=None):
    """A fake op whose every challenger has a prepare() that returns at once (a compile): which ran."""
    clock = FakeClock()
    op = make_op(clock, costs)
    op.clock = clock
    prepared = []
    for name in list(costs)[1:]:
        gate = threading.Event()
        gate.set()
        _blocking_candidate(op, name, gate, prepared)
    op.online_preparations = cap
    return op, prepared


def _called_until_decided(op, x, calls: int = 500):
    """``op`` called on ``x`` until its tuning ends (at most ``calls`` calls, the workers given a
    millisecond between them to finish their compiles); the decision."""
    for _ in range(calls):
        op(ScaleParams(x))
        if not op.tuning_in_progress(ScaleParams(x)):
            break
        time.sleep(0.001)
    return op.decision(ScaleParams(x))


def test_an_online_session_compiles_at_most_the_ops_cap_in_its_order_and_is_complete():
    op, prepared = _compiling_op({"ref": 4.0, "a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}, cap=2)
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
        r = _called_until_decided(op, x)
    assert sorted(prepared) == ["a", "b"]  # the first two in the op's order; c and d never compiled
    assert r.candidate.name == "b" and r.entry.complete
    for name in ("c", "d"):
        record = r.entry.candidates[name]
        assert record.status == "skipped" and "offline tuning tries every one" in record.reason


def test_offline_tuning_ignores_the_cap():
    from tunekit.tunable.find_fastest import find_fastest
    op, prepared = _compiling_op({"ref": 4.0, "a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}, cap=2)
    with tuning(max_tuning_ms=1000.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(torch.randn(64)), s, clock=op.clock)
    assert report.choice == "d" and report.complete


def test_a_spent_budget_ends_the_session_without_waiting_for_compiles():
    """The default's reference and probe spend the budget: the challenger still compiling is skipped
    at once (no call waits for it) and its compile, not started, never runs."""
    clock = FakeClock()
    op = make_op(clock, {"ref": 30.0, "fast": 0.5})
    op.clock = clock
    gate, prepared = threading.Event(), []
    _blocking_candidate(op, "fast", gate, prepared)
    held = _occupy_workers(gate)
    try:
        with tuning(tuning_step_ms=1000.0, max_tuning_ms=50.0):
            x = torch.randn(64)
            for _ in range(5):
                op(ScaleParams(x))
            r = op.decision(ScaleParams(x))
        assert r is not None and r.candidate.name == "ref" and not r.entry.complete
        assert r.entry.candidates["fast"].status == "skipped"
    finally:
        _release(gate, held)
    assert prepared == []


def test_a_default_no_challenger_could_beat_by_the_ops_floor_is_chosen_without_compiling():
    """op.challenger_host_ms: when the default's probe is under what a challenger must save (here no
    bound on the fastest possible time: ScaleParams has none), nothing is compiled and the default is
    the complete choice; with a slow default the challengers are compiled and timed as before."""
    op, prepared = _compiling_op({"ref": 0.004, "a": 0.001, "b": 0.0005})
    op.challenger_host_ms = 0.010
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
        for _ in range(50):
            op(ScaleParams(x))
            if not op.tuning_in_progress(ScaleParams(x)):
                break
        r = op.decision(ScaleParams(x))
    assert prepared == [] and r.candidate.name == "ref" and r.entry.complete
    assert all("cannot save 10.0 us" in r.entry.candidates[n].reason for n in ("a", "b", "ref"))
    slow, prepared_slow = _compiling_op({"ref": 4.0, "a": 1.0})
    slow.challenger_host_ms = 0.010
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
        assert _called_until_decided(slow, x).candidate.name == "a" and prepared_slow == ["a"]


def test_challengers_that_cannot_save_their_own_floor_are_skipped_and_the_rest_compile_and_complete():
    """A floor per candidate (op.challenger_floor): with a 4 us default, "a" (floor 10 us) cannot win
    and is skipped, its compile never started; "b" (floor 0) compiles from the screen on, is timed and
    chosen, and the entry is complete (the skipped one was left out by design)."""
    op, prepared = _compiling_op({"ref": 0.004, "a": 0.001, "b": 0.002})
    op.challenger_floor = lambda params, c: 0.010 if c.name == "a" else 0.0
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=1000.0):
        r = _called_until_decided(op, x)
    assert prepared == ["b"] and r.candidate.name == "b" and r.entry.complete
    assert r.entry.candidates["a"].status == "skipped" and "cannot save 10.0 us" in r.entry.candidates["a"].reason
