"""A shipped choice that must be prepared (compiled, loaded) before its first run (tunable/shipped.py
Preparation): the default or a stand-in meanwhile, a failed choice leaving the next fastest runnable
candidate, preparations in the caller's settings."""

import dataclasses
import threading
import time

import pytest
import torch

from tunekit.tunable import TunekitWarning, context, results_store, shipped, tuning

from fakes import ScaleParams, make_op
from shipped_helpers import Preparing, compiling, op_whose, ship, tuned_entry, with_prepare


def test_a_shipped_choice_that_compiles_runs_once_prepared_and_the_default_until_then(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    release, started, seen = threading.Event(), threading.Event(), []
    op = op_whose("medium", lambda p: (seen.append(threading.current_thread().name), started.set(), release.wait(30)))
    with tuning(max_tuning_ms=1):
        op(ScaleParams(x))  # its compile runs on a worker: the first call waits 1 ms (the budget), then runs the default
        op(ScaleParams(x))
        assert dict(op.runs) == {"ref": 2} and op.decision(ScaleParams(x)) is None
        # the worker may not have begun within those calls on a loaded host (CI, 2 cores): wait for it
        assert started.wait(30) and seen[0] != threading.current_thread().name and len(seen) == 1  # prepared once
    release.set()
    assert "shipped" in op.resolve(ScaleParams(x), finish=True).why  # finish: waits for the worker
    op(ScaleParams(x))
    assert op.runs["medium"] == 1 and "shipped" in op.decision(ScaleParams(x)).why
    assert len(results_store()) == 0


@pytest.mark.parametrize("budget_ms", [30_000, 0.5])
def test_a_shipped_choice_whose_compile_fails_leaves_the_next_fastest_for_good_with_a_warning(ship, tmp_path,
                                                                                            budget_ms):
    """The choice cannot be prepared here (a compile error; an optional backend not installed): the
    fastest other candidate the entry timed ("fast", 1.0 against the default's 2.0) runs from then on,
    not the default; with a budget too short to wait for it, the default runs until it is ready."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])

    def prepare(p):
        raise RuntimeError("ptxas exploded")
    op = op_whose("medium", prepare)
    with tuning(max_tuning_ms=budget_ms), pytest.warns(TunekitWarning, match="ptxas exploded"):
        op(ScaleParams(x))
        op.resolve(ScaleParams(x), finish=True)
        op(ScaleParams(x))
    decision = op.decision(ScaleParams(x))
    assert "could not be prepared" in decision.why and decision.candidate.name == "fast"
    assert op.runs["fast"] >= 1 and op.runs["medium"] == 0 and op.runs["ref"] <= 1


def test_a_failed_choice_never_builds_a_slow_stand_in(ship, tmp_path):
    """The choice failed and its next fastest builds slowly (``slow_build``: a child process of seconds on
    the one stand-in worker, which every op's stand-ins share): not built before, it is passed over for
    good, even for the final stand-in; the default runs."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])

    def prepare(p):
        raise RuntimeError("quack-kernels is not installed")
    op = op_whose("medium", prepare)
    compiled = []
    slow = type("SlowBuild", (Preparing,), {"slow_build": True})
    op._by_name["fast"] = slow(op.candidate("fast"), compiling(compiled.append))
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="not installed"):
        op(ScaleParams(x))
        op.resolve(ScaleParams(x), finish=True)
        op(ScaleParams(x))
    assert compiled == [] and op.runs["fast"] == 0 and op.runs["medium"] == 0 and op.runs["ref"] == 2


def test_a_choice_failing_after_the_first_call_leaves_the_stand_in_once_it_is_ready(ship, tmp_path):
    """Later calls (which wait for nothing) meet the failure: the stand-in is prepared then, the default
    runs undecided until it is ready, and then it is the decision, not the default."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    fail, ready = threading.Event(), threading.Event()

    def prepare(p):
        fail.wait(30)
        raise RuntimeError("ptxas exploded")
    op = with_prepare(op_whose("medium", prepare), "fast", lambda p: ready.wait(30))
    with tuning(max_tuning_ms=0.5), pytest.warns(TunekitWarning, match="fast .timed next fastest. runs"):
        op(ScaleParams(x))  # pending: the default
        fail.set()
        time.sleep(0.05)
        op(ScaleParams(x))  # the failure met; the stand-in preparing: the default again, undecided
        assert op.decision(ScaleParams(x)) is None and dict(op.runs) == {"ref": 2}
        ready.set()
        deadline = time.perf_counter() + 10
        while op.decision(ScaleParams(x)) is None and time.perf_counter() < deadline:
            op(ScaleParams(x))
            time.sleep(0.01)
    assert op.decision(ScaleParams(x)).candidate.name == "fast" and op.runs["fast"] >= 1


def test_a_stand_in_slower_to_prepare_than_the_choice_to_fail_is_waited_for_within_the_budget(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])

    def prepare(p):
        time.sleep(0.05)
        raise RuntimeError("ptxas exploded")
    op = with_prepare(op_whose("medium", prepare), "fast", lambda p: time.sleep(0.3))
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="fast .timed next fastest. runs"):
        op(ScaleParams(x))
    assert dict(op.runs) == {"fast": 1} and op.decision(ScaleParams(x)).candidate.name == "fast"


def test_a_stand_in_that_cannot_run_here_gives_way_to_the_next(ship, tmp_path):
    """A machine without the shipped choice's optional backend (quack-kernels): the choice ("fast")
    cannot be prepared and the next fastest ("quick", of the same backend) refuses the input; the one
    after it ("medium", 1.5 against the default's 2.0) runs for good."""
    x = torch.randn(64)
    costs = {"ref": 2.0, "fast": 1.0, "quick": 1.2, "medium": 1.5}
    ship([dataclasses.replace(tuned_entry(x, tmp_path, costs), choice="fast")])
    op = make_op(None, costs)
    missing = Preparing(op.candidate("fast"), lambda p: (_ for _ in ()).throw(RuntimeError("quack-kernels is not installed")))
    refusing = Preparing(op.candidate("quick"), None)
    refusing.supports = lambda p: "quack-kernels is not installed"
    for c in (missing, refusing):
        op.candidates[op.candidates.index(c.inner)] = c
        op._by_name[c.name] = c
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="medium .timed next fastest. runs"):
        op(ScaleParams(x))
    op(ScaleParams(x))
    assert dict(op.runs) == {"medium": 2} and op.decision(ScaleParams(x)).candidate.name == "medium"


def test_a_failed_shipped_choice_with_no_faster_candidate_timed_leaves_the_default(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="fast")])  # the next fastest, medium, is 1.5 vs 2.0

    def prepare(p):
        raise RuntimeError("no backend")
    costs_op = op_whose("fast", prepare)
    costs_op._by_name.pop("medium")  # no other timed candidate beats the default
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="the default runs"):
        costs_op(ScaleParams(x))
    assert dict(costs_op.runs) == {"ref": 1} and costs_op.decision(ScaleParams(x)).candidate.name == "ref"


