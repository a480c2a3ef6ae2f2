"""Persistent store of tuning results: which candidate won for an (op, signature, device).

Tuning is expensive, so its outcome is kept in an SQLite file that many processes (loader
workers, parallel tests, jobs on one node) read and write at once: WAL mode, ``BEGIN
IMMEDIATE`` writes and a long busy timeout make that safe without a server.  Nested data is
JSON, never pickle (:mod:`tunekit.tunable.entries`).

The store never takes the program down.  A file that is corrupt, foreign or unwritable is
left untouched; the store warns once and carries on as an empty in-memory store, so tuning
still works but is not saved.  Stdlib only (no torch), so tools can read results cheaply.
The values it stores and their row format are :mod:`tunekit.tunable.entries`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import pathlib
import random
import sqlite3
import sys
import threading
import time
import warnings
import weakref

from .entries import (CSV_COLUMNS, CandidateRecord, Entry, UntunedRecord, check_entry, default_results_path, from_csv,
                      load_rows, to_row)
from .errors import ResultsImportError, TunekitWarning

__all__ = ["ResultsStore", "SCHEMA_VERSION", "APPLICATION_ID", "CandidateRecord", "Entry", "UntunedRecord",
           "default_results_path"]

SCHEMA_VERSION = 1
APPLICATION_ID = 0x544B5231  # "TKR1" in PRAGMA application_id marks the file as ours

_BUSY_TIMEOUT_MS = 30_000
_LOCK_RETRIES = 5
_SQLITE_MAGIC = b"SQLite format 3\x00"
_KEY_COLUMNS = "op TEXT NOT NULL, signature TEXT NOT NULL, device TEXT NOT NULL"
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS entries ({_KEY_COLUMNS}, choice TEXT NOT NULL, complete INTEGER NOT NULL,"
    " validators TEXT NOT NULL, candidates TEXT NOT NULL, tuned_at REAL NOT NULL,"
    " tuning_ms REAL NOT NULL, PRIMARY KEY (op, signature, device))",
    f"CREATE TABLE IF NOT EXISTS untuned ({_KEY_COLUMNS}, spec TEXT NOT NULL, first_seen REAL NOT NULL,"
    " PRIMARY KEY (op, signature, device))",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    f"INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')",
    f"PRAGMA application_id = {APPLICATION_ID}",  # part of the transaction, like the tables
)
_IS_KEY = "op = ? AND signature = ? AND device = ?"
_SELECT_ENTRIES = f"SELECT {', '.join(CSV_COLUMNS)} FROM entries"
_UPSERT_ENTRY = (f"INSERT OR REPLACE INTO entries ({', '.join(CSV_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(CSV_COLUMNS))})")


class _Problem(Exception):
    """The file at the store's path cannot be used; the message says why."""


def _retry(fn):
    """Call fn, retrying when SQLite reports a lock it did not wait out (rare with the busy
    timeout, but e.g. switching to WAL fails at once while another process holds a lock)."""
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
        return result
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _connect(target: str) -> sqlite3.Connection:
    """A connection with no implicit transactions (we BEGIN/COMMIT ourselves); one to
    ":memory:" comes with the tables made."""
    conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    for statement in _SCHEMA if target == ":memory:" else ():
        conn.execute(statement)
    return conn


def _inspect(conn: sqlite3.Connection) -> str:
    """Return "new" for an empty database, "ours" for a tunekit store; raise _Problem otherwise.
    Call in a transaction: between two autocommit reads another process could create the
    schema, and we would see its tables without its application_id."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id == 0 and not tables:
        return "new"
    if app_id != APPLICATION_ID:
        raise _Problem(f"is an SQLite database of another application (application_id {app_id:#x})")
    missing = sorted({"entries", "untuned", "meta"} - tables)
    if missing:
        raise _Problem(f"is missing table(s) {', '.join(missing)}")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = str(row[0]) if row else ""
    if not version.isdigit() or int(version) < 1:
        raise _Problem(f"has an invalid schema_version {version!r}")
    if int(version) > SCHEMA_VERSION:
        raise _Problem(f"was written by a newer tunekit (schema version {version}, "
                       f"this one reads {SCHEMA_VERSION})")
    return "ours"


def _create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables unless another process won the race to do so."""
    if _inspect(conn) == "new":  # look again, now holding the write lock
        for statement in _SCHEMA:
            conn.execute(statement)


