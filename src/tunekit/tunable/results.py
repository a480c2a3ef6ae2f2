"""Persistent store of tuning results: which candidate won for an (op, signature, device).

Tuning is expensive, so its outcome is kept in an SQLite file that many processes (loader workers,
parallel tests, jobs on one node) read and write at once: ``BEGIN IMMEDIATE`` writes and a long busy
timeout make that safe without a server. A rollback journal keeps the file self-contained: a
committed write is in the file itself, so a copy of the file alone has every entry. A file that does
not exist yet is made by the first write, not by opening: a process whose first calls find shipped
results writes nothing. Nested data is JSON, never pickle; schema and row format:
:mod:`tunekit.tunable.entries`; opening a file: :mod:`tunekit.tunable.results_open`. Stdlib only (no torch).

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
import sqlite3
import sys
import threading
import time
import warnings
import weakref

from .entries import (APPLICATION_ID, CSV_COLUMNS, SCHEMA_VERSION, CandidateRecord, Entry, UntunedRecord, check_entry,
                      default_results_path, load_rows, load_untuned, read_csv, to_row, write_csv)
from .errors import ResultsStoreError, TunekitWarning
from .results_open import Problem, absent_and_creatable, connect, open_file, retry, transaction, unwritable

__all__ = ["ResultsStore", "SCHEMA_VERSION", "APPLICATION_ID", "CandidateRecord", "Entry", "UntunedRecord",
           "default_results_path"]

_IS_KEY = "op = ? AND signature = ? AND device = ?"
_SELECT_ENTRIES = f"SELECT {', '.join(CSV_COLUMNS)} FROM entries"
_UPSERT_ENTRY = (f"INSERT OR REPLACE INTO entries ({', '.join(CSV_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(CSV_COLUMNS))})")


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
            if self.in_memory or self._open_read_only or not absent_and_creatable(self.path):
                self._connection()  # else made by the first write (see get)

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
                self._conn = connect(":memory:")
            else:
                try:
                    self._conn, self.read_only = open_file(self.path, self._open_read_only)
                except Problem as e:
                    self._fall_back(str(e))
        return self._conn

    def _fall_back(self, problem: str) -> None:
        """Switch to an empty in-memory store and say so (once: no file is left to fail)."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self.in_memory, self.problem, self.read_only = True, problem, ""
        self._conn = connect(":memory:")
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
                return retry(lambda: fn(conn))
            except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.DataError):
                raise  # a bug in the caller or in us, not a broken file
            except sqlite3.DatabaseError as e:
                if self.in_memory:
                    raise
                if write and ("readonly" in str(e) or unwritable(pathlib.Path(self.path))):  # a remount, chmod
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
        return self._run(lambda conn: transaction(conn, fn), write=True, dropped=dropped)
    _read = query

    def get(self, op: str, signature: str, device: str) -> Entry | None:
        """The entry for (op, signature, device), or None (at once when no file was made yet)."""
        if self._conn is None and not self.in_memory and not os.path.lexists(self.path):
            return None
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
