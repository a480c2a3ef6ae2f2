"""Persistent store of tuning results: which candidate won for an (op, signature, device).

Tuning is expensive, so its outcome is kept in an embedded SQLite file that many processes
(data loader workers, parallel test runs, several jobs on one node) may read and write at
once.  SQLite in WAL mode with ``BEGIN IMMEDIATE`` write transactions and a long busy
timeout gives us that without a server.  Nested data is stored as JSON, never pickle: the
file may come from elsewhere and must never be able to run code.

The store must never take the program down.  A file that is corrupt, truncated, belongs to
another application, or cannot be written is left untouched; the store warns once and
carries on as an empty in-memory store, so tuning still works but is not saved.

This module is stdlib only (no torch) so tools can inspect results cheaply.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import random
import sqlite3
import threading
import time
import warnings
import weakref
from dataclasses import dataclass

from tunekit.tunable.errors import ResultsImportError, TunekitWarning

SCHEMA_VERSION = 1
APPLICATION_ID = 0x544B5231  # "TKR1": PRAGMA application_id, marks the file as ours
STATUSES = ("chosen", "timed", "slower", "pruned", "unsupported", "numerics", "error", "skipped")
CSV_COLUMNS = ("op", "signature", "device", "choice", "complete", "tuned_at", "tuning_ms",
               "validators", "candidates")

_BUSY_TIMEOUT_MS = 30_000
_LOCK_RETRIES = 5
_SQLITE_MAGIC = b"SQLite format 3\x00"
_TABLES = ("entries", "untuned", "meta")
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        op TEXT NOT NULL, signature TEXT NOT NULL, device TEXT NOT NULL,
        choice TEXT NOT NULL, complete INTEGER NOT NULL,
        validators TEXT NOT NULL, candidates TEXT NOT NULL,
        tuned_at REAL NOT NULL, tuning_ms REAL NOT NULL,
        PRIMARY KEY (op, signature, device))""",
    """CREATE TABLE IF NOT EXISTS untuned (
        op TEXT NOT NULL, signature TEXT NOT NULL, device TEXT NOT NULL,
        spec TEXT NOT NULL, first_seen REAL NOT NULL,
        PRIMARY KEY (op, signature, device))""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    f"INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')",
    f"PRAGMA application_id = {APPLICATION_ID}",  # transactional: set with the tables
)
_ENTRY_COLUMNS = "op, signature, device, choice, complete, validators, candidates, tuned_at, tuning_ms"


@dataclass(frozen=True)
class CandidateRecord:
    """What happened to one candidate while tuning: its status, time, and why."""

    status: str                   # one of STATUSES
    time_ms: float | None = None  # median time when timed
    reason: str | None = None     # why rejected / not chosen


@dataclass
class Entry:
    """The tuning result for one op on one input signature on one device."""

    op: str
    signature: str
    device: str                   # device name, e.g. "NVIDIA H100 80GB HBM3" or "cpu"
    choice: str                   # name of the chosen candidate; a key of candidates
    complete: bool                # False when tuned under an exhausted budget
    validators: dict[str, str]    # environment facts + per-candidate source hashes
    candidates: dict[str, CandidateRecord]
    tuned_at: float               # unix time
    tuning_ms: float = 0.0        # wall time tuning took


@dataclass(frozen=True)
class UntunedRecord:
    """A signature met without a tuned entry, kept so it can be tuned offline later."""

    op: str
    signature: str
    device: str
    spec: dict                    # JSON-able description to rebuild the inputs
    first_seen: float


def default_results_path() -> pathlib.Path:
    """$TUNEKIT_RESULTS, else $XDG_CACHE_HOME/tunekit/results.sqlite, else ~/.cache/tunekit/...

    Results are a cache of measurements, so they live in the user's cache directory.
    """
    explicit = os.environ.get("TUNEKIT_RESULTS")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(cache).expanduser() if cache else pathlib.Path.home() / ".cache"
    return base / "tunekit" / "results.sqlite"


class _Problem(Exception):
    """The file at the store's path cannot be used; the message says why."""


# --- validation and (de)serialisation -------------------------------------------------------

