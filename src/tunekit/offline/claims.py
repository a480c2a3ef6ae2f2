"""Work claims for offline tuning: which process is tuning which recorded signature.

Why a table of claims: several processes (one per GPU, or two ``tunekit tune`` runs started by
hand) tune the untuned records of one results store. Each takes the next record inside one SQLite
write transaction (``BEGIN IMMEDIATE``: one writer at a time), so no two take the same one. A claim
names its owner (``host:pid``), the run (one ``tunekit tune`` invocation, its workers included) and a
lease. It is free again when its owner is gone (same host, process dead or a zombie: a killed
worker's item is retaken at once) or when the lease ran out (an owner on another host, or a hung
one). Items that failed, or tuned incomplete, in this run are not retried in this run (a new run
tries them again).

The table lives in the results file itself (an extra table is allowed by the store's format check)
and is reached through the store's own connection, so an in-memory store works alike and every
write goes through the store's lock, busy timeout and retries.
"""

from __future__ import annotations

import os
import socket
import time

from ..tunable.entries import UntunedRecord, untuned_from_row
from ..tunable.results import ResultsStore

__all__ = ["CLAIMS_TABLE", "owner_id", "owner_alive", "pending", "unfinished", "claim_next", "release", "mark"]

CLAIMS_TABLE = "tune_claims"
_CREATE = (f"CREATE TABLE IF NOT EXISTS {CLAIMS_TABLE} (op TEXT NOT NULL, signature TEXT NOT NULL,"
           " device TEXT NOT NULL, owner TEXT NOT NULL, run TEXT NOT NULL, state TEXT NOT NULL,"
           " expires REAL NOT NULL, reason TEXT, PRIMARY KEY (op, signature, device))")
_PENDING = (f"SELECT u.op, u.signature, u.device, u.spec, u.first_seen, c.owner, c.run, c.state, c.expires "
            f"FROM untuned u LEFT JOIN {CLAIMS_TABLE} c "
            "ON c.op = u.op AND c.signature = u.signature AND c.device = u.device "
            "WHERE u.device = ? ORDER BY u.first_seen, u.op, u.signature")
_KEY = "op = ? AND signature = ? AND device = ?"
#: states of a claim that keep an item out of the rest of its run
FINISHED_STATES = ("failed", "incomplete")


def owner_id() -> str:
    """This process as a claim owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """False only when ``owner`` is certainly gone: a process of this host that no longer exists or
    is a zombie (killed, not yet reaped by its parent). Other hosts count as alive (leases cover them)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or os.name == "nt":
        return True  # os.kill(pid, 0) would terminate the process on Windows
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, someone else's
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _claimable(row, *, owner: str, run: str, now: float) -> bool:
    c_owner, c_run, c_state, c_expires = row[5:9]
    if c_owner is None:
        return True
    if c_state in FINISHED_STATES:
        return c_run != run
    return c_expires < now or (c_owner != owner and not owner_alive(c_owner))


def _wanted(row, ops, keys) -> bool:
    return (ops is None or row[0] in ops) and (keys is None or tuple(row[:3]) in keys)


def _record(row) -> UntunedRecord:
    """The record of a row; a damaged one (spec or first_seen unparseable) is claimed like any other
    and fails with its ``damaged`` reason, so it is reported instead of stopping the run."""
    try:
        return untuned_from_row(*row[:5])
    except ValueError as exc:
        return UntunedRecord(str(row[0]), str(row[1]), str(row[2]), None, 0.0, damaged=str(exc))


def pending(store: ResultsStore, device: str, *, ops=None, keys=None) -> tuple[list[UntunedRecord], int]:
    """Untuned records of ``device`` (a device name), filtered by op names and (op, signature, device)
    keys, and how many records of other device names the store holds."""
    def read(conn):
        conn.execute(_CREATE)
        rows = conn.execute(_PENDING, (device,)).fetchall()
        others = conn.execute("SELECT COUNT(*) FROM untuned WHERE device != ?", (device,)).fetchone()[0]
        return rows, others
    rows, others = store.transaction(read)
    return [_record(r) for r in rows if _wanted(r, ops, keys)], others


def unfinished(store: ResultsStore, device: str, *, run: str, ops=None, keys=None) -> int:
    """Records of ``device`` this run has not finished: free, or claimed (being tuned) by anyone.
    A plain read (no write lock): call it after :func:`pending` has made the claims table."""
    return sum(1 for row in store.query(_PENDING, (device,))
               if _wanted(row, ops, keys) and not (row[7] in FINISHED_STATES and row[6] == run))


def claim_next(store: ResultsStore, device: str, *, owner: str, run: str, lease_s: float, ops=None,
               keys=None) -> UntunedRecord | None:
    """Atomically claim the next free record of ``device``; None when none is free."""
    def claim(conn):
        now = time.time()
        conn.execute(_CREATE)
        for row in conn.execute(_PENDING, (device,)).fetchall():
            if _wanted(row, ops, keys) and _claimable(row, owner=owner, run=run, now=now):
                conn.execute(f"INSERT OR REPLACE INTO {CLAIMS_TABLE} (op, signature, device, owner, run, state, "
                             "expires, reason) VALUES (?, ?, ?, ?, ?, 'claimed', ?, NULL)",
                             (*row[:3], owner, run, now + lease_s))
                return _record(row)
        return None
    return store.transaction(claim)


def release(store: ResultsStore, record: UntunedRecord, owner: str) -> None:
    """Drop our claim on ``record`` (done, or given back)."""
    store.transaction(lambda conn: conn.execute(f"DELETE FROM {CLAIMS_TABLE} WHERE {_KEY} AND owner = ?",
                                           (record.op, record.signature, record.device, owner)))


def mark(store: ResultsStore, record: UntunedRecord, owner: str, state: str, reason: str) -> None:
    """Keep ``record`` out of the rest of this run (``state`` one of FINISHED_STATES), saying why."""
    assert state in FINISHED_STATES
    store.transaction(lambda conn: conn.execute(
        f"UPDATE {CLAIMS_TABLE} SET state = ?, reason = ? WHERE {_KEY} AND owner = ?",
        (state, reason[:500], record.op, record.signature, record.device, owner)))
