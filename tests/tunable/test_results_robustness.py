"""The results store under stress: many processes at once, corrupt, foreign and unwritable files."""

import os
import pathlib
import sqlite3
import subprocess
import sys
import time
import warnings

import pytest

from tunekit.tunable.errors import TunekitWarning
from tunekit.tunable.results import (
    ResultsStore,
)

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

import store_helpers
from store_helpers import assert_usable_empty_memory_store, make_entry, open_quietly



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


def make_garbage_pages(path):
    """A valid header and first page, random bytes after it."""
    write_store(path)
    data = path.read_bytes()
    path.write_bytes(data[:4096] + os.urandom(len(data) - 4096))


def make_damaged_tail(path):
    """Page 1 and the small tables intact, later pages of entries random: only a full
    check of the tables (PRAGMA quick_check) notices."""
    write_store(path)
    data = path.read_bytes()
    half = len(data) // 2
    path.write_bytes(data[:half] + os.urandom(len(data) - half))


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
    (make_garbage_pages, "corrupt"),
    (make_damaged_tail, "corrupt"),
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
    assert caught[0].filename == store_helpers.__file__  # points at the code that opened the store
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
    assert caught[0].filename == __file__
    assert str(path) in str(caught[0].message) and "no such table" in store.problem
    assert store.in_memory
    conn = sqlite3.connect(path)  # the in-memory writes did not touch the file
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} >= {"untuned", "meta"}
    assert "entries" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()


def test_damaged_row_reads_as_absent_and_is_overwritten(tmp_path):
    path = tmp_path / "results.sqlite"
    store = ResultsStore(path)
    store.put(make_entry(signature="ok"))
    store.put(make_entry(signature="edited"))
    conn = sqlite3.connect(path)  # a hand edit leaves one row unparseable
    conn.execute("UPDATE entries SET candidates = '{oops' WHERE signature = 'edited'")
    conn.commit()
    conn.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.get("matmul", "edited", "cpu") is None
        assert [e.signature for e in store.entries()] == ["ok"]
        store.put(make_entry(signature="edited"))  # retuning overwrites it
        assert store.get("matmul", "edited", "cpu") == make_entry(signature="edited")
    assert not store.in_memory


# --- CSV -----------------------------------------------------------------------------------------

