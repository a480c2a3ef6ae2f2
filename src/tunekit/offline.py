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
claims (``tunekit._claims``), so several processes may tune one store at once
(:func:`tunekit.parallel.tune_parallel`: one worker per GPU) and a dead worker's item is retaken.

Files: :func:`export_untuned` writes records as JSON lines (one object per line: op, signature,
device, spec, first_seen) and :func:`tune_file` tunes the records of such a file (e.g. recorded
on a production machine, tuned on an idle one of the same GPU model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import _claims, process_start
from .rebuild import rebuild_params
from .tunable import context, validators
from .tunable.errors import ResultsImportError
from .tunable.find_fastest import find_fastest
from .tunable.numerics import compare
from .tunable.params import OpParams, make_trial, output_tensors
from .tunable.registry import get_op
from .tunable.results import Entry, ResultsStore, UntunedRecord
from .tunable.stores import results_store
from .tunable.tunable_op import TUNING_LOCK

__all__ = ["TuneSummary", "rebuild_params", "warm_candidates", "tune_params", "entry_problems", "tune_recorded",
           "tune_file", "export_untuned", "read_untuned", "import_untuned", "text_progress", "default_device",
           "DEFAULT_LEASE_S", "ATTEMPTS"]

#: a claim is retaken after this long even if its owner looks alive (another host, a hung process)
DEFAULT_LEASE_S = 1800.0
#: tuning runs per signature until one completes. First-use compilation no longer needs a retry
#: (:func:`tune_params` warms every candidate outside the budget first); it stays as a safety net,
#: free when the first attempt completes, for one-off costs warm-up may not cover (a process's first
#: CUDA-graph capture, allocator growth for the L2-sized input sets) and stalls from other processes
ATTEMPTS = 2
Progress = Callable[[int, int, str], None]


@dataclass
class TuneSummary:
    """What one offline tuning run did, for one device name (merged over workers)."""

    device: str
    total: int = 0          # records of this device pending at the start (after the ops / keys filter)
    tuned: int = 0          # complete entries stored (their records removed)
    incomplete: int = 0     # entries stored incomplete even on the last attempt (records kept: retried next run)
    already: int = 0        # already had a complete valid entry: nothing tuned, record removed
    failed: list = field(default_factory=list)  # [op, signature, reason]; records kept
    remaining: int = 0      # records of this device still pending at the end (failed, incomplete, not reached)
    other_devices: int = 0  # records of other device names in the store (not tuned here)
    wall_s: float = 0.0
    workers: list = field(default_factory=list)  # per worker: {"worker", "device", "tuned", ..., "exitcode"}

    @property
    def done(self) -> int:
        return self.tuned + self.incomplete + self.already + len(self.failed)

    def add(self, other: "TuneSummary") -> None:
        """Fold a worker's counts into this summary."""
        self.tuned += other.tuned
        self.incomplete += other.incomplete
        self.already += other.already
        self.failed.extend(other.failed)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TuneSummary":
        return cls(**data)

    def __str__(self) -> str:
        lines = [f"{self.device}: {self.tuned} tuned, {self.incomplete} incomplete, {self.already} already tuned, "
                 f"{len(self.failed)} failed, {self.remaining} still recorded ({self.total} pending at the start, "
                 f"{self.wall_s:.1f} s)"]
        if self.other_devices:
            lines.append(f"  {self.other_devices} record(s) of other devices were left alone")
        lines += [f"  failed: {op} {sig}: {why}" for op, sig, why in self.failed]
        return "\n".join(lines)


# -- tuning one signature -------------------------------------------------------------------------
def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def offline_settings(settings: context.TuningSettings | None, store: ResultsStore) -> context.TuningSettings:
    """The caller's settings (budget, numerical check, margin, ...) with tuning on, for ``store``."""
    s = settings or context.current()
    return dataclasses.replace(s, enabled=True, tuning=True, use_stored=True, record_untuned=False,
                               results=store.path)


def warm_candidates(op, params: OpParams) -> list[str]:
    """Run the default and every candidate that supports ``params`` once, outside any budget; the
    names of those that ran without an error.

    Why: a candidate's first run in a process pays its first-use costs (NVRTC cubin load, Triton JIT
    or disk-cache load), which :func:`find_fastest` counts in its budget: right online, where the
    caller's first call pays them anyway, but offline, in fresh worker processes, 1-2 of 40
    signatures on 2 H200s ran out of the 50 ms default that way. Warming is per (candidate, compiled
    specialisation): running on the signature's own params compiles exactly what is then timed.
    Runs go through :func:`make_trial`, as in find_fastest: fresh NaN-filled outputs, copies of the
    inputs written, so ``params``' tensors are never written.

    The default's output is also compared with itself, as find_fastest's numerical check will
    compare every candidate's with it: the check's first run in a process loads torch's kernels for
    it (0.1 s on an H200), which made the first signature of each fresh worker overrun its budget.

    Warming decides nothing: an error is swallowed, and find_fastest runs that candidate again and
    rejects it with its reason (or, for the default, raises it). Out of memory propagates, as there.
    """
    warmed = []
    for c in op.candidates:
        if c is not op.default:
            try:
                if c.supports(params):
                    continue
            except Exception:  # find_fastest reports it as unsupported
                continue
        try:
            result = c.run(make_trial(params))
            if c is op.default:
                for out in output_tensors(result):
                    compare(out, out, op.tolerance(params))
            if params.device.type == "cuda":
                torch.cuda.synchronize(params.device)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception:  # find_fastest meets the same error inside its budget and rejects the candidate
            continue
        warmed.append(c.name)
    return warmed


def tune_params(op, params: OpParams, settings: context.TuningSettings, *, attempts: int = ATTEMPTS) -> Entry:
    """Tune ``params`` as the online path does (never touching them), up to ``attempts`` times until
    an attempt completes within the budget; the entry (not stored). Every candidate first runs once
    (:func:`warm_candidates`), outside the budget and ``tuning_ms``: the budget measures tuning, not
    the first-use compilation a fresh process pays (the online path keeps counting it: there the
    caller pays it anyway)."""
    device = params.device
    with TUNING_LOCK, _on(device):
        warm_candidates(op, params)
        for _ in range(max(1, attempts)):
            report = find_fastest(op, params, settings, clock=op.clock)
            if report.complete:
                break
    return Entry(op=op.name, signature=params.signature(), device=validators.device_name(device),
                 choice=report.choice, complete=report.complete,
                 validators=validators.validators_for(device, op.candidates), candidates=report.candidates,
                 tuned_at=time.time(), tuning_ms=report.tuning_ms)


def entry_problems(op, entry: Entry | None, device) -> list[str]:
    """Why ``entry`` is not a complete, valid result for ``op`` on ``device`` (empty when it is)."""
    if entry is None:
        return ["no entry"]
    problems = validators.mismatches(entry.validators, validators.validators_for(torch.device(device), op.candidates))
    if entry.choice not in {c.name for c in op.candidates}:
        problems.append(f"chosen candidate {entry.choice} no longer exists")
    if not entry.complete:
        problems.append("incomplete")
    return problems


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def process(store: ResultsStore, record: UntunedRecord, device: torch.device, settings, owner: str,
            attempts: int = ATTEMPTS) -> tuple[str, str]:
    """Tune one claimed record; ("tuned" | "incomplete" | "already" | "failed", reason). The entry is
    stored before the record is removed and the claim released."""
    try:
        op = get_op(record.op)
        entry = store.get(record.op, record.signature, record.device)
        if not entry_problems(op, entry, device):
            store.remove_untuned(record.op, record.signature, record.device)
            _claims.release(store, record, owner)
            return "already", ""
        params = rebuild_params(op, record.spec, device)
        if params.signature() != record.signature:
            raise ValueError(f"the rebuilt inputs give signature {params.signature()!r}")
        entry = tune_params(op, params, settings, attempts=attempts)
        store.put(entry)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C, SystemExit: give the item back, then stop
            with contextlib.suppress(Exception):
                _claims.release(store, record, owner)
            raise
        _claims.mark(store, record, owner, "failed", _reason(exc))
        return "failed", _reason(exc)
    if not entry.complete:
        _claims.mark(store, record, owner, "incomplete", "tuning budget exhausted")
        return "incomplete", "tuning budget exhausted on every attempt"
    store.remove_untuned(record.op, record.signature, record.device)
    _claims.release(store, record, owner)
    return "tuned", ""


def work(store: ResultsStore, device: torch.device, settings, *, run: str, owner: str | None = None,
         ops=None, keys=None, lease_s: float = DEFAULT_LEASE_S, attempts: int = ATTEMPTS,
         event: Callable[[str, str], None] | None = None) -> TuneSummary:
    """Claim and tune records of ``device``'s name until none is free (one worker's loop).
    ``event(kind, label)``: "start" before an item, then its outcome."""
    owner = owner or _claims.owner_id()
    summary = TuneSummary(device=validators.device_name(device))
    while True:
        record = _claims.claim_next(store, summary.device, owner=owner, run=run, lease_s=lease_s, ops=ops,
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
    start = time.perf_counter()
    name = validators.device_name(device)
    records, _ = _claims.pending(store, name, ops=ops, keys=keys)
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
    left, others = _claims.pending(store, name, ops=ops, keys=keys)
    summary.total, summary.remaining, summary.other_devices = len(records), len(left), others
    summary.wall_s = time.perf_counter() - start
    if progress is not None:
        progress(summary.done, summary.total, "done")
    forget_ops(r.op for r in records)
    return summary


# -- files of untuned records ---------------------------------------------------------------------
def export_untuned(store, path, *, ops=None, device: str | None = None) -> int:
    """Write untuned records (of these op names / this device name) as JSON lines; return how many."""
    ops = check_ops(ops)
    records = [r for r in as_store(store).untuned()
               if (ops is None or r.op in ops) and (device is None or r.device == device)]
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({"op": r.op, "signature": r.signature, "device": r.device, "spec": r.spec,
                                "first_seen": r.first_seen}, sort_keys=True) + "\n")
    return len(records)


def read_untuned(path) -> list[UntunedRecord]:
    """Records from a file :func:`export_untuned` wrote; ResultsImportError lists every bad line."""
    records, errors = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
                for key in ("op", "signature", "device"):
                    if not isinstance(data.get(key), str) or not data[key]:
                        raise ValueError(f"{key} must be a non-empty string")
                if not isinstance(data.get("spec"), dict):
                    raise ValueError("spec must be an object")
                records.append(UntunedRecord(data["op"], data["signature"], data["device"], data["spec"],
                                             float(data.get("first_seen") or time.time())))
            except (TypeError, ValueError) as exc:
                errors.append((number, str(exc)))
    if errors:
        raise ResultsImportError(path, errors)
    return records


def import_untuned(store, path) -> set[tuple[str, str, str]]:
    """Add a file's records to ``store`` (each once); their (op, signature, device) keys."""
    store = as_store(store)
    records = read_untuned(path)
    for r in records:
        store.record_untuned(r.op, r.signature, r.device, r.spec)
    return {(r.op, r.signature, r.device) for r in records}


def tune_file(path, store=None, **kwargs) -> TuneSummary:
    """Tune the records of an :func:`export_untuned` file into ``store`` (any :func:`tune_recorded`
    keyword too); records the file holds for other device names are left recorded."""
    store = as_store(store)
    return tune_recorded(store, keys=import_untuned(store, path), **kwargs)


# -- progress -------------------------------------------------------------------------------------
def text_progress(stream=None, width: int = 30) -> Progress:
    """A ``progress(done, total, label)`` that draws ``[#####-----] 12/40 label`` on ``stream``
    (stderr): redrawn in place on a terminal, one line per call otherwise."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()

    def progress(done: int, total: int, label: str) -> None:
        filled = width if not total else min(width, width * done // total)
        line = f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total} {label}"
        if tty:
            end = "\n" if label == "done" else ""
            stream.write("\r" + line[:200] + "\x1b[K" + end)
        else:
            stream.write(line + "\n")
        stream.flush()

    return progress

