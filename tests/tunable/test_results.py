"""Tests for the SQLite results store: real files, real sqlite, real processes."""

import csv
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import threading
import time
import warnings

import pytest

from tunekit.tunable.errors import ResultsImportError, TunekitWarning
from tunekit.tunable.results import (
    APPLICATION_ID, SCHEMA_VERSION, STATUSES, CandidateRecord, Entry, ResultsStore,
    UntunedRecord, default_results_path,
)

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def make_entry(op="matmul", signature="f16[64,64]@f16[64,64]", device="cpu", **kw):
    fields = dict(
        choice="tiled",
        complete=True,
        validators={"torch": "2.13.0", "src:tiled": "ab12cd", "gpu": "NVIDIA H100 80GB HBM3"},
        candidates={
            "tiled": CandidateRecord("chosen", 0.1 + 0.2, None),
            "naive": CandidateRecord("slower", 1e-300, "3.2x slower than tiled"),
            "fancy": CandidateRecord("numerics", None, "max abs err 0.5 > 1e-3 (Ünïcødé 漢字 🚀)"),
            "blocked": CandidateRecord("unsupported"),
        },
        tuned_at=1_700_000_000.123456789,
        tuning_ms=1234.5678901234,
    )
    fields.update(kw)
    return Entry(op, signature, device, **fields)


def open_quietly(path):
    """Open a store, returning it and the TunekitWarnings raised while opening."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = ResultsStore(path)
    return store, [w for w in caught if issubclass(w.category, TunekitWarning)]


def assert_usable_empty_memory_store(store):
    assert store.in_memory and store.problem
    assert len(store) == 0 and store.entries() == []
    entry = make_entry()
    store.put(entry)
    assert store.get(entry.op, entry.signature, entry.device) == entry


# --- basic behaviour ---------------------------------------------------------------------------

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


def test_file_layout(tmp_path):
    path = tmp_path / "results.sqlite"
    ResultsStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
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

CHILD = r"""
import pathlib, sys, time, warnings
from tunekit.tunable.results import CandidateRecord, Entry, ResultsStore
path, rank, ready_dir = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
(ready_dir / f"ready-{rank}").touch()
while not (ready_dir / "go").exists():   # open the new file all at the same moment
    time.sleep(0.005)
warnings.simplefilter("error")           # falling back to memory would lose the writes
for k in range(10):                      # more races to create a schema, on smaller files
    race = ResultsStore(ready_dir / f"race{k}.sqlite")
    race.put(Entry("op", str(rank), "cpu", "c", True, {}, {"c": CandidateRecord("chosen")}, 0.0))
    race.close()
store = ResultsStore(path)
for i in range(50):
    store.put(Entry("op", f"p{rank}-{i}", "cpu", "c", True, {"rank": str(rank)},
                    {"c": CandidateRecord("chosen", float(i))}, time.time(), 1.0))
store.close()
"""


def test_eight_processes_write_to_one_new_file(tmp_path):
    path = tmp_path / "shared" / "results.sqlite"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(rank), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank in range(8)]
    try:
        deadline = time.monotonic() + 300  # importing tunekit may import torch: slow on 2 cores
        while len(list(tmp_path.glob("ready-*"))) < 8:
            assert time.monotonic() < deadline, "children did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        (tmp_path / "go").touch()
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err.decode()
    store = ResultsStore(path)
    assert not store.in_memory
    assert len(store) == 400
    assert {e.signature for e in store.entries()} == {f"p{r}-{i}" for r in range(8) for i in range(50)}
    for k in range(10):
        assert len(ResultsStore(tmp_path / f"race{k}.sqlite")) == 8


# --- bad files -----------------------------------------------------------------------------------

def write_store(path, n=300):
    """A valid store spanning many pages, so that cutting it loses tables."""
    store = ResultsStore(path)
    for i in range(n):
        store.put(make_entry(signature=f"sig{i}", validators={"blob": "x" * 300}))
    store.close()


def make_random(path):
    path.write_bytes(os.urandom(64 * 1024))


def make_truncated(path):
    write_store(path)
    data = path.read_bytes()
    assert len(data) > 4 * 4096
    path.write_bytes(data[: len(data) // 2])


def make_foreign_sqlite(path):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('alice')")
    conn.commit()
    conn.close()


def make_other_application_id(path):
    write_store(path, n=1)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 12345")
    conn.close()


def make_newer_schema(path):
    write_store(path, n=1)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


def make_text(path):
    path.write_text("these are my notes, not a database\n" * 20)


@pytest.mark.parametrize("make, words", [
    (make_random, "not an SQLite database"),
    (make_truncated, "corrupt"),
    (make_foreign_sqlite, "another application"),
    (make_other_application_id, "another application"),
    (make_newer_schema, "newer tunekit"),
    (make_text, "not an SQLite database"),
])
def test_bad_file_falls_back_to_memory_with_one_warning(tmp_path, make, words):
    path = tmp_path / "results.sqlite"
    make(path)
    original = path.read_bytes()
    store, caught = open_quietly(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert str(path) in message and words in message and "will not be saved" in message
    assert words in store.problem
    with warnings.catch_warnings(record=True) as later:  # no further warnings while in use
        warnings.simplefilter("always")
        assert_usable_empty_memory_store(store)
        store.record_untuned("op", "sig", "cpu", {})
        store.close()
    assert later == []
    assert path.read_bytes() == original


def test_empty_and_missing_files_become_new_stores(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "a" / "b" / "new.sqlite"):
        store, caught = open_quietly(path)
        assert caught == [] and not store.in_memory
        store.put(make_entry())
        store.close()
        assert len(ResultsStore(path)) == 1


@pytest.mark.parametrize("kind", ["under_a_file", "is_a_directory", "read_only_dir"])
def test_unwritable_location_falls_back_with_one_warning(tmp_path, kind):
    if kind == "under_a_file":
        (tmp_path / "plain").write_text("x")
        path = tmp_path / "plain" / "results.sqlite"
    elif kind == "is_a_directory":
        path = tmp_path / "results.sqlite"
        path.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root can write to read-only directories")
        (tmp_path / "ro").mkdir()
        path = tmp_path / "ro" / "results.sqlite"
        os.chmod(tmp_path / "ro", 0o555)
    try:
        store, caught = open_quietly(path)
        assert len(caught) == 1 and str(path) in str(caught[0].message)
        assert_usable_empty_memory_store(store)
    finally:
        os.chmod(path.parent, 0o755)


def test_database_error_during_use_falls_back_once(tmp_path):
    path = tmp_path / "results.sqlite"
    store = ResultsStore(path)
    store.put(make_entry(signature="saved"))
    other = sqlite3.connect(path)  # someone breaks the file behind the store's back
    other.execute("DROP TABLE entries")
    other.commit()
    other.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get("matmul", "saved", "cpu") is None
        store.put(make_entry(signature="later"))
        assert store.get("matmul", "later", "cpu") == make_entry(signature="later")
        assert len(store) == 1
    assert len(caught) == 1 and issubclass(caught[0].category, TunekitWarning)
    assert str(path) in str(caught[0].message) and "no such table" in store.problem
    assert store.in_memory
    conn = sqlite3.connect(path)  # the in-memory writes did not touch the file
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} >= {"untuned", "meta"}
    assert "entries" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()


# --- CSV -----------------------------------------------------------------------------------------

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
    ({"candidates": "{not json"}, "not valid JSON"),
    ({"validators": "[1, 2]"}, "validators"),
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
