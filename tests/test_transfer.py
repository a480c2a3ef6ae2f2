"""Shipping results between machines: export, then import keeping only entries valid here."""

import dataclasses
import math

import pytest
import torch

import tunekit
from tunekit.offline import transfer
from tunekit.tunable import ResultsImportError, results_store, tuning, validators

CPU = validators.device_name(torch.device("cpu"))


def tuned_store(path):
    """A store with three tuned entries (silu at two sizes, gelu), tuned on this machine."""
    with tuning(results=str(path), max_tuning_ms=5000, tuning_step_ms=math.inf):  # each call tunes to the end
        tunekit.silu(torch.randn(16))
        tunekit.silu(torch.randn(17))
        tunekit.gelu(torch.randn(18), approximate="tanh")
    return results_store(str(path))


def test_export_then_import_elsewhere_keeps_every_valid_entry(tmp_path):
    source = tuned_store(tmp_path / "a.sqlite")
    assert transfer.export_results(source, tmp_path / "r.csv") == 3
    target = results_store(str(tmp_path / "b.sqlite"))
    report = transfer.import_results(target, tmp_path / "r.csv")
    assert (len(report.imported), report.rejected, report.kept) == (3, [], [])
    assert target.entries() == source.entries()
    with tuning(results=str(tmp_path / "b.sqlite"), tuning=False):
        assert tunekit.explain("silu", torch.randn(16)).why == "stored result"


def test_entries_that_do_not_match_this_machine_are_reported_not_imported(tmp_path):
    source = tuned_store(tmp_path / "a.sqlite")
    gelu, silu16, silu17 = source.entries()  # ordered by op, then signature
    source.put(dataclasses.replace(silu16, validators={**silu16.validators, "torch": "0.0.1"}))
    source.put(dataclasses.replace(silu17, device="NVIDIA H200"))
    source.put(dataclasses.replace(gelu, op="no_such_op"))
    transfer.export_results(source, tmp_path / "r.csv")
    target = results_store(str(tmp_path / "b.sqlite"))
    report = transfer.import_results(target, tmp_path / "r.csv")
    reasons = {(op, dev): why for op, _, dev, why in report.rejected}
    # imported: the untouched originals of gelu and silu n=17 (the renamed copies were added beside them)
    assert sorted((op, sig) for op, sig, _ in report.imported) == [("gelu", gelu.signature), ("silu", silu17.signature)]
    assert f"torch 0.0.1 -> {torch.__version__}" in reasons[("silu", CPU)]
    assert "no device named 'NVIDIA H200' here" in reasons[("silu", "NVIDIA H200")]
    assert "unknown op 'no_such_op'" in reasons[("no_such_op", CPU)]
    assert [e.op for e in target.entries()] == ["gelu", "silu"]
    assert "3 rejected" in str(report) and "torch 0.0.1" in str(report)
    everything = transfer.import_results(results_store(str(tmp_path / "c.sqlite")), tmp_path / "r.csv", check=False)
    assert len(everything.imported) == 5 and everything.rejected == []


def test_a_complete_local_entry_is_kept_over_an_incomplete_import(tmp_path):
    source = tuned_store(tmp_path / "a.sqlite")
    entry = source.entries()[0]
    source.put(dataclasses.replace(entry, complete=False, choice=entry.choice))
    transfer.export_results(source, tmp_path / "r.csv", ops=[entry.op], device=entry.device)
    target = tuned_store(tmp_path / "b.sqlite")
    local = target.get(entry.op, entry.signature, entry.device)
    report = transfer.import_results(target, tmp_path / "r.csv")
    assert report.kept == [[entry.op, entry.signature, entry.device]]
    assert target.get(entry.op, entry.signature, entry.device) == local


def test_export_filters_and_a_malformed_file_imports_nothing(tmp_path):
    source = tuned_store(tmp_path / "a.sqlite")
    source.put(dataclasses.replace(source.entries()[0], signature="stale", validators={"torch": "0.0.1"}))
    assert transfer.export_results(source, tmp_path / "silu.csv", ops=["silu"]) == 2
    assert transfer.export_results(source, tmp_path / "valid.csv", valid_only=True) == 3
    assert transfer.export_results(source, tmp_path / "h200.csv", device="NVIDIA H200") == 0
    lines = (tmp_path / "valid.csv").read_text().splitlines()
    (tmp_path / "bad.csv").write_text("\n".join(lines[:2] + ["garbage,row"]) + "\n")
    target = results_store(str(tmp_path / "b.sqlite"))
    with pytest.raises(ResultsImportError):
        transfer.import_results(target, tmp_path / "bad.csv")
    assert target.entries() == []


def test_importing_into_a_store_that_cannot_keep_the_entries_fails_and_reports_nothing(tmp_path):
    from tunekit.tunable.errors import ResultsStoreError
    from tunekit.tunable.results import ResultsStore

    source = tuned_store(tmp_path / "a.sqlite")
    transfer.export_results(source, tmp_path / "r.csv")
    existing = results_store(str(tmp_path / "b.sqlite"))
    existing.record_untuned("silu", "f32[3]", "cpu", {})  # a file is made by its first write
    existing.close()
    before = (tmp_path / "b.sqlite").read_bytes()
    read_only = ResultsStore(tmp_path / "b.sqlite", read_only=True)
    with pytest.raises(ResultsStoreError, match="cannot import results: .* is read-only"):
        transfer.import_results(read_only, tmp_path / "r.csv")
    assert (tmp_path / "b.sqlite").read_bytes() == before
    (tmp_path / "c.sqlite").write_text("my notes")
    with pytest.warns(tunekit.TunekitWarning):
        broken = ResultsStore(tmp_path / "c.sqlite")
    with pytest.raises(ResultsStoreError, match="cannot import results: .* is not an SQLite database"):
        transfer.import_results(broken, tmp_path / "r.csv")
    assert broken.entries() == [] and (tmp_path / "c.sqlite").read_text() == "my notes"


def test_an_export_that_fails_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    from tunekit.tunable import entries

    source = tuned_store(tmp_path / "a.sqlite")
    target = tmp_path / "r.csv"
    target.write_text("the previous export\n")

    def disk_full(entry):  # while the rows are written
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(entries, "to_row", disk_full)
    with pytest.raises(OSError, match="No space left"):
        transfer.export_results(source, target)
    assert target.read_text() == "the previous export\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.sqlite", "r.csv"]
