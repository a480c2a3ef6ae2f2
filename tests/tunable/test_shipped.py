"""Shipped pre-tuned results (tunable/shipped.py): used only where valid, after the user's own store."""

import dataclasses
import threading
import time

import pytest
import torch

from tunekit.tunable import TunekitWarning, context, results_store, shipped, tuning, validators
from tunekit.tunable.errors import ResultsImportError
from tunekit.tunable.preparations import NeedsCompiler, compilers_allowed
from tunekit.tunable.entries import write_csv
from tunekit.tunable.results import ResultsStore

from fakes import FakeClock, ScaleParams, make_op

CPU = validators.device_name(torch.device("cpu"))
COSTS = {"ref": 2.0, "fast": 1.0, "medium": 1.5}


@pytest.fixture
def ship(tmp_path, monkeypatch):
    """ship(entries): write them as this machine's shipped file; shipped results on."""
    directory = tmp_path / "pretuned"
    directory.mkdir()
    monkeypatch.setattr(shipped, "SHIPPED_DIR", directory)
    shipped.forget_files()

    def write(entries):
        write_csv(shipped.file_for(CPU, directory), entries)
        shipped.forget_files()
    with tuning(use_shipped=True):
        yield write
    shipped.forget_files()


def tuned_entry(x, tmp_path, costs=COSTS):
    """What offline tuning of ``x``'s signature stores (a fresh op, its own results file)."""
    clock = FakeClock()
    op = make_op(clock, costs)
    op.clock = clock
    path = tmp_path / "offline.sqlite"
    with tuning(results=path, use_shipped=False):
        op(ScaleParams(x))
    return ResultsStore(path).entries("scale")[0]


def first_call(x):
    """A fresh op's first call: (why, the runs it made per candidate)."""
    op = make_op(None, COSTS)
    op(ScaleParams(x))
    return op.resolve(ScaleParams(x)).why, dict(op.runs)


def test_a_valid_shipped_entry_decides_the_first_call_without_tuning(ship, tmp_path):
    x = torch.randn(64)
    entry = dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")  # not what this machine would pick
    ship([entry])
    why, runs = first_call(x)
    assert "shipped" in why and runs == {"medium": 1}  # no candidate checked or timed: one run, the call's
    assert len(results_store()) == 0  # the user's store is not written


@pytest.mark.parametrize("change", [
    {"device": "NVIDIA H200"}, {"compute_capability": "9.0"}, {"cuda_driver": "12.8"}, {"torch": "1.13.1"},
    {"triton": "0.1"}, {"candidate:fast": "0" * 16}, {"candidate:gone": "0" * 16}])
def test_a_shipped_entry_that_does_not_hold_here_is_ignored(ship, tmp_path, change):
    x = torch.randn(64)
    entry = tuned_entry(x, tmp_path)
    ship([dataclasses.replace(entry, choice="medium", validators={**entry.validators, **change})])
    why, runs = first_call(x)
    assert "tuned now" in why and runs["ref"] > 1


def test_versions_need_to_match_only_up_to_the_minor_release():
    here = {"device": "GPU", "compute_capability": "9.0", "cuda_driver": "13.0", "cuda_runtime": "12.8",
            "torch": "2.11.0+cu128", "triton": "3.6.0", "tunekit": "0.1.0", "candidate:a": "h"}
    assert shipped.problems({**here, "torch": "2.11.1", "triton": "3.6.2", "tunekit": "0.2.0"}, here) == []
    assert shipped.problems({**here, "torch": "2.12.0"}, here) == ["torch 2.12.0 -> 2.11.0+cu128"]
    assert shipped.problems({**here, "candidate:b": "h"}, here) == ["candidate:b differs"]


def test_a_candidate_added_since_the_entry_was_tuned_leaves_it_valid_a_changed_or_removed_one_does_not():
    """The entry's choice is still the best of what it measured; the newcomer waits for the next pretune."""
    here = {"device": "GPU", "compute_capability": "9.0", "cuda_driver": "13.0", "cuda_runtime": "12.8",
            "torch": "2.11.0", "triton": "3.6.0", "candidate:a": "h1", "candidate:new": "h2"}
    tuned_before = {k: v for k, v in here.items() if k != "candidate:new"}
    assert shipped.problems(tuned_before, here) == []
    assert shipped.problems({**tuned_before, "candidate:a": "old"}, here) == ["candidate:a differs"]
    gone = {k: v for k, v in here.items() if k != "candidate:a"}
    assert shipped.problems(here, gone) == ["candidate:a differs"]


def test_the_users_own_entry_comes_before_the_shipped_one(ship, tmp_path):
    x = torch.randn(64)
    entry = tuned_entry(x, tmp_path)
    ship([dataclasses.replace(entry, choice="medium")])
    assert entry.choice == "fast"
    results_store().put(entry)  # the user's store
    op = make_op(None, COSTS)
    assert op.resolve(ScaleParams(x)).candidate.name == "fast"


def test_use_shipped_false_and_incomplete_shipped_entries_are_ignored(ship, tmp_path):
    x, y = torch.randn(64), torch.randn(32)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium"),
          dataclasses.replace(tuned_entry(y, tmp_path / "y"), choice="medium", complete=False)])
    with tuning(use_shipped=False):
        assert "tuned now" in first_call(x)[0]
    assert "tuned now" in first_call(y)[0]


