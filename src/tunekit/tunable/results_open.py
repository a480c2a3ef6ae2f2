"""Opening a results file (:mod:`tunekit.tunable.results`): the checks that nothing is written to a
file before it is known to be empty or ours (SQLite's magic, the schema, ``quick_check``), the
read-only and WAL cases, and the transactions and retries every access shares. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import sqlite3
import time
import urllib.parse

from .entries import SCHEMA, inspect_schema

__all__ = ["Problem", "retry", "transaction", "connect", "open_file", "unwritable", "absent_and_creatable"]

_BUSY_TIMEOUT_MS = 30_000
_LOCK_RETRIES = 5
_SQLITE_MAGIC = b"SQLite format 3\x00"


class Problem(Exception):
    """The file at the store's path cannot be used; the message says why."""


def retry(fn):
    """Call fn, retrying when SQLite reports a lock it did not wait out (rare with the busy timeout)."""
    for attempt in range(_LOCK_RETRIES):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if attempt == _LOCK_RETRIES - 1 or not ("locked" in str(e) or "busy" in str(e)):
                raise
            time.sleep(0.05 * 2 ** attempt * (1 + random.random()))


def transaction(conn: sqlite3.Connection, fn, mode: str = "IMMEDIATE"):
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


def connect(target: str, uri: bool = False) -> sqlite3.Connection:
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
    state = retry(lambda: transaction(conn, inspect_schema, "DEFERRED"))
    if state == "ours":
        check = conn.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise Problem(f"is corrupt (quick_check: {' '.join(str(check[0][0]).split())[:200]})")
    return state


def _header(p: pathlib.Path) -> bytes | None:
    """The file's first bytes (None when it does not exist, its folder made); Problem if unreadable."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise Problem("is a directory")
        with open(p, "rb") as f:
            header = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Problem(f"cannot be created or read ({e.strerror or e})") from None
    if header and header != _SQLITE_MAGIC:
        raise Problem("is not an SQLite database (corrupt, or some other kind of file)")
    return header


def unwritable(p: pathlib.Path) -> str:
    """Why this process cannot write the store at p ("" when it can)."""
    ok = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)
    return "" if ok else "the file, or its folder (where SQLite's journal goes), is not writable"


def _open_read_only(path: str) -> sqlite3.Connection:
    """The store at path, read-only; ``immutable`` if that needs files SQLite cannot make (WAL, read-only mount)."""
    uri, error = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro", None
    for flags in ("", "&immutable=1"):
        conn = connect(uri + flags, uri=True)
        try:
            if _check(conn) == "new":
                raise Problem("is empty and read-only")
            return conn
        except sqlite3.OperationalError as e:  # cannot read or lock it this way: try the next
            conn.close()
            error = e
        except BaseException:
            conn.close()
            raise
    raise Problem(f"cannot be read ({error})")


def _open_writable(p: pathlib.Path) -> sqlite3.Connection:
    """The store at p for reading and writing, its tables made if it is new. A file left in WAL mode
    is switched to a rollback journal; while another process has it open that fails at once and the
    file stays in WAL mode, each write then checkpointed (see transaction)."""
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise Problem("cannot be created (its folder is not writable)")
    conn = connect(str(p))
    try:
        state = _check(conn)
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode = DELETE").fetchall()
        if state == "new":
            retry(lambda: transaction(conn, _create_schema))
        return conn
    except BaseException:
        conn.close()
        raise


def open_file(path: str, read_only: bool) -> tuple[sqlite3.Connection, str]:
    """(connection, why it is read-only or "") for the store at path, created if needed; Problem says
    why it cannot be used. Nothing is written before the file is known to be empty or ours."""
    p = pathlib.Path(path)
    exists = _header(p) is not None
    why = "opened read-only" if read_only else unwritable(p) if exists else ""
    try:
        if not why:
            return _open_writable(p), ""
        if not exists:
            raise Problem("does not exist (and is opened read-only)")
        return _open_read_only(path), why
    except ValueError as e:  # inspect_schema: not a store of ours
        raise Problem(str(e)) from None
    except sqlite3.Error as e:
        raise Problem(f"is corrupt or unusable ({e})") from None


def absent_and_creatable(path: str) -> bool:
    """Whether ``path`` names no file yet, in a folder this process can create files in: the store then
    makes it at its first write, not when opened. Making it (the schema's transaction, its fsyncs) took
    1-2 ms of a process's first call, H100 host, where a read of the empty store can only find nothing."""
    p = pathlib.Path(path)
    try:
        if p.exists() or p.is_symlink():  # a dangling link: opening says what is wrong with it
            return False
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False  # opening gives the reason
    return os.access(p.parent, os.W_OK | os.X_OK)
