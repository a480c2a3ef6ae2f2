"""The results file as a file: self-contained after every write (a copy of it alone has every entry),
readable when read-only (forced, by permissions, and on a real read-only mount), and a store whose
writes would be lost says so to every caller that asks."""

import os
import shutil
import sqlite3
import sys
import textwrap
import warnings

import pytest

import read_only_mount as read_only_mount_helpers
from read_only_mount import READ_ONLY
from store_helpers import make_entry
from tunekit.tunable.errors import ResultsStoreError, TunekitWarning
from tunekit.tunable.results import ResultsStore

def filled(path, n=5) -> ResultsStore:
    store = ResultsStore(path)
    for i in range(n):
        store.put(make_entry(signature=f"sig{i}"))
    return store


def copy_alone(path, tmp_path):
    """The main file copied on its own (no -wal, -shm or -journal), as shipping a results file does."""
    (tmp_path / "copy").mkdir(exist_ok=True)
    target = tmp_path / "copy" / "results.sqlite"
    shutil.copyfile(path, target)
    return target


def signatures(path) -> set:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT signature FROM entries")}
    finally:
        conn.close()


def recorded_warnings():
    catcher = warnings.catch_warnings(record=True)
    caught = catcher.__enter__()
    warnings.simplefilter("always")
    return catcher, caught


# --- self-contained ------------------------------------------------------------------------------

def test_a_copy_of_the_file_alone_has_every_entry_while_the_store_is_open(tmp_path):
    path = tmp_path / "results.sqlite"
    store = filled(path, 40)
    store.record_untuned("matmul", "new", "cpu", {"n": 1})
    assert not (tmp_path / "results.sqlite-wal").exists()
    copy = copy_alone(path, tmp_path)
    assert signatures(copy) == {f"sig{i}" for i in range(40)}
    assert len(ResultsStore(copy).untuned()) == 1
    store.close()


def make_wal_file(path):
    """A store some older writer left in WAL mode, every entry checkpointed."""
    filled(path, 2).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    conn.close()