def test_the_file_of_a_gpu_model():
    assert shipped.file_for("NVIDIA H200").name == "NVIDIA_H200.csv"
    assert shipped.file_for("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.csv"


def test_every_shipped_file_parses_and_names_existing_ops_and_candidates():
    """The files in the package: each loads (a damaged one raises), and each entry's choice is a
    candidate of a registered op (its candidates' hashes decide whether it is used on a GPU)."""
    import tunekit  # noqa: F401  (registers every op)
    from tunekit.tunable import registry
    ops = {op.name: op for op in registry.all_ops()}
    files = sorted(shipped.SHIPPED_DIR.glob("*.csv"))
    for path in files:
        table = shipped.entries_for(path)
        assert table, f"{path.name}: no complete entry"
        for (op_name, signature), entry in table.items():
            assert op_name in ops, f"{path.name}: unknown op {op_name}"
            assert entry.choice in {c.name for c in ops[op_name].candidates}, (path.name, signature, entry.choice)
            assert shipped.file_for(entry.device) == path


def test_every_shipped_entry_names_the_candidates_as_they_are_now():
    """A candidate edited or removed after its GPU's file was made invalidates that file's entries for
    its op (they would be ignored on the GPU, silently): rerun benchmarks/pretune.py on that GPU. One
    added since leaves them valid (``shipped.problems``), unmeasured until that GPU's next pretune."""
    import tunekit  # noqa: F401
    from tunekit.tunable import registry
    ops = {op.name: op for op in registry.all_ops()}
    for path in sorted(shipped.SHIPPED_DIR.glob("*.csv")):
        for (op_name, signature), entry in shipped.entries_for(path).items():
            now = validators.candidate_hashes(ops[op_name].candidates)
            stale = [k for k in entry.validators if k.startswith("candidate:") and now.get(k) != entry.validators[k]]
            assert not stale, f"{path.name}: {op_name} {signature}: {sorted(stale)} changed since it was tuned"


class Preparing:
    """``inner`` (a candidate) with a ``prepare(params)``: a candidate that compiles before its first run."""

    fast_runner = None

    def __init__(self, inner, prepare):
        self.inner, self.name, self.prepare = inner, inner.name, prepare

    def supports(self, p):
        return self.inner.supports(p)

    def run(self, p):
        return self.inner.run(p)

    def source_hash(self):
        return self.inner.source_hash()


def op_whose(name, prepare):
    """A fresh op whose candidate ``name`` has ``prepare``."""
    return with_prepare(make_op(None, COSTS), name, prepare)


def with_prepare(op, name, prepare):
    """``op`` with its candidate ``name`` given ``prepare``."""
    wrapped = Preparing(op.candidate(name), prepare)
    op.candidates[op.candidates.index(wrapped.inner)] = wrapped
    op._by_name[name] = wrapped
    return op


def test_a_shipped_choice_that_compiles_runs_once_prepared_and_the_default_until_then(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    release, seen = threading.Event(), []
    op = op_whose("medium", lambda p: (seen.append(threading.current_thread().name), release.wait(30)))
    with tuning(max_tuning_ms=1):
        op(ScaleParams(x))  # its compile runs on a worker: the first call waits 1 ms (the budget), then runs the default
        op(ScaleParams(x))
        assert dict(op.runs) == {"ref": 2} and op.decision(ScaleParams(x)) is None
        assert seen and seen[0] != threading.current_thread().name and len(seen) == 1  # prepared once
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


def compiling(prepare):
    """A prepare that must compile: under kept-builds-only it raises NeedsCompiler, as Triton's launch does."""
    def run(p):
        if not compilers_allowed():
            raise NeedsCompiler("no kept build")
        return prepare(p)
    return run


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
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])
    picked = []
    op = op_whose("medium", lambda p: None)
    real = shipped.stand_in
    with tuning(max_tuning_ms=20_000), pytest.MonkeyPatch.context() as m:
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


def test_a_lookup_reads_the_row_entries_for_reads_for_every_shipped_entry():
    """A process's lookups parse one row each; they must find what parsing the whole file finds."""
    for path in sorted(shipped.SHIPPED_DIR.glob("*.csv")):
        shipped.forget_files()
        for (op_name, signature), entry in shipped.entries_for(path).items():
            assert shipped._lookup(path, op_name, signature) == entry
        assert shipped._lookup(path, "no such op", "x") is None


def test_a_lookup_finds_signatures_that_need_quoting_and_names_a_damaged_row(ship, tmp_path):
    base = tuned_entry(torch.randn(8), tmp_path)
    odd = dataclasses.replace(base, signature='x=f32[3, 4] "quoted", more')
    plain = dataclasses.replace(base, signature="x=f32[5]")
    ship([odd, plain])
    path = shipped.file_for(CPU)
    assert shipped._lookup(path, "scale", odd.signature) == odd
    assert shipped._lookup(path, "scale", "x=f32[3, 4]") is None  # a prefix of a signature is not it
    text = path.read_text()
    path.write_text(text.replace(f"scale,x=f32[5],{CPU},{base.choice},1,", f"scale,x=f32[5],{CPU},{base.choice},maybe,"))
    shipped.forget_files()
    assert shipped._lookup(path, "scale", odd.signature) == odd  # the other row is not read
    with pytest.raises(ResultsImportError, match="row 3: complete"):
        shipped._lookup(path, "scale", plain.signature)
