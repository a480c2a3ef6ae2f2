"""Shipped pre-tuned results (tunable/shipped.py): used only where valid, after the user's own store."""

import dataclasses
import threading

import pytest
import torch

from tunekit.tunable import TunekitWarning, results_store, shipped, tuning, validators
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
    shipped.entries_for.cache_clear()

    def write(entries):
        write_csv(shipped.file_for(CPU, directory), entries)
        shipped.entries_for.cache_clear()
    with tuning(use_shipped=True):
        yield write
    shipped.entries_for.cache_clear()


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
    """A candidate edited after its GPU's file was made invalidates that file's entries for its op
    (they would be ignored on the GPU, silently): rerun benchmarks/pretune.py on that GPU."""
    import tunekit  # noqa: F401
    from tunekit.tunable import registry
    ops = {op.name: op for op in registry.all_ops()}
    for path in sorted(shipped.SHIPPED_DIR.glob("*.csv")):
        for (op_name, signature), entry in shipped.entries_for(path).items():
            now = validators.candidate_hashes(ops[op_name].candidates)
            stale = [k for k in set(now) | {k for k in entry.validators if k.startswith("candidate:")}
                     if now.get(k) != entry.validators.get(k)]
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
    op = make_op(None, COSTS)
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


def test_a_shipped_choice_whose_compile_fails_leaves_the_default_with_a_warning(ship, tmp_path):
    x = torch.randn(64)
    ship([dataclasses.replace(tuned_entry(x, tmp_path), choice="medium")])

    def prepare(p):
        raise RuntimeError("ptxas exploded")
    op = op_whose("medium", prepare)
    with tuning(max_tuning_ms=30_000), pytest.warns(TunekitWarning, match="ptxas exploded"):
        op(ScaleParams(x))
    assert dict(op.runs) == {"ref": 1}
    assert "could not be prepared" in op.decision(ScaleParams(x)).why
    op(ScaleParams(x))
    assert dict(op.runs) == {"ref": 2}


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
