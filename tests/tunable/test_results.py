"""The SQLite results store: entries, untuned records, paths, CSV export and import."""

import csv
import json
import os
import pathlib
import sqlite3
import threading
import time

import pytest

from tunekit.tunable.errors import ResultsImportError
from tunekit.tunable.entries import STATUSES
from tunekit.tunable.results import (
    APPLICATION_ID, SCHEMA_VERSION, CandidateRecord, ResultsStore,
    UntunedRecord, default_results_path,
)

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

from store_helpers import make_entry



def test_round_trip_put_get_entries_len(tmp_path):
    path = tmp_path / "results.sqlite"
    store = ResultsStore(path)
    assert not store.in_memory and store.problem is None and store.path == str(path)
    assert len(store) == 0 and store.get("matmul", "x", "cpu") is None
    a = make_entry("softmax", "f32[8]", "cpu", complete=False, validators={}, tuning_ms=0.0)
    b = make_entry("matmul", "sig-ü", "NVIDIA H100 80GB HBM3")
    c = make_entry("matmul", "sig-a", "cpu", candidates={"tiled": CandidateRecord("chosen", 3.0)})
    for e in (a, b, c):
        store.put(e)
    assert len(store) == 3
    store.close()

    reopened = ResultsStore(path)  # the values come back from the file, not from memory
    assert reopened.get(b.op, b.signature, b.device) == b
    got = reopened.get(a.op, a.signature, a.device)
    assert got == a and got.complete is False and got.candidates["tiled"].time_ms == 0.1 + 0.2
    assert got.candidates["naive"].time_ms == 1e-300 and got.tuned_at == 1_700_000_000.123456789
    assert reopened.entries() == [c, b, a]  # ordered by op, signature, device
    assert reopened.entries("matmul") == [c, b]
    assert reopened.get("matmul", "sig-ü", "cpu") is None
    reopened.close()


def test_a_new_file_is_made_by_the_first_write_not_by_opening_or_a_lookup(tmp_path):
    path = tmp_path / "sub" / "results.sqlite"
    store = ResultsStore(path)
    assert store.get("matmul", "sig", "cpu") is None
    assert not path.exists() and path.parent.is_dir() and store.writable
    e = make_entry()
    store.put(e)
    assert path.exists()
    assert ResultsStore(path).get(e.op, e.signature, e.device) == e
    store.close()


def test_a_file_another_process_made_after_opening_is_read(tmp_path):
    path = tmp_path / "results.sqlite"
    late, e = ResultsStore(path), make_entry()
    assert late.get(e.op, e.signature, e.device) is None
    other = ResultsStore(path)
    other.put(e)
    other.close()
    assert late.get(e.op, e.signature, e.device) == e
    late.close()


def test_file_layout(tmp_path):
    path = tmp_path / "results.sqlite"
    store = ResultsStore(path)
    store.record_untuned("matmul", "sig", "cpu", {})  # the first write makes the file
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # self-contained: no -wal file
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"entries", "untuned", "meta"}
    version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    conn.close()


