"""Offline tuning: record the signatures a program meets, tune them later, in another process.

Why: tuning on a signature's first call costs tens of milliseconds (more for a first kernel
compile) inside the program's own run, and production runs with ``tuning=False`` never tune at all.
With ``record_untuned`` on, every signature met without a valid tuned entry is kept in the results
store with its ``spec()`` (op, shapes, strides, dtypes, 16-byte alignment class of every pointer,
the op's arguments, which outputs alias which inputs), once per (op, signature, device name).
:func:`tune_recorded` rebuilds each one's inputs (:func:`rebuild_params`: fresh random values, the
exact recorded layout) and tunes it exactly as the online path would (:func:`find_fastest` under
the same settings: budget, numerical check, margin), one at a time, except that every candidate
first runs once outside the budget (:func:`warm_candidates`): first-use compilation is a cost of
the tuning process, not of the signature, and a fresh worker would otherwise spend the budget on it.

Resumable: an entry is written as soon as its signature is tuned, and the untuned record is
removed only after that, so a kill (Ctrl-C, SIGKILL, a crash) loses at most the signature being
tuned; a new run skips every record that now has a complete, valid entry. Records are taken through
claims (``claims.py``), so several processes may tune one store at once
(:func:`tunekit.offline.parallel.tune_parallel`: one worker per GPU) and a dead worker's item is
retaken.

Files of records: ``files.py``. One signature's tuning: ``tune_one.py``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Callable

import torch

from . import claims, process_start
from .rebuild import rebuild_params
from .summary import Progress, TuneSummary
from .tune_one import ATTEMPTS, default_device, entry_problems, offline_settings, on_device, tune_params
from ..tunable import context, validators
from ..tunable.registry import get_op
from ..tunable.entries import UntunedRecord
from ..tunable.errors import ResultsStoreError
from ..tunable.results import ResultsStore
from ..tunable.screen import reason
from ..tunable.stores import results_store

__all__ = ["DEFAULT_LEASE_S", "process", "work", "check_ops", "as_store", "forget_ops", "tune_recorded", "finish",
           "on_device"]

#: a claim is retaken after this long even if its owner looks alive (another host, a hung process)
DEFAULT_LEASE_S = 1800.0


def process(store: ResultsStore, record: UntunedRecord, device: torch.device, settings, owner: str,
            attempts: int = ATTEMPTS) -> tuple[str, str]:
    """Tune one claimed record; ("tuned" | "incomplete" | "already" | "failed", reason). The entry is
    stored before the record is removed and the claim released. ResultsStoreError when the store
    cannot save it (its file failed in use): the run must stop rather than lose every later entry."""
    try:
        if record.damaged:
            raise ValueError(f"damaged record in the results file: {record.damaged}")
        op = get_op(record.op)
        entry = store.get(record.op, record.signature, record.device)
        if not entry_problems(op, entry, device):
            store.remove_untuned(record.op, record.signature, record.device)
            claims.release(store, record, owner)
            return "already", ""
        params = rebuild_params(op, record.spec, device)
        if params.signature() != record.signature:
            raise ValueError(f"the rebuilt inputs give signature {params.signature()!r}")
        entry = tune_params(op, params, settings, attempts=attempts)
        store.put(entry)
        store.require_writable("save tuning results")  # the file failed: stop, loudly, losing no more
    except ResultsStoreError:
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C, SystemExit: give the item back, then stop
            with contextlib.suppress(Exception):
                claims.release(store, record, owner)
            raise
        claims.mark(store, record, owner, "failed", reason(exc))
        return "failed", reason(exc)
    if not entry.complete:
        claims.mark(store, record, owner, "incomplete", "tuning budget exhausted")
        return "incomplete", "tuning budget exhausted on every attempt"
    store.remove_untuned(record.op, record.signature, record.device)
    claims.release(store, record, owner)
    return "tuned", ""


def work(store: ResultsStore, device: torch.device, settings, *, run: str, owner: str | None = None,
         ops=None, keys=None, lease_s: float = DEFAULT_LEASE_S, attempts: int = ATTEMPTS,
         event: Callable[[str, str], None] | None = None) -> TuneSummary:
    """Claim and tune records of ``device``'s name until none is free (one worker's loop).
    ``event(kind, label)``: "start" before an item, then its outcome. ResultsStoreError when the
    store does not save what is tuned (read-only, or its file failed)."""
    owner = owner or claims.owner_id()
    summary = TuneSummary(device=validators.device_name(device))
    store.require_writable("tune")  # tuning into a file that drops or forgets the entries is lost work
    while True:
        record = claims.claim_next(store, summary.device, owner=owner, run=run, lease_s=lease_s, ops=ops,
                                    keys=keys)
        if record is None:
            return summary
        label = f"{record.op} {record.signature}"
        if event is not None:
            event("start", label)
        kind, why = process(store, record, device, settings, owner, attempts)
        if kind == "failed":
            summary.failed.append([record.op, record.signature, why])
        else:
            setattr(summary, kind, getattr(summary, kind) + 1)
        if event is not None:
            event(kind, label)


def check_ops(ops) -> frozenset | None:
    """Op names, checked (KeyError names the known ones); None: every op."""
    if ops is None:
        return None
    ops = [ops] if isinstance(ops, str) else list(ops)
    return frozenset(get_op(name).name for name in ops)


def as_store(store) -> ResultsStore:
    return store if isinstance(store, ResultsStore) else results_store(store)


def forget_ops(names) -> None:
    """Drop in-memory choices of these ops, so calls in this process see the new entries."""
    for name in sorted(set(names)):
        with contextlib.suppress(KeyError):
            get_op(name).forget()


def tune_recorded(store=None, *, ops=None, device=None, progress: Progress | None = None,
                  settings: context.TuningSettings | None = None, keys=None, lease_s: float = DEFAULT_LEASE_S,
                  attempts: int = ATTEMPTS, run: str | None = None) -> TuneSummary:
    """Tune, in this process and one at a time, every recorded untuned signature of ``device``'s
    name (default: the current CUDA device, else the CPU) that has no complete valid entry yet.

    ``store``: a ResultsStore or a path (default: the store the settings name). ``ops``: op names to
    tune (default all). ``keys``: only these (op, signature, device) records (see :func:`tune_file`).
    ``settings``: tuning settings (default: those in force; tuning is forced on). ``progress(done,
    total, label)`` is called before each signature and once at the end (label "done").
    """
    store, device = as_store(store), torch.device(device) if device is not None else default_device()
    ops, settings = check_ops(ops), offline_settings(settings, store)
    store.require_writable("tune")
    start = time.perf_counter()
    name = validators.device_name(device)
    records, _ = claims.pending(store, name, ops=ops, keys=keys)
    total, done = len(records), 0

    def event(kind, label):
        nonlocal done
        if kind == "start":
            if progress is not None:
                progress(done, total, label)
        else:
            done += 1

    process_start.prepare(device)
    summary = work(store, device, settings, run=run or uuid.uuid4().hex, ops=ops, keys=keys, lease_s=lease_s,
                   attempts=attempts, event=event)
    return finish(summary, store, name, ops, keys, records, start, progress)


def finish(summary: TuneSummary, store, name, ops, keys, records, start, progress) -> TuneSummary:
    """Fill in the totals, tell ``progress``, and make this process's calls see the new entries."""
    left, others = claims.pending(store, name, ops=ops, keys=keys)
    summary.total, summary.remaining, summary.other_devices = len(records), len(left), others
    summary.wall_s = time.perf_counter() - start
    if progress is not None:
        progress(summary.done, summary.total, "done")
    forget_ops(r.op for r in records)
    return summary