def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_entry(entry: Entry) -> None:
    """Raise ValueError unless entry is storable; put() and import_csv() share these rules,
    so whatever is exported can always be imported again."""
    for name in ("op", "signature", "device", "choice"):
        value = getattr(entry, name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if not isinstance(entry.complete, bool):
        raise ValueError(f"complete must be a bool, got {entry.complete!r}")
    for name in ("tuned_at", "tuning_ms"):
        if not _is_number(getattr(entry, name)):
            raise ValueError(f"{name} must be a finite number, got {getattr(entry, name)!r}")
    if not isinstance(entry.validators, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in entry.validators.items()):
        raise ValueError("validators must be a dict of str -> str")
    if not isinstance(entry.candidates, dict):
        raise ValueError("candidates must be a dict of name -> CandidateRecord")
    for name, rec in entry.candidates.items():
        if not isinstance(name, str) or not isinstance(rec, CandidateRecord):
            raise ValueError(f"candidate {name!r} must map a str to a CandidateRecord")
        if rec.status not in STATUSES:
            raise ValueError(f"candidate {name!r} has unknown status {rec.status!r}")
        if rec.time_ms is not None and not _is_number(rec.time_ms):
            raise ValueError(f"candidate {name!r} time_ms must be a finite number or null")
        if rec.reason is not None and not isinstance(rec.reason, str):
            raise ValueError(f"candidate {name!r} reason must be a string or null")
    if entry.choice not in entry.candidates:
        raise ValueError(f"choice {entry.choice!r} is not one of the candidates")


def _candidates_json(candidates: dict[str, CandidateRecord]) -> str:
    return json.dumps({name: {"status": r.status, "time_ms": r.time_ms, "reason": r.reason}
                       for name, r in candidates.items()})


def _candidates_from_json(text: str) -> dict[str, CandidateRecord]:
    """Parse candidates JSON, checking its shape (values are checked by _check_entry)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("candidates must be a JSON object")
    out = {}
    for name, rec in data.items():
        if not isinstance(rec, dict) or "status" not in rec or set(rec) - {"status", "time_ms", "reason"}:
            raise ValueError(f"candidate {name!r} must be an object with status, time_ms, reason")
        t = rec.get("time_ms")
        out[name] = CandidateRecord(rec["status"], float(t) if _is_number(t) else t, rec.get("reason"))
    return out


def _entry_from_row(row) -> Entry:
    op, signature, device, choice, complete, validators, candidates, tuned_at, tuning_ms = row
    entry = Entry(op, signature, device, choice, bool(complete), json.loads(validators),
                  _candidates_from_json(candidates), float(tuned_at), float(tuning_ms))
    _check_entry(entry)
    return entry


def _entry_params(entry: Entry) -> tuple:
    return (entry.op, entry.signature, entry.device, entry.choice, int(entry.complete),
            json.dumps(entry.validators), _candidates_json(entry.candidates),
            float(entry.tuned_at), float(entry.tuning_ms))


def _entry_from_csv(row: dict) -> Entry:
    """Build an Entry from one CSV row, raising ValueError with a readable reason."""
    if None in row:
        raise ValueError(f"has more fields than the {len(CSV_COLUMNS)} columns")
    empty = [c for c in CSV_COLUMNS if not (row.get(c) or "").strip()]
    if empty:
        raise ValueError(f"missing or empty column(s): {', '.join(empty)}")
    complete = row["complete"].strip().lower()
    if complete not in ("0", "1", "true", "false"):
        raise ValueError(f"complete must be 0/1/true/false, got {row['complete']!r}")
    numbers = {}
    for name in ("tuned_at", "tuning_ms"):
        try:
            numbers[name] = float(row[name])
        except ValueError:
            raise ValueError(f"{name} is not a number: {row[name]!r}") from None
    try:
        validators = json.loads(row["validators"])
    except ValueError as e:
        raise ValueError(f"validators is not valid JSON ({e})") from None
    try:
        candidates = _candidates_from_json(row["candidates"])
    except json.JSONDecodeError as e:
        raise ValueError(f"candidates is not valid JSON ({e})") from None
    entry = Entry(row["op"], row["signature"], row["device"], row["choice"],
                  complete in ("1", "true"), validators, candidates, **numbers)
    _check_entry(entry)
    return entry


# --- connections -----------------------------------------------------------------------------

def _retry(fn):
    """Call fn, retrying when SQLite reports a lock it could not wait out (rare with the busy
    timeout, but e.g. switching to WAL can fail at once while another process holds a lock)."""
    for attempt in range(_LOCK_RETRIES):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            message = str(e).lower()
            if attempt == _LOCK_RETRIES - 1 or ("locked" not in message and "busy" not in message):
                raise
            time.sleep(0.05 * 2 ** attempt * (1 + random.random()))


def _connect(target: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so transactions are explicit.
    conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    return conn


def _memory_connection() -> sqlite3.Connection:
    conn = _connect(":memory:")
    for statement in _SCHEMA:
        conn.execute(statement)
    return conn


def _inspect(conn: sqlite3.Connection) -> str:
    """Return "new" for an empty database, "ours" for a tunekit store; raise _Problem otherwise.

    Reads in one transaction: between two autocommit reads another process could create the
    schema, and we would see tables without our application_id.
    """
    if not conn.in_transaction:
        conn.execute("BEGIN")
        try:
            return _inspect(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # read only: nothing to keep
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id == 0 and not tables:
        return "new"
    if app_id != APPLICATION_ID:
        raise _Problem(f"is an SQLite database of another application (application_id {app_id:#x})")
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise _Problem(f"is missing table(s) {', '.join(missing)}")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = row[0] if row else None
    if not (isinstance(version, (int, str)) and str(version).isdigit() and int(version) >= 1):
        raise _Problem(f"has an invalid schema_version {version!r}")
    if int(version) > SCHEMA_VERSION:
        raise _Problem(f"was written by a newer tunekit (schema version {version}, "
                       f"this one reads {SCHEMA_VERSION})")
    return "ours"


def _create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables unless another process won the race to do so."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _inspect(conn) == "new":  # re-check under the write lock
            for statement in _SCHEMA:
                conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _open_file(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the store at path; raise _Problem if it cannot be used.

    Nothing is written until the file is known to be empty or ours, so a foreign file is
    never modified.
    """
    p = pathlib.Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _Problem(f"cannot be created ({e.strerror or e})") from None
    if p.is_dir():
        raise _Problem("is a directory")
    try:
        with open(p, "rb") as f:
            header = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        header = b""
    except OSError as e:
        raise _Problem(f"cannot be read ({e.strerror or e})") from None
    if header and header != _SQLITE_MAGIC:
        raise _Problem("is not an SQLite database (corrupt, or some other kind of file)")
    try:
        conn = _connect(path)
    except sqlite3.Error as e:
        raise _Problem(f"cannot be opened ({e})") from None
    try:
        state = _retry(lambda: _inspect(conn))
        if state == "ours":
            check = conn.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise _Problem(f"is corrupt (quick_check: {check[0][0]})")
        _retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchall())
        if state == "new":
            _retry(lambda: _create_schema(conn))
        return conn
    except sqlite3.Error as e:
        conn.close()
        raise _Problem(f"is corrupt or unreadable ({e})") from None
    except BaseException:
        conn.close()
        raise


