"""Shipped pre-tuned results (tunable/shipped.py): used only where valid, after the user's own store; every
shipped file parses, names the candidates as they are now, and reads row by row."""

import dataclasses

import pytest
import torch

from tunekit.tunable import results_store, shipped, tuning, validators
from tunekit.tunable.errors import ResultsImportError

from fakes import ScaleParams, make_op
from shipped_helpers import CPU, COSTS, first_call, ship, tuned_entry


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
