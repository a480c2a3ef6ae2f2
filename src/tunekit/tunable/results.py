"""Persistent store of tuning results: which candidate won for an (op, signature, device).

Tuning is expensive, so its outcome is kept in an SQLite file that many processes (loader workers,
parallel tests, jobs on one node) read and write at once: ``BEGIN IMMEDIATE`` writes and a long busy
timeout make that safe without a server. A rollback journal keeps the file self-contained: a
committed write is in the file itself, so a copy of the file alone has every entry. Nested data is
JSON, never pickle; schema and row format: :mod:`tunekit.tunable.entries`. Stdlib only (no torch).

The store never takes the program down, and never loses data without saying so. A read-only file
(a container image, a read-only mount) is read as usual; writes are dropped with one warning. A
corrupt, foreign or unusable file is left untouched: one warning, then an empty in-memory store, so
tuning still works but is not saved. Explicit writes (imports, offline tuning) check ``writable``
or call ``require_writable`` and fail instead."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import random
import sqlite3
import sys
import threading
import time
import urllib.parse
import warnings
import weakref

from .entries import (APPLICATION_ID, CSV_COLUMNS, SCHEMA, SCHEMA_VERSION, CandidateRecord, Entry, UntunedRecord,
                      check_entry, default_results_path, inspect_schema, load_rows, load_untuned, read_csv, to_row,
                      write_csv)
from .errors import ResultsStoreError, TunekitWarning

__all__ = ["ResultsStore", "SCHEMA_VERSION", "APPLICATION_ID", "CandidateRecord", "Entry", "UntunedRecord",
           "default_results_path"]

_BUSY_TIMEOUT_MS = 30_000
_LOCK_RETRIES = 5
_SQLITE_MAGIC = b"SQLite format 3\x00"
_IS_KEY = "op = ? AND signature = ? AND device = ?"
_SELECT_ENTRIES = f"SELECT {', '.join(CSV_COLUMNS)} FROM entries"
_UPSERT_ENTRY = (f"INSERT OR REPLACE INTO entries ({', '.join(CSV_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(CSV_COLUMNS))})")


class _Problem(Exception):
    """The file at the store's path cannot be used; the message says why."""


def _retry(fn):
    """Call fn, retrying when SQLite reports a lock it did not wait out (rare with the busy timeout)."""
    for attempt in range(_LOCK_RETRIES):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if attempt == _LOCK_RETRIES - 1 or not ("locked" in str(e) or "busy" in str(e)):
                raise
            time.sleep(0.05 * 2 ** attempt * (1 + random.random()))


def _transaction(conn: sqlite3.Connection, fn, mode: str = "IMMEDIATE"):
    """fn(conn) in one transaction.  Writes use IMMEDIATE: taking the write lock up front
    avoids the deadlock two deferred transactions hit when both upgrade to writing."""
    conn.execute(f"BEGIN {mode}")
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    if mode == "IMMEDIATE":  # a file still in WAL mode: the commit into the main file (no-op otherwise)
        with contextlib.suppress(sqlite3.Error):  # committed: a failed checkpoint loses nothing
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return result


def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
    """A connection with no implicit transactions (we BEGIN/COMMIT); one to ":memory:" has the tables."""
    conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=False, uri=uri)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    for statement in SCHEMA if target == ":memory:" else ():
        conn.execute(statement)
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables unless another process won the race to do so."""
    if inspect_schema(conn) == "new":  # look again, now holding the write lock
        for statement in SCHEMA:
            conn.execute(statement)


def _check(conn: sqlite3.Connection) -> str:
    """inspect_schema ("new" or "ours"), then a quick_check of a store of ours."""
    state = _retry(lambda: _transaction(conn, inspect_schema, "DEFERRED"))
    if state == "ours":
        check = conn.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise _Problem(f"is corrupt (quick_check: {' '.join(str(check[0][0]).split())[:200]})")
    return state


def _header(p: pathlib.Path) -> bytes | None:
    """The file's first bytes (None when it does not exist, its folder made); _Problem if unreadable."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise _Problem("is a directory")
        with open(p, "rb") as f:
            header = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Problem(f"cannot be created or read ({e.strerror or e})") from None
    if header and header != _SQLITE_MAGIC:
        raise _Problem("is not an SQLite database (corrupt, or some other kind of file)")
    return header


def _unwritable(p: pathlib.Path) -> str:
    """Why this process cannot write the store at p ("" when it can)."""
    ok = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)
    return "" if ok else "the file, or its folder (where SQLite's journal goes), is not writable"


def _open_read_only(path: str) -> sqlite3.Connection:
    """The store at path, read-only; ``immutable`` if that needs files SQLite cannot make (WAL, read-only mount)."""
    uri, error = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro", None
    for flags in ("", "&immutable=1"):
        conn = _connect(uri + flags, uri=True)
        try:
            if _check(conn) == "new":
                raise _Problem("is empty and read-only")
            return conn
        except sqlite3.OperationalError as e:  # cannot read or lock it this way: try the next
            conn.close()
            error = e
        except BaseException:
            conn.close()
            raise
    raise _Problem(f"cannot be read ({error})")