def test_a_file_left_in_wal_mode_becomes_self_contained(tmp_path):
    path = tmp_path / "results.sqlite"
    make_wal_file(path)
    store = ResultsStore(path)
    store.put(make_entry(signature="after"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    assert signatures(copy_alone(path, tmp_path)) == {"sig0", "sig1", "after"}


def test_a_wal_file_another_process_holds_open_is_checkpointed_after_each_write(tmp_path):
    path = tmp_path / "results.sqlite"
    make_wal_file(path)
    other = sqlite3.connect(path)  # an older tunekit still using the file: it cannot leave WAL mode
    other.execute("SELECT COUNT(*) FROM entries").fetchall()
    store = ResultsStore(path)
    assert store.query("PRAGMA journal_mode")[0][0] == "wal" and store.writable
    store.put(make_entry(signature="after"))
    assert signatures(copy_alone(path, tmp_path)) == {"sig0", "sig1", "after"}
    store.put(make_entry(signature="later"))
    store.close()  # a checkpoint, then the -wal file is empty
    other.close()
    assert signatures(copy_alone(path, tmp_path)) == {"sig0", "sig1", "after", "later"}


# --- read-only -----------------------------------------------------------------------------------

def test_a_read_only_store_serves_every_entry_and_drops_writes_with_one_warning(tmp_path):
    path = tmp_path / "results.sqlite"
    filled(path, 3).close()
    before = path.read_bytes()
    catcher, caught = recorded_warnings()
    try:
        store = ResultsStore(path, read_only=True)
        assert caught == []  # reading is fine: nothing to say yet
        assert (store.read_only, store.writable, store.in_memory, store.problem) == ("opened read-only", False,
                                                                                    False, None)
        assert len(store) == 3 and store.get("matmul", "sig1", "cpu") == make_entry(signature="sig1")
        store.put(make_entry(signature="new"))
        assert store.record_untuned("matmul", "x", "cpu", {}) is False
        assert store.delete("matmul", "sig0", "cpu") is False and store.clear() == 0
        store.remove_untuned("matmul", "x", "cpu")
    finally:
        catcher.__exit__(None, None, None)
    assert len(caught) == 1 and issubclass(caught[0].category, TunekitWarning)
    message = str(caught[0].message)
    assert str(path) in message and "read-only" in message and "not saved" in message
    assert caught[0].filename == __file__
    assert len(store) == 3 and store.get("matmul", "new", "cpu") is None
    with pytest.raises(ResultsStoreError, match="read-only"):
        store.transaction(lambda conn: conn.execute("SELECT 1"))
    csv_file = tmp_path / "in.csv"
    ResultsStore(tmp_path / "other.sqlite").export_csv(csv_file)
    with pytest.raises(ResultsStoreError, match="cannot import results: .* is read-only"):
        store.import_csv(csv_file)
    store.close()
    assert path.read_bytes() == before


def test_read_only_missing_or_empty_files_are_problems_not_stores(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for path, words in ((tmp_path / "missing.sqlite", "does not exist"), (empty, "empty and read-only")):
        with pytest.warns(TunekitWarning, match=words):
            store = ResultsStore(path, read_only=True)
        assert store.in_memory and not store.writable
        with pytest.raises(ResultsStoreError, match=words):
            store.require_writable("tune")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write files whatever their permissions")
def test_a_store_without_write_permission_is_read(tmp_path):
    path = tmp_path / "results.sqlite"
    filled(path, 2).close()
    os.chmod(path, 0o444)
    try:
        store = ResultsStore(path)
        assert store.read_only and not store.writable and len(store) == 2
        with pytest.warns(TunekitWarning, match="read-only"):
            store.put(make_entry(signature="new"))
    finally:
        os.chmod(path, 0o644)


def test_a_file_that_fails_in_use_says_so_to_callers_that_ask(tmp_path):
    path = tmp_path / "results.sqlite"
    store = filled(path, 1)
    store.require_writable("tune")
    other = sqlite3.connect(path)
    other.execute("DROP TABLE entries")
    other.commit()
    other.close()
    with pytest.warns(TunekitWarning, match="failed while in use .*no such table.*will not be saved"):
        store.put(make_entry(signature="lost at exit"))
    assert not store.writable
    with pytest.raises(ResultsStoreError, match=f"cannot tune: results file '{path}' failed while in use"):
        store.require_writable("tune")


# --- a real read-only mount ----------------------------------------------------------------------

@pytest.fixture
def read_only_mount(tmp_path):
    return read_only_mount_helpers.runner(tmp_path)


READER = textwrap.dedent("""
    import json, sys, warnings
    from tunekit.tunable.results import ResultsStore
    from tunekit.tunable.entries import CandidateRecord, Entry
    warnings.simplefilter("always")
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        for name in sys.argv[1:]:
            store = ResultsStore(name)
            out[name] = {"read_only": store.read_only, "problem": store.problem, "n": len(store)}
            store.put(Entry("matmul", "new", "cpu", "c", True, {}, {"c": CandidateRecord("chosen")}, 0.0))
            out[name]["after"] = len(store)
    out["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(out))
""")


def test_a_store_on_a_read_only_mount_serves_every_entry(tmp_path, read_only_mount):
    folder = tmp_path / "shipped"
    folder.mkdir()
    filled(folder / "plain.sqlite", 4).close()
    make_wal_file(folder / "wal.sqlite")  # no -shm beside it, none can be made: read as immutable
    names = [str(folder / "plain.sqlite"), str(folder / "wal.sqlite")]
    done = read_only_mount(folder, f'exec "{sys.executable}" -c \'{READER}\' ' + " ".join(names))
    assert done.returncode == 0, done.stderr
    out = __import__("json").loads(done.stdout)
    assert out[names[0]] == {"read_only": "the file, or its folder (where SQLite's journal goes), is not writable",
                             "problem": None, "n": 4, "after": 4}
    assert out[names[1]]["n"] == 2 and out[names[1]]["problem"] is None
    assert len(out["warnings"]) == 2 and all("read-only" in w and "not saved" in w for w in out["warnings"])
    assert sorted(os.listdir(folder)) == ["plain.sqlite", "wal.sqlite"]


REMOUNTED = textwrap.dedent("""
    import subprocess, sys, warnings
    from tunekit.tunable.results import ResultsStore
    from tunekit.tunable.entries import CandidateRecord, Entry
    entry = lambda sig: Entry("matmul", sig, "cpu", "c", True, {}, {"c": CandidateRecord("chosen")}, 0.0)
    folder, path = sys.argv[1], sys.argv[1] + "/results.sqlite"
    store = ResultsStore(path)
    store.put(entry("before"))
    subprocess.run(["sh", "-c", sys.argv[2]], check=True)  # the folder becomes read-only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.put(entry("after"))
        store.put(entry("later"))
    assert len(caught) == 1 and "became read-only while in use" in str(caught[0].message), caught
    assert not store.writable and not store.in_memory and store.get("matmul", "before", "cpu") is not None
    print("ok")
""")


def test_a_store_whose_mount_turns_read_only_keeps_reading(tmp_path, read_only_mount):
    folder = tmp_path / "live"
    folder.mkdir()
    script = f'exec "{sys.executable}" -c \'{REMOUNTED}\' "{folder}" \'{READ_ONLY.format(folder=folder)}\''
    (tmp_path / "elsewhere").mkdir()
    done = read_only_mount(tmp_path / "elsewhere", script)  # "live" itself stays writable until the child says
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert signatures(folder / "results.sqlite") == {"before"}