def test_upsert_replaces(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    store.put(make_entry())
    newer = make_entry(choice="naive", tuned_at=1_800_000_000.0,
                       candidates={"naive": CandidateRecord("chosen", 0.5)})
    store.put(newer)
    assert len(store) == 1
    assert store.get(newer.op, newer.signature, newer.device) == newer


def test_put_rejects_invalid_entries(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    with pytest.raises(ValueError, match="choice"):
        store.put(make_entry(choice="missing"))
    with pytest.raises(ValueError, match="status"):
        store.put(make_entry(candidates={"tiled": CandidateRecord("fastest")}))
    with pytest.raises(ValueError, match="tuned_at"):
        store.put(make_entry(tuned_at=float("nan")))
    with pytest.raises(ValueError, match="time_ms"):
        store.put(make_entry(candidates={"tiled": CandidateRecord("chosen", float("inf"))}))
    assert len(store) == 0 and not store.in_memory


def test_delete_and_clear(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    for op in ("matmul", "softmax"):
        for sig in ("a", "b"):
            store.put(make_entry(op, sig))
            store.record_untuned(op, sig + "-new", "cpu", {"shape": [1, 2]})
    assert store.delete("matmul", "a", "cpu") is True
    assert store.delete("matmul", "a", "cpu") is False
    assert [e.signature for e in store.entries("matmul")] == ["b"]

    assert store.clear("matmul") == 1
    assert store.entries("matmul") == [] and store.untuned("matmul") == []
    assert len(store.entries("softmax")) == 2 and len(store.untuned("softmax")) == 2

    assert store.clear() == 2
    assert len(store) == 0 and store.untuned() == []
    assert store.clear() == 0


def test_untuned_recorded_once(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    spec = {"args": [{"shape": [64, 64], "dtype": "float16"}], "note": "ü", "flag": None}
    before = time.time()
    assert store.record_untuned("matmul", "sig", "cpu", spec) is True
    assert store.record_untuned("matmul", "sig", "cpu", {"other": 1}) is False
    assert store.record_untuned("matmul", "sig", "cuda:0", spec) is True
    store.record_untuned("add", "sig", "cpu", {})
    records = store.untuned("matmul")
    assert [r.device for r in records] == ["cpu", "cuda:0"]
    assert isinstance(records[0], UntunedRecord)
    assert records[0].spec == spec and before <= records[0].first_seen <= time.time()
    assert [r.op for r in store.untuned()] == ["add", "matmul", "matmul"]
    store.remove_untuned("matmul", "sig", "cpu")
    assert [r.device for r in store.untuned("matmul")] == ["cuda:0"]
    assert len(store) == 0  # untuned records are not entries


def test_memory_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ResultsStore(":memory:")
    assert store.in_memory and store.problem is None
    store.put(make_entry())
    assert len(store) == 1
    assert list(tmp_path.iterdir()) == []  # no file named ":memory:"
    assert len(ResultsStore(":memory:")) == 0  # private to each store


def test_threads_share_one_store(tmp_path):
    path = tmp_path / "r.sqlite"
    stores = [ResultsStore(path), ResultsStore(path)]  # two connections, four threads each

    def work(t):
        for i in range(50):
            stores[t % 2].put(make_entry(signature=f"t{t}-{i}"))
            stores[t % 2].get("matmul", f"t{t}-{i}", "cpu")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stores[0]) == 400 and len(stores[1]) == 400


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_gets_its_own_connection(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    store.put(make_entry(signature="parent"))
    pid = os.fork()
    if pid == 0:  # child: must reconnect, write, and exit without running pytest teardown
        try:
            store.put(make_entry(signature="child"))
            ok = store.get("matmul", "parent", "cpu") is not None and not store.in_memory
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    store.put(make_entry(signature="parent-after"))
    assert [e.signature for e in store.entries()] == ["child", "parent", "parent-after"]


# --- default path ------------------------------------------------------------------------------

def test_default_results_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_RESULTS", str(tmp_path / "explicit.sqlite"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_results_path() == tmp_path / "explicit.sqlite"
    monkeypatch.setenv("TUNEKIT_RESULTS", "")
    assert default_results_path() == tmp_path / "xdg" / "tunekit" / "results.sqlite"
    monkeypatch.delenv("TUNEKIT_RESULTS")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_results_path() == tmp_path / "home" / ".cache" / "tunekit" / "results.sqlite"


def test_store_uses_default_path_and_creates_dirs(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNEKIT_RESULTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "deep" / "cache"))
    store = ResultsStore()
    store.put(make_entry())
    expected = tmp_path / "deep" / "cache" / "tunekit" / "results.sqlite"
    assert store.path == str(expected) and expected.is_file() and not store.in_memory


# --- many processes ------------------------------------------------------------------------------

def fill(store):
    store.put(make_entry())
    store.put(make_entry("softmax", "f32[8],dim=-1", "NVIDIA H100 80GB HBM3", complete=False,
                         validators={}, candidates={"tiled": CandidateRecord("chosen")}))
    store.put(make_entry("matmul", 'sig with "quotes", commas\nand a newline'))


def test_csv_round_trip(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    fill(store)
    original = store.entries()
    assert store.export_csv(tmp_path / "out.csv") == 3
    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == ["op", "signature", "device", "choice", "complete",
                                       "tuned_at", "tuning_ms", "validators", "candidates"]
    store.clear()
    assert len(store) == 0
    assert store.import_csv(tmp_path / "out.csv") == 3
    assert store.entries() == original
    assert store.import_csv(tmp_path / "out.csv") == 3  # importing again upserts
    assert len(store) == 3


def csv_with_rows(path, edits):
    """Export a valid file from a fresh store, then apply edits: row index -> {column: value}."""
    store = ResultsStore(":memory:")
    fill(store)
    store.export_csv(path)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for index, changes in edits.items():
        rows[index].update(changes)
    return rows


def write_rows(path, rows, columns):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


GOOD = json.dumps({"a": {"status": "chosen", "time_ms": 1.0, "reason": None}})
COLUMNS = ["op", "signature", "device", "choice", "complete", "tuned_at", "tuning_ms",
           "validators", "candidates"]


@pytest.mark.parametrize("changes, words", [
    ({"candidates": "{not json"}, "candidates cannot be parsed"),
    ({"validators": "[1, 2]"}, "validators"),
    ({"validators": "{'a': 'b'}"}, "validators cannot be parsed"),
    ({"validators": '{"a": 1}'}, "validators"),
    ({"choice": "nope"}, "choice"),
    ({"choice": "a", "candidates": GOOD.replace("chosen", "fastest")}, "status"),
    ({"choice": "a", "candidates": GOOD.replace("1.0", "NaN")}, "time_ms"),
    ({"choice": "a", "candidates": GOOD.replace("1.0", '"fast"')}, "time_ms"),
    ({"candidates": '{"tiled": "chosen"}'}, "candidate"),
    ({"tuned_at": "inf"}, "tuned_at"),
    ({"tuning_ms": "soon"}, "tuning_ms"),
    ({"complete": "maybe"}, "complete"),
    ({"device": ""}, "device"),
])
def test_import_rejects_bad_row_and_imports_nothing(tmp_path, changes, words):
    path = tmp_path / "in.csv"
    write_rows(path, csv_with_rows(path, {0: changes}), COLUMNS)
    store = ResultsStore(tmp_path / "r.sqlite")
    store.put(make_entry("existing", "sig"))
    with pytest.raises(ResultsImportError) as info:
        store.import_csv(path)
    assert len(info.value.errors) == 1
    row, reason = info.value.errors[0]
    assert row == 2 and words in reason  # the header is line 1
    assert str(path) in str(info.value)
    assert [e.op for e in store.entries()] == ["existing"]


def test_import_reports_every_bad_row(tmp_path):
    path = tmp_path / "in.csv"
    rows = csv_with_rows(path, {0: {"complete": "2"}, 2: {"tuned_at": "nan"}})
    write_rows(path, rows, COLUMNS)
    store = ResultsStore(tmp_path / "r.sqlite")
    with pytest.raises(ResultsImportError) as info:
        store.import_csv(path)
    # the third row holds a newline inside a quoted field, so it ends on line 5
    assert [row for row, _ in info.value.errors] == [2, 5]
    assert len(store) == 0


def test_import_rejects_missing_column(tmp_path):
    path = tmp_path / "in.csv"
    write_rows(path, csv_with_rows(path, {}), [c for c in COLUMNS if c != "tuning_ms"])
    store = ResultsStore(tmp_path / "r.sqlite")
    with pytest.raises(ResultsImportError) as info:
        store.import_csv(path)
    assert info.value.errors[0][0] == 1 and "tuning_ms" in info.value.errors[0][1]
    assert len(store) == 0


def test_import_rejects_short_row(tmp_path):
    path = tmp_path / "in.csv"
    rows = csv_with_rows(path, {})
    write_rows(path, rows, COLUMNS)
    with open(path, "a", newline="", encoding="utf-8") as f:
        f.write("matmul,sig,cpu,tiled,1\n")  # five of nine fields
    store = ResultsStore(tmp_path / "r.sqlite")
    with pytest.raises(ResultsImportError) as info:
        store.import_csv(path)
    assert len(info.value.errors) == 1 and "missing" in info.value.errors[0][1]
    assert "tuning_ms" in info.value.errors[0][1]
    assert len(store) == 0


def test_statuses_constant():
    assert STATUSES == ("chosen", "timed", "slower", "pruned", "unsupported", "numerics",
                        "error", "skipped")