def _open_writable(p: pathlib.Path) -> sqlite3.Connection:
    """The store at p for reading and writing, its tables made if it is new. A file left in WAL mode
    is switched to a rollback journal; while another process has it open that fails at once and the
    file stays in WAL mode, each write then checkpointed (see _transaction)."""
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise _Problem("cannot be created (its folder is not writable)")
    conn = _connect(str(p))
    try:
        state = _check(conn)
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode = DELETE").fetchall()
        if state == "new":
            _retry(lambda: _transaction(conn, _create_schema))
        return conn
    except BaseException:
        conn.close()
        raise


def _open_file(path: str, read_only: bool) -> tuple[sqlite3.Connection, str]:
    """(connection, why it is read-only or "") for the store at path, created if needed; _Problem says
    why it cannot be used. Nothing is written before the file is known to be empty or ours."""
    p = pathlib.Path(path)
    exists = _header(p) is not None
    why = "opened read-only" if read_only else _unwritable(p) if exists else ""
    try:
        if not why:
            return _open_writable(p), ""
        if not exists:
            raise _Problem("does not exist (and is opened read-only)")
        return _open_read_only(path), why
    except ValueError as e:  # inspect_schema: not a store of ours
        raise _Problem(str(e)) from None
    except sqlite3.Error as e:
        raise _Problem(f"is corrupt or unusable ({e})") from None