def _open_file(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the store at path, or raise _Problem saying why it cannot be
    used.  Nothing is written before the file is known to be empty or ours."""
    p = pathlib.Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise _Problem("is a directory")
        with open(p, "rb") as f:
            header = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        header = b""
    except OSError as e:
        raise _Problem(f"cannot be created or read ({e.strerror or e})") from None
    if header and header != _SQLITE_MAGIC:
        raise _Problem("is not an SQLite database (corrupt, or some other kind of file)")
    try:
        conn = _connect(path)
    except sqlite3.Error as e:
        raise _Problem(f"cannot be opened ({e})") from None
    try:
        state = _retry(lambda: _transaction(conn, _inspect, "DEFERRED"))
        if state == "ours":
            check = conn.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise _Problem(f"is corrupt (quick_check: {' '.join(str(check[0][0]).split())[:200]})")
        _retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchall())
        if state == "new":
            _retry(lambda: _transaction(conn, _create_schema))
        return conn
    except sqlite3.Error as e:
        conn.close()
        raise _Problem(f"is corrupt or unusable ({e})") from None
    except BaseException:
        conn.close()
        raise


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


class ResultsStore:
    """Tuning results in an SQLite file, safe to share between threads and processes.
    ``path`` None means default_results_path(); ":memory:" gives a private in-memory store.
    If the file cannot be used, ``in_memory`` becomes True and ``problem`` says why."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(default_results_path() if path is None else path)
        self.in_memory = self.path == ":memory:"
        self.problem: str | None = None
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        _STORES.add(self)
        with self._lock:
            self._connection()

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
                    self._conn = _open_file(self.path)
                except _Problem as e:
                    self._fall_back(str(e))
        return self._conn

    def _fall_back(self, problem: str) -> None:
        """Switch to an empty in-memory store and say so (once: no file is left to fail)."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self.in_memory, self.problem = True, problem
        self._conn = _connect(":memory:")
        warnings.warn(f"tunekit results file {self.path!r} {problem}; tuning results will not "
                      "be saved (using an empty in-memory store instead)", TunekitWarning,
                      stacklevel=_outside_caller())

    def _run(self, fn):
        """fn(conn) under the lock; if the file turns out broken, fall back and run it again."""
        with self._lock:
            try:
                return _retry(lambda: fn(self._connection()))
            except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.DataError):
                raise  # a bug in the caller or in us, not a broken file
            except sqlite3.DatabaseError as e:
                if self.in_memory:
                    raise
                self._fall_back(f"failed while in use ({e})")
                return fn(self._conn)

    def transaction(self, fn):
        """``fn(connection)`` in one write transaction (``BEGIN IMMEDIATE``), under the store's lock,
        busy timeout and retries; its result. For tables of other components kept in the same file
        (offline tuning's work claims): the store's own tables are read and written by the methods
        below."""
        return self._run(lambda conn: _transaction(conn, fn))

    def query(self, sql: str, params=()) -> list:
        """The rows of one read statement, under the store's lock and retries."""
        return self._run(lambda conn: conn.execute(sql, params).fetchall())

    _write, _read = transaction, query

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
            f"DELETE FROM entries WHERE {_IS_KEY}", (op, signature, device)).rowcount) > 0

    def clear(self, op: str | None = None) -> int:
        """Delete entries and untuned records (of op, or all); return how many entries went."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())

        def clear_tables(conn):
            conn.execute(f"DELETE FROM untuned {where}", params)
            return conn.execute(f"DELETE FROM entries {where}", params).rowcount
        return self._write(clear_tables)

    def __len__(self) -> int:
        return self._read("SELECT COUNT(*) FROM entries")[0][0]

    def record_untuned(self, op: str, signature: str, device: str, spec: dict) -> bool:
        """Remember a signature met without a tuned entry, for offline tuning; True if new."""
        row = (op, signature, device, json.dumps(spec), time.time())
        return self._write(lambda conn: conn.execute(
            "INSERT OR IGNORE INTO untuned (op, signature, device, spec, first_seen) "
            "VALUES (?, ?, ?, ?, ?)", row).rowcount) == 1

    def untuned(self, op: str | None = None) -> list[UntunedRecord]:
        """Untuned records (of op, if given), ordered by op, signature, device; a row that
        does not parse is skipped, like a damaged entry."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
        records = []
        for *key, spec, first_seen in self._read(
                f"SELECT op, signature, device, spec, first_seen FROM untuned {where} "
                "ORDER BY op, signature, device", params):
            with contextlib.suppress(TypeError, ValueError):
                records.append(UntunedRecord(*key, json.loads(spec), float(first_seen)))
        return records

    def remove_untuned(self, op: str, signature: str, device: str) -> None:
        """Forget an untuned record (typically once it has been tuned)."""
        self._write(lambda conn: conn.execute(
            f"DELETE FROM untuned WHERE {_IS_KEY}", (op, signature, device)))

    def export_csv(self, path) -> int:
        """Write all entries to a CSV file (to move results between machines, or review them);
        return rows written.  Floats are written exactly (repr)."""
        entries = self.entries()
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_COLUMNS)
            writer.writerows(to_row(e) for e in entries)
        return len(entries)

    def import_csv(self, path) -> int:
        """Upsert every row of a CSV file like export_csv writes; return rows imported.
        All or nothing: every row is checked first; if any is bad, ResultsImportError lists
        them all as (line number, reason), the header being line 1, and nothing is imported."""
        rows, errors, reader = [], [], None
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                absent = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
                if absent:
                    raise ResultsImportError(path, [(1, f"header lacks column(s) {', '.join(absent)}")])
                for row in reader:
                    try:
                        rows.append(to_row(from_csv(row)))
                    except ValueError as e:
                        errors.append((reader.line_num, str(e)))
        except (UnicodeDecodeError, csv.Error) as e:
            line = reader.line_num if reader is not None else 0
            raise ResultsImportError(path, [(line, f"unreadable ({e})")]) from None
        if errors:
            raise ResultsImportError(path, errors)
        self._write(lambda conn: conn.executemany(_UPSERT_ENTRY, rows))
        return len(rows)

    def close(self) -> None:
        """Close the connection.  A later call reopens it (an in-memory store then is empty)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