_STORES: weakref.WeakSet = weakref.WeakSet()


def _reset_locks_after_fork() -> None:
    # A lock held by another thread at fork time would never be released in the child.
    for store in list(_STORES):
        store._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


class ResultsStore:
    """Tuning results in an SQLite file, safe to share between threads and processes.

    ``path`` None means default_results_path(); ":memory:" gives a private in-memory store.
    If the file cannot be used, ``in_memory`` becomes True and ``problem`` says why.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(default_results_path() if path is None else path)
        self.in_memory = self.path == ":memory:"
        self.problem: str | None = None
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._inherited: list[sqlite3.Connection] = []
        _STORES.add(self)
        with self._lock:
            self._connection()

    def __repr__(self) -> str:
        where = f"in memory, {self.problem}" if self.problem else ("in memory" if self.in_memory else "")
        return f"ResultsStore({self.path!r}{', ' + where if where else ''})"

    # -- connection management (call with self._lock held) --

    def _connection(self) -> sqlite3.Connection:
        """The connection for this process, reopening after close() or fork."""
        if self._conn is not None and self._pid != os.getpid() and not self.in_memory:
            # Never use or close a connection inherited through fork: SQLite forbids it.
            # Keep it referenced so garbage collection does not close it either.
            self._inherited.append(self._conn)
            self._conn = None
        self._pid = os.getpid()
        if self._conn is None:
            if self.in_memory:
                self._conn = _memory_connection()
            else:
                try:
                    self._conn = _open_file(self.path)
                except _Problem as e:
                    self._fall_back(str(e))
        return self._conn

    def _fall_back(self, problem: str) -> None:
        """Switch to an empty in-memory store and say so, once."""
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self.in_memory, self.problem = True, problem
        self._conn = _memory_connection()
        warnings.warn(f"tunekit results file {self.path!r} {problem}; tuning results will not "
                      f"be saved (using an empty in-memory store instead)", TunekitWarning,
                      stacklevel=5)

    def _run(self, fn):
        """Run fn(conn) under the lock; if the file turns out broken, fall back and rerun."""
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

    def _write(self, fn):
        """Run fn(conn) in one BEGIN IMMEDIATE transaction (taking the write lock up front
        avoids the deadlock two deferred transactions can hit when both upgrade)."""
        def transaction(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
                return result
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        return self._run(transaction)

    def _read(self, sql: str, params=()) -> list:
        return self._run(lambda conn: conn.execute(sql, params).fetchall())

    # -- entries --

    def get(self, op: str, signature: str, device: str) -> Entry | None:
        """The entry for (op, signature, device), or None (also if its row is unreadable)."""
        rows = self._read(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE op = ? AND signature = ? "
                          "AND device = ?", (op, signature, device))
        entries = _load_entries(rows)
        return entries[0] if entries else None

    def put(self, entry: Entry) -> None:
        """Insert or replace the entry for its (op, signature, device). ValueError if invalid."""
        _check_entry(entry)
        params = _entry_params(entry)
        self._write(lambda conn: _upsert(conn, [params]))

    def entries(self, op: str | None = None) -> list[Entry]:
        """All entries (of op, if given), ordered by op, signature, device."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
        return _load_entries(self._read(f"SELECT {_ENTRY_COLUMNS} FROM entries {where} "
                                         "ORDER BY op, signature, device", params))

    def delete(self, op: str, signature: str, device: str) -> bool:
        """Delete one entry; True if it existed."""
        return self._write(lambda conn: conn.execute(
            "DELETE FROM entries WHERE op = ? AND signature = ? AND device = ?",
            (op, signature, device)).rowcount) > 0

    def clear(self, op: str | None = None) -> int:
        """Delete entries and untuned records (of op, or all); return how many entries went."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())

        def clear_tables(conn):
            conn.execute(f"DELETE FROM untuned {where}", params)
            return conn.execute(f"DELETE FROM entries {where}", params).rowcount
        return self._write(clear_tables)

    def __len__(self) -> int:
        return self._read("SELECT COUNT(*) FROM entries")[0][0]

    # -- untuned signatures --

    def record_untuned(self, op: str, signature: str, device: str, spec: dict) -> bool:
        """Remember a signature met without a tuned entry; True if it was not known yet."""
        params = (op, signature, device, json.dumps(spec), time.time())
        return self._write(lambda conn: conn.execute(
            "INSERT OR IGNORE INTO untuned (op, signature, device, spec, first_seen) "
            "VALUES (?, ?, ?, ?, ?)", params).rowcount) == 1

    def untuned(self, op: str | None = None) -> list[UntunedRecord]:
        """Untuned records (of op, if given), ordered by op, signature, device."""
        where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
        rows = self._read(f"SELECT op, signature, device, spec, first_seen FROM untuned {where} "
                          "ORDER BY op, signature, device", params)
        records = []
        for op_, signature, device, spec, first_seen in rows:
            try:
                records.append(UntunedRecord(op_, signature, device, json.loads(spec), float(first_seen)))
            except (TypeError, ValueError):
                continue  # an unreadable row is as good as absent
        return records

    def remove_untuned(self, op: str, signature: str, device: str) -> None:
        """Forget an untuned record (typically once it has been tuned)."""
        self._write(lambda conn: conn.execute(
            "DELETE FROM untuned WHERE op = ? AND signature = ? AND device = ?",
            (op, signature, device)))

    # -- CSV, for moving results between machines and reviewing them by hand --

    def export_csv(self, path) -> int:
        """Write all entries to a CSV file (columns CSV_COLUMNS); return rows written."""
        entries = self.entries()
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_COLUMNS)
            for e in entries:
                p = _entry_params(e)
                writer.writerow([e.op, e.signature, e.device, e.choice, p[4], repr(p[7]),
                                 repr(p[8]), p[5], p[6]])
        return len(entries)

    def import_csv(self, path) -> int:
        """Upsert every row of a CSV file written by export_csv; return rows imported.

        All or nothing: every row is validated first, and if any is bad ResultsImportError
        lists them all (numbered by line, the header being line 1) and nothing is imported.
        """
        entries, errors = [], []
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None:
                    raise ResultsImportError(path, [(1, "empty file, expected a header")])
                absent = [c for c in CSV_COLUMNS if c not in reader.fieldnames]
                if absent:
                    raise ResultsImportError(path, [(1, f"header lacks column(s) {', '.join(absent)}")])
                for row in reader:
                    try:
                        entries.append(_entry_from_csv(row))
                    except ValueError as e:
                        errors.append((reader.line_num, str(e)))
        except UnicodeDecodeError as e:
            raise ResultsImportError(path, [(0, f"not UTF-8 text ({e})")]) from None
        except csv.Error as e:
            raise ResultsImportError(path, [(reader.line_num, f"unreadable CSV ({e})")]) from None
        if errors:
            raise ResultsImportError(path, errors)
        params = [_entry_params(e) for e in entries]
        self._write(lambda conn: _upsert(conn, params))
        return len(entries)

    def close(self) -> None:
        """Close the connection (a later call reopens it; an in-memory store starts empty)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _upsert(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    conn.executemany(f"INSERT OR REPLACE INTO entries ({_ENTRY_COLUMNS}) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def _load_entries(rows) -> list[Entry]:
    """Rows to entries, skipping any that do not parse: a hand-edited or damaged row is
    treated as untuned (and gets retuned and overwritten) rather than crashing the caller."""
    entries = []
    for row in rows:
        try:
            entries.append(_entry_from_row(row))
        except (TypeError, ValueError):
            continue
    return entries
