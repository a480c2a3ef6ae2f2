"""Stand-ins that would start a compiler: the process's first Triton choice and its stand-in, kept builds
loaded without Triton, stand-ins whose build is slow (quack's child process) only when built before, and
a stored choice whose build is slow prepared on a worker as a shipped one is."""

import dataclasses
import threading
import time

import pytest
import torch

from tunekit.tunable import context, shipped, tuning
from tunekit.tunable.preparations import NeedsCompiler, compilers_allowed
from tunekit.tunable.results import ResultsStore

from fakes import ScaleParams
from shipped_helpers import Preparing, compiling, op_whose, ship, tuned_entry


def test_the_first_triton_choice_of_a_process_prepares_its_stand_in_first(ship, tmp_path, monkeypatch):
    """The choice's preparation would start Triton (holding the interpreter for 0.2-0.4 s) and no
    kept build spares it: the stand-in is prepared first, the choice's preparation starts after it;
    the first call waits for neither (the default runs it), later calls run the stand-in once it is
    ready; once a Triton choice was prepared, the next one goes first again."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    order, release = [], threading.Event()
    op = op_whose("medium", compiling(lambda p: (order.append("choice"), release.wait(30))))
    triton_like = type("TritonLike", (Preparing,), {"__module__": "tunekit.ops.fake.triton_candidates"})
    choice = triton_like(op.candidate("medium").inner, op.candidate("medium").prepare)
    op._by_name["medium"] = choice
    stand_in_ready = threading.Event()
    op._by_name["fast"] = Preparing(op.candidate("fast"), lambda p: (stand_in_ready.wait(30), order.append("stand-in")))
    assert shipped.uses_triton(choice) and not shipped.uses_triton(op.candidate("fast"))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    try:
        with tuning(max_tuning_ms=20_000):
            t0 = time.perf_counter()
            op(ScaleParams(x))
            assert time.perf_counter() - t0 < 1.0 and dict(op.runs) == {"ref": 1}  # no wait, not the 20 s budget
            stand_in_ready.set()
            deadline = time.monotonic() + 10
            while op.in_effect(ScaleParams(x))[0].name != "fast" and time.monotonic() < deadline:
                time.sleep(0.001)
            op(ScaleParams(x))
            assert dict(op.runs) == {"ref": 1, "fast": 1}
            release.set()
            assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"
        deadline = time.monotonic() + 10  # noted by a callback, after the choice's waiters wake
        while not shipped._triton_prepared and time.monotonic() < deadline:
            time.sleep(0.001)
        assert order == ["stand-in", "choice"] and shipped._triton_prepared
    finally:
        stand_in_ready.set()
        release.set()


def test_a_triton_stand_in_is_not_compiled_before_triton_has_started(ship, tmp_path, monkeypatch):
    """A shipped CUDA C choice slower to load than STAND_IN_AFTER_MS, its stand-in a Triton kernel with no
    kept build, in a process that has not started Triton: the stand-in is not compiled (Triton's start
    would hold the interpreter, the choice's load with it); the first call waits on for the choice."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    loaded, compiled = threading.Event(), []
    op = op_whose("medium", lambda p: loaded.wait(30))
    triton_like = type("TritonLike", (Preparing,), {"__module__": "tunekit.ops.fake.triton_candidates"})
    op._by_name["fast"] = triton_like(op.candidate("fast"), compiling(lambda p: compiled.append(p)))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    timer = threading.Timer(0.1, loaded.set)  # ready well after STAND_IN_AFTER_MS
    timer.start()
    try:
        with tuning(max_tuning_ms=20_000):
            t0 = time.perf_counter()
            op(ScaleParams(x))
            waited = time.perf_counter() - t0
    finally:
        loaded.set()
    assert compiled == [] and dict(op.runs) == {"medium": 1}, (compiled, op.runs)
    assert 0.05 < waited < 5.0  # it waited for the choice, not the budget


@pytest.mark.parametrize("built", [False, True])
def test_a_stand_in_whose_build_is_slow_runs_only_when_it_was_built_before(ship, tmp_path, monkeypatch, built):
    """A stand-in whose first build takes seconds (``slow_build``: quack's child process) is prepared from
    kept builds only: built before, it runs while the choice loads; not built, it is not built now and
    the first call waits for the choice (within the budget). Triton having started changes nothing."""
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    loaded, compiled = threading.Event(), []
    op = op_whose("medium", lambda p: loaded.wait(30))
    slow = type("SlowBuild", (Preparing,), {"slow_build": True})
    op._by_name["fast"] = slow(op.candidate("fast"), (lambda p: None) if built else compiling(compiled.append))
    monkeypatch.setattr(shipped, "_triton_prepared", True)
    timer = threading.Timer(0.3, loaded.set)  # ready well after STAND_IN_AFTER_MS
    timer.start()
    try:
        with tuning(max_tuning_ms=20_000):
            op(ScaleParams(x))
    finally:
        loaded.set()
    assert compiled == []
    assert dict(op.runs) == ({"fast": 1} if built else {"medium": 1})


def triton_choice_op(ship, tmp_path, x, prepare):
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    op = op_whose("medium", lambda p: None)
    triton_like = type("TritonLike", (Preparing,), {"__module__": "tunekit.ops.fake.triton_candidates"})
    op._by_name["medium"] = triton_like(op.candidate("medium").inner, prepare)
    stand_ins = []
    op._by_name["fast"] = Preparing(op.candidate("fast"), lambda p: stand_ins.append(p))
    return op, stand_ins


def test_the_first_triton_choice_runs_at_the_first_call_when_its_builds_were_kept(ship, tmp_path, monkeypatch):
    """Its kept builds load without Triton (kept-builds-only preparation): the first call runs the
    choice, no stand-in is prepared, and Triton counts as not started."""
    x = torch.randn(64)
    modes = []
    op, stand_ins = triton_choice_op(ship, tmp_path, x, lambda p: modes.append(compilers_allowed()))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    with tuning(max_tuning_ms=20_000):
        op(ScaleParams(x))
    assert dict(op.runs) == {"medium": 1} and modes == [False] and stand_ins == []
    assert not shipped._triton_prepared


def test_kept_builds_slower_than_the_wait_leave_the_first_call_to_the_default(ship, tmp_path, monkeypatch):
    """The first call waits at most KEPT_WAIT_MS for kept builds, then runs the default; the choice
    runs once they are loaded."""
    x = torch.randn(64)
    loaded = threading.Event()
    op, _ = triton_choice_op(ship, tmp_path, x, lambda p: loaded.wait(30))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    try:
        with tuning(max_tuning_ms=20_000):
            t0 = time.perf_counter()
            op(ScaleParams(x))
            waited = time.perf_counter() - t0
            assert dict(op.runs) == {"ref": 1} and waited < 1.0
            loaded.set()
            assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"
    finally:
        loaded.set()
    assert waited >= shipped.KEPT_WAIT_MS / 1e3 * 0.9  # it did wait for the load, not longer


def test_the_stand_in_and_the_choice_prepare_under_the_settings_of_the_call(ship, tmp_path, monkeypatch):
    """The kept-builds attempt fails on a worker, whose callback starts the stand-in, and the
    stand-in's worker then starts the choice: both still see the first call's ``tuning()`` settings
    (which shipped builds may be used, the results file...), not the process defaults."""
    x = torch.randn(64)
    seen = {}
    def choice(p):
        if not compilers_allowed():
            time.sleep(0.05)  # fails on the worker, after the callback is in place: the callback runs there
            raise NeedsCompiler("no kept build")
        seen.setdefault("choice", context.current())
    op, _ = triton_choice_op(ship, tmp_path, x, choice)
    op._by_name["fast"] = Preparing(op.candidate("fast"), lambda p: seen.setdefault("stand-in", context.current()))
    monkeypatch.setattr(shipped, "_triton_prepared", False)
    with tuning(max_tuning_ms=20_000, margin=0.07):
        op(ScaleParams(x))
        assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"
    assert seen["stand-in"].margin == 0.07 and seen["choice"].margin == 0.07
    assert seen["stand-in"].use_shipped and seen["choice"].use_shipped


def test_a_stored_choice_whose_build_is_slow_prepares_on_a_worker_as_a_shipped_one(tmp_path):
    """The user's own entry names a candidate whose build takes seconds (quack's child process: its kernel
    lost from the cache): the first call does not build it; the entry's next fastest runs meanwhile."""
    x = torch.randn(64)
    path = tmp_path / "user.sqlite"
    ResultsStore(path).put(dataclasses.replace(tuned_entry(x, tmp_path), choice="medium"))
    release = threading.Event()
    op = op_whose("medium", lambda p: release.wait(30))
    slow = type("SlowBuild", (Preparing,), {"slow_build": True})
    op._by_name["medium"] = slow(op.candidate("medium").inner, op.candidate("medium").prepare)
    try:
        with tuning(results=path, use_shipped=False, max_tuning_ms=20_000):
            t0 = time.perf_counter()
            op(ScaleParams(x))
            assert time.perf_counter() - t0 < 5.0 and dict(op.runs) == {"fast": 1}
            release.set()
            assert op.resolve(ScaleParams(x), finish=True).candidate.name == "medium"
            op(ScaleParams(x))
            assert op.runs["medium"] == 1 and "stored result" in op.decision(ScaleParams(x)).why
    finally:
        release.set()