def _outside_caller() -> int:
    """The warnings stacklevel that points at the first caller outside this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


_STORES: weakref.WeakSet = weakref.WeakSet()
_INHERITED: list = []  # connections from before a fork: kept so garbage collection never closes them


def _new_locks_after_fork() -> None:
    """A lock some other thread held at fork would never be released in the child."""
    for store in list(_STORES):
        store._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)


@atexit.register
def _close_at_exit() -> None:
    """Every store this process opened is closed at exit (checkpointed first, if in WAL mode)."""
    for store in list(_STORES):
        store.close(timeout=1.0)


class ResultsStore:
    """Tuning results in an SQLite file, safe to share between threads and processes. ``path`` None means
    default_results_path(); ":memory:" gives a private in-memory store. ``read_only`` (or a file this
    process cannot write): writes are dropped with one warning, the attribute then says why. If the
    file cannot be used, ``in_memory`` becomes True and ``problem`` says why."""

    def __init__(self, path: str | os.PathLike | None = None, *, read_only: bool = False):
        self.path = os.fspath(default_results_path() if path is None else path)
        self.in_memory = self.path == ":memory:"
        self.problem: str | None = None
        self.read_only = ""  # why writes are not possible ("" when they are)
        self._open_read_only, self._warned_read_only = bool(read_only), False
        self._lock, self._conn, self._pid = threading.Lock(), None, os.getpid()
        _STORES.add(self)
        with self._lock:
            self._connection()

    @property
    def writable(self) -> bool:
        """Writes land where this store says they go: the file, or a ":memory:" store asked for."""
        return not self.read_only and self.problem is None

    def require_writable(self, doing: str) -> None:
        """Raise ResultsStoreError, saying why, unless writes are saved (before and after explicit
        writes: an import, offline tuning); ``doing`` names what cannot be done."""
        if self.problem is not None:
            raise ResultsStoreError(f"cannot {doing}: results file {self.path!r} {self.problem}; nothing would be "
                                    "saved (remove or move the file to start a new one)")
        if self.read_only:
            raise ResultsStoreError(f"cannot {doing}: results file {self.path!r} is read-only ({self.read_only})")

    def _connection(self) -> sqlite3.Connection:
        """This process's connection, (re)opened after close() or fork; call holding the lock."""
        if self._conn is not None and self._pid != os.getpid() and not self.in_memory:
            _INHERITED.append(self._conn)  # SQLite forbids using or closing it after fork
            self._conn = None
        self._pid = os.getpid()
        if self._conn is None:
            if self.in_memory:
                self._conn = _connect(":memory:")
            else:
                try:
                    self._conn, self.read_only = _open_file(self.path, self._open_read_only)
                except _Problem as e:
                    self._fall_back(str(e))
        return self._conn

    def _fall_back(self, problem: str) -> None:
        """Switch to an empty in-memory store and say so (once: no file is left to fail)."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self.in_memory, self.problem, self.read_only = True, problem, ""
        self._conn = _connect(":memory:")
        warnings.warn(f"tunekit results file {self.path!r} {problem}; tuning results will not be saved and "
                      "results stored in it are not used (using an empty in-memory store instead)",
                      TunekitWarning, stacklevel=_outside_caller())

    def _drop(self, why: str = "") -> None:
        """A write the read-only file cannot take: dropped, said once."""
        self.read_only = why or self.read_only
        if not self._warned_read_only:
            self._warned_read_only = True
            warnings.warn(f"tunekit results file {self.path!r} is read-only ({self.read_only}): results not "
                          "saved (stored results are still used)", TunekitWarning, stacklevel=_outside_caller())

    def _run(self, fn, write: bool = False, dropped=None):
        """fn(conn) under the lock; if the file turns out broken, fall back and run it again. A
        write the file cannot take returns ``dropped``."""
        with self._lock:
            conn = self._connection()
            if write and self.read_only:
                self._drop()
                return dropped
            try:
                return _retry(lambda: fn(conn))
            except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.DataError):
                raise  # a bug in the caller or in us, not a broken file
            except sqlite3.DatabaseError as e:
                if self.in_memory:
                    raise
                if write and ("readonly" in str(e) or _unwritable(pathlib.Path(self.path))):  # a remount, chmod
                    self._drop(f"became read-only while in use: {e}")
                    return dropped
                self._fall_back(f"failed while in use ({e})")
                return fn(self._conn)

    def transaction(self, fn):
        """``fn(connection)`` in one write transaction (``BEGIN IMMEDIATE``) under the store's lock, busy
        timeout and retries; its result. For other components' tables in the file (offline tuning's
        claims). ResultsStoreError when the file is read-only (there is no result to give)."""
        result = self._write(fn)
        if self.read_only:  # the write was dropped
            self.require_writable("write")
        return result

    def query(self, sql: str, params=()) -> list:
        """The rows of one read statement, under the store's lock and retries."""
        return self._run(lambda conn: conn.execute(sql, params).fetchall())

    def _write(self, fn, dropped=None):
        return self._run(lambda conn: _transaction(conn, fn), write=True, dropped=dropped)
    _read = query

    def get(self, op: str, signature: str, device: str) -> Entry | None:
        """The entry for (op, signature, device), or None."""
        found = load_rows(self._read(f"{_SELECT_ENTRIES} WHERE {_IS_KEY}", (op, signature, device)))
        return found[0] if found else None

    def put(self, entry: Entry) -> None:
        """Insert or replace the entry for its (op, signature, device); ValueError if invalid."""
        check_entry(entry)
        row = to_row(entry)
        self._write(lambda conn: conn.execute(_UPSERT_ENTRY, row))

    def entries(self, op: str | None = None) -> list[Entry]:
        """All entries (of op, if given), ordered by op, signature, device."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
        return load_rows(self._read(f"{_SELECT_ENTRIES} {where} ORDER BY op, signature, device", params))

    def delete(self, op: str, signature: str, device: str) -> bool:
        """Delete one entry; True if it existed."""
        return self._write(lambda conn: conn.execute(
            f"DELETE FROM entries WHERE {_IS_KEY}", (op, signature, device)).rowcount, dropped=0) > 0

    def clear(self, op: str | None = None) -> int:
        """Delete entries and untuned records (of op, or all); return how many entries went."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())

        def clear_tables(conn):
            conn.execute(f"DELETE FROM untuned {where}", params)
            return conn.execute(f"DELETE FROM entries {where}", params).rowcount
        return self._write(clear_tables, dropped=0)

    def __len__(self) -> int:
        return self._read("SELECT COUNT(*) FROM entries")[0][0]

    def record_untuned(self, op: str, signature: str, device: str, spec: dict) -> bool:
        """Remember a signature met without a tuned entry, for offline tuning; True if new."""
        row = (op, signature, device, json.dumps(spec), time.time())
        return self._write(lambda conn: conn.execute(
            "INSERT OR IGNORE INTO untuned (op, signature, device, spec, first_seen) "
            "VALUES (?, ?, ?, ?, ?)", row).rowcount, dropped=0) == 1

    def untuned(self, op: str | None = None) -> list[UntunedRecord]:
        """Untuned records (of op), ordered by op, signature, device; damaged rows left out with a warning."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
        records, damaged = load_untuned(self._read(f"SELECT op, signature, device, spec, first_seen FROM untuned "
                                                   f"{where} ORDER BY op, signature, device", params))
        if damaged:
            warnings.warn(f"tunekit results file {self.path!r}: {damaged}", TunekitWarning, stacklevel=_outside_caller())
        return records

    def remove_untuned(self, op: str, signature: str, device: str) -> None:
        """Forget an untuned record (typically once it has been tuned)."""
        self._write(lambda conn: conn.execute(
            f"DELETE FROM untuned WHERE {_IS_KEY}", (op, signature, device)))

    def export_csv(self, path) -> int:
        """All entries to a CSV file, floats exact, whole or not at all (entries.write_csv); rows written."""
        return write_csv(path, self.entries())

    def import_csv(self, path) -> int:
        """Upsert every row of a CSV file like export_csv writes; return rows imported. All or nothing:
        if any row is bad, ResultsImportError lists them all (entries.read_csv) and nothing is imported.
        ResultsStoreError when the rows could not be saved (a read-only or unusable file)."""
        rows = read_csv(path)
        self.require_writable("import results")
        self._write(lambda conn: conn.executemany(_UPSERT_ENTRY, rows))
        self.require_writable("import results")  # the file may have failed during the write
        return len(rows)

    def close(self, timeout: float = -1) -> None:
        """Close the connection, a file left in WAL mode checkpointed into the main file first; a later
        call reopens it (an in-memory store then is empty). ``timeout``: seconds to wait for another
        thread's call (at exit), -1 for ever."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            if self._conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):  # a no-op with a rollback journal
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                self._conn.close()
            self._conn = None
        finally:
            self._lock.release()