def test_finishing_a_signature_waits_for_its_shipped_choice(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    release = threading.Event()
    op = op_whose("medium", lambda p: release.wait(30))
    with tuning(max_tuning_ms=1):
        assert op.resolve(ScaleParams(x)).candidate.name == "ref"  # not ready: the default, not cached
        threading.Timer(0.05, release.set).start()
        assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"


def test_a_shipped_choice_that_compiles_within_the_budget_runs_at_the_first_call(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    op = op_whose("medium", lambda p: None)  # a warm compile cache: ready at once
    with tuning(max_tuning_ms=30_000):
        op(ScaleParams(x))
    assert dict(op.runs) == {"medium": 1} and "shipped" in op.decision(ScaleParams(x)).why


def test_a_stand_in_runs_while_a_slow_shipped_choice_prepares(ship, tmp_path):
    """The choice waits on a compiler (a process's first Triton import): after STAND_IN_AFTER_MS the
    fastest other candidate the entry timed ("fast", 1.0 against the default's 2.0) is prepared and
    runs, without the first call waiting out the budget; the choice takes over once ready."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    release = threading.Event()
    op = op_whose("medium", lambda p: release.wait(30))
    with tuning(max_tuning_ms=20_000):
        t0 = time.perf_counter()
        op(ScaleParams(x))
        assert time.perf_counter() - t0 < 5.0  # not the 20 s budget
        op(ScaleParams(x))
        assert dict(op.runs) == {"fast": 2} and op.decision(ScaleParams(x)) is None
        assert "fast (timed next fastest) runs meanwhile" in op.resolve(ScaleParams(x)).why
        release.set()
        assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"
        op(ScaleParams(x))
    assert op.runs["medium"] == 1


@pytest.mark.parametrize("fails_after_s", [0.0, 0.05])
def test_a_stand_in_that_would_compile_is_passed_over_while_the_choice_loads(ship, tmp_path, fails_after_s):
    """The choice is not ready within STAND_IN_AFTER_MS, and the next fastest has no kept build (a CUDA C
    stand-in the bundle lacks: compiling it made an H200's first call 403 ms): it is not compiled; the
    default runs until the choice is ready. Once the choice fails, at once or after that refused attempt
    (``fails_after_s``), the stand-in is prepared again, compiling allowed, and runs for good."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    release, compiled = threading.Event(), []
    op = op_whose("medium", lambda p: release.wait(30))
    with_prepare(op, "fast", compiling(lambda p: compiled.append(p)))
    with tuning(max_tuning_ms=50):
        op(ScaleParams(x))
        op(ScaleParams(x))
        assert dict(op.runs) == {"ref": 2} and compiled == [] and op.decision(ScaleParams(x)) is None
        release.set()
        assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"

    def fail(p):
        time.sleep(fails_after_s)
        raise RuntimeError("ptxas exploded")
    failing = op_whose("medium", fail)
    with_prepare(failing, "fast", compiling(lambda p: compiled.append(p)))
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="ptxas exploded"):
        failing(ScaleParams(x))
        assert failing.resolve(ScaleParams(x), finish=True).candidate.name == "fast"
    assert len(compiled) == 1


def test_every_triton_candidate_is_known_as_one():
    """shipped.uses_triton goes by the candidate's module (``triton_*``); the names say Triton too."""
    import tunekit  # noqa: F401
    from tunekit.tunable import registry
    pairs = [(shipped.uses_triton(c), "triton" in c.name) for op in registry.all_ops() for c in op.candidates]
    assert any(uses for uses, _ in pairs) and all(uses == named for uses, named in pairs)


def test_preparations_run_in_the_callers_settings():
    """A worker prepares under the caller's tuning() (whether shipped builds may be used)."""
    seen = []

    class Reading:
        name = "reading"

        def prepare(self, p):
            seen.append(context.current().use_shipped)
    with tuning(use_shipped=False):
        shipped.start_preparing(Reading(), None).result(timeout=30)
    with tuning(use_shipped=True):
        shipped.start_preparing(Reading(), None).result(timeout=30)
    assert seen == [False, True]


def test_a_choice_whose_preparation_cannot_start_fails_instead_of_pending(ship, tmp_path, monkeypatch):
    """Stand-in first, then the choice: if starting the choice's preparation raises, its Future fails
    (the stand-in runs for good, with a warning), never pending for ever under a finishing resolve."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    op = op_whose("medium", lambda p: None)
    triton_like = type("TritonLike", (Preparing,), {"__module__": "tunekit.ops.fake.triton_candidates"})
    op._by_name["medium"] = triton_like(op.candidate("medium").inner, compiling(lambda p: None))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    real = shipped.start_preparing

    def refusing(candidate, params, **kw):
        if candidate.name == "medium":
            raise RuntimeError("worker pool shut down")
        return real(candidate, params, **kw)
    monkeypatch.setattr(shipped, "start_preparing", refusing)
    with tuning(max_tuning_ms=20_000), pytest.warns(TunekitWarning, match="worker pool shut down"):
        op(ScaleParams(x))
        assert op.resolve(ScaleParams(x), finish=True).candidate.name == "fast"


def test_a_choice_ready_at_once_needs_no_stand_in(ship, tmp_path):
    """A choice ready within STAND_IN_AFTER_MS picks no stand-in (the wait raised to 5 s here: a worker on a
    loaded 2-core CI host took more than the real 5 ms to prepare a no-op, and the test failed once)."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    picked = []
    op = op_whose("medium", lambda p: None)
    real = shipped.stand_in
    with tuning(max_tuning_ms=20_000), pytest.MonkeyPatch.context() as m:
        m.setattr(shipped, "STAND_IN_AFTER_MS", 5000.0)
        m.setattr(shipped, "stand_in", lambda *a: picked.append(a) or real(*a))
        op(ScaleParams(x))
    assert dict(op.runs) == {"medium": 1} and picked == []


@pytest.mark.parametrize("why", ["within the margin of the default", "does not support the input"])
def test_no_stand_in_when_none_beats_the_default(ship, tmp_path, why):
    """The next fastest is within the margin of the default (or cannot run the input, and the one
    after it is the default): the default runs while the choice prepares, after the budget."""
    x = torch.randn(64)
    costs = {"ref": 2.0, "fast": 1.0, "medium": 1.99 if why.startswith("within") else 1.5}
    ship([dataclasses.replace(tuned_entry(x, tmp_path, costs), choice="fast")])
    release = threading.Event()
    op = op_whose("fast", lambda p: release.wait(30))
    if why.startswith("does not"):
        refusing = Preparing(op.candidate("medium"), None)
        refusing.supports = lambda p: "not this input"
        op._by_name["medium"] = refusing
    try:
        with tuning(max_tuning_ms=50):
            op(ScaleParams(x))
        assert dict(op.runs) == {"ref": 1}
    finally:
        release.set()
