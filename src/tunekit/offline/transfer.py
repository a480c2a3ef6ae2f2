"""Shipping tuning results between machines: export a store's entries, import those valid here (and
:func:`describe`: a store's entries for review).

Why: tuning a model's signatures once on one machine serves every machine of the same GPU model
running the same software. But an entry is only right where its validators hold (device name and
compute capability, CUDA runtime and driver, torch / triton / tunekit versions, the source hash of
every candidate of its op). The runtime would ignore and re-tune an entry that does not match, so
importing one gains nothing, and it could replace a good local entry. :func:`import_results`
therefore checks every entry of the file against this machine: entries whose device is here and
whose validators all match are written; the others are reported with the reason, and left out.

Workflow (GPU model "NVIDIA H200", same software on both machines):

1. On the machine that ran the workload: ``TUNEKIT_RECORD_UNTUNED=1`` (or ``tuning(record_untuned=True)``),
   then ``tunekit tune`` (all local GPUs: ``--gpus all``), or tune online as usual.
2. ``tunekit results export results.csv`` (this module: :func:`export_results`, optionally only some
   ops or one device name, or only entries valid here).
3. On each target machine: ``tunekit results import results.csv`` (:func:`import_results`): it says
   how many entries were imported and lists each rejected one with its reason (another GPU model,
   another torch, a changed candidate, ...).

The file format is the store's CSV (``ResultsStore.export_csv``): JSON inside cells, never pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from .recorded import as_store, check_ops, forget_ops
from .tune_one import entry_problems
from ..tunable import validators
from ..tunable.entries import Entry
from ..tunable.registry import get_op
from ..tunable.results import ResultsStore

__all__ = ["ImportReport", "export_results", "import_results", "local_devices", "entry_problem", "describe",
           "entry_json"]


@dataclass
class ImportReport:
    path: str
    imported: list = field(default_factory=list)  # [op, signature, device]
    rejected: list = field(default_factory=list)  # [op, signature, device, reason]
    kept: list = field(default_factory=list)      # [op, signature, device]: a complete local entry kept

    def __str__(self) -> str:
        lines = [f"{self.path}: {len(self.imported)} entr{'y' if len(self.imported) == 1 else 'ies'} imported, "
                 f"{len(self.rejected)} rejected, {len(self.kept)} kept from the local store"]
        lines += [f"  rejected {op} {sig} [{dev}]: {why}" for op, sig, dev, why in self.rejected]
        lines += [f"  kept local complete entry over an incomplete one: {op} {sig} [{dev}]"
                  for op, sig, dev in self.kept]
        return "\n".join(lines)


def local_devices() -> dict[str, torch.device]:
    """Device name -> a device of this machine with that name (the CPU, every visible GPU)."""
    devices = {validators.device_name(torch.device("cpu")): torch.device("cpu")}
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        device = torch.device("cuda", index)
        devices.setdefault(validators.device_name(device), device)
    return devices


def entry_problem(entry: Entry, devices: dict[str, torch.device] | None = None) -> str:
    """Why ``entry`` is not valid on this machine ("" when it is): unknown op, no such device here,
    validators that differ, a chosen candidate that no longer exists."""
    devices = local_devices() if devices is None else devices
    try:
        op = get_op(entry.op)
    except KeyError:
        return f"unknown op {entry.op!r}"
    device = devices.get(entry.device)
    if device is None:
        return f"no device named {entry.device!r} here (this machine has: {', '.join(sorted(devices))})"
    problems = [p for p in entry_problems(op, entry, device) if p != "incomplete"]
    return "; ".join(problems)


def export_results(store, path, *, ops=None, device: str | None = None, valid_only: bool = False) -> int:
    """Write entries (of these op names, of this device name, only those valid here) as CSV; how many."""
    ops = check_ops(ops)
    devices = local_devices() if valid_only else None
    chosen = [e for e in as_store(store).entries()
              if (ops is None or e.op in ops) and (device is None or e.device == device)
              and not (valid_only and entry_problem(e, devices))]
    staging = ResultsStore(":memory:")  # reuse the store's CSV writer on just these entries
    try:
        for e in chosen:
            staging.put(e)
        return staging.export_csv(path)
    finally:
        staging.close()


def import_results(store, path, *, check: bool = True) -> ImportReport:
    """Import a CSV of entries into ``store``: those valid on this machine (``check=False``: all).

    A malformed file raises ``ResultsImportError`` (every bad row listed) and imports nothing. An
    incomplete imported entry does not replace a complete local one that is valid here. A store that
    cannot save the entries (read-only, or its file unusable) raises ``ResultsStoreError``, before
    anything is written or, if its file fails on the way, after: never a report of entries not saved.
    """
    store = as_store(store)
    store.require_writable("import results")
    staging = ResultsStore(":memory:")
    try:
        staging.import_csv(path)
        incoming = staging.entries()
    finally:
        staging.close()
    report, devices = ImportReport(str(path)), local_devices()
    for e in incoming:
        key = [e.op, e.signature, e.device]
        why = entry_problem(e, devices) if check else ""
        if why:
            report.rejected.append(key + [why])
            continue
        local = store.get(e.op, e.signature, e.device)
        if local is not None and local.complete and not e.complete and not entry_problem(local, devices):
            report.kept.append(key)
            continue
        store.put(e)
        if e.complete:
            store.remove_untuned(e.op, e.signature, e.device)
        report.imported.append(key)
    store.require_writable("import results")
    forget_ops(op for op, _, _ in report.imported)
    return report


def entry_json(e: Entry) -> dict:
    """An entry as plain JSON values."""
    return {"op": e.op, "signature": e.signature, "device": e.device, "choice": e.choice, "complete": e.complete,
            "tuned_at": e.tuned_at, "tuning_ms": e.tuning_ms, "validators": e.validators,
            "candidates": {k: vars(v) for k, v in e.candidates.items()}}


def describe(store: ResultsStore, op: str | None = None, *, as_json: bool = False) -> str:
    """The store's entries (of ``op``) for review (``tunekit results show``): a line per entry and per
    recorded untuned signature, or the entries as a JSON list."""
    entries = store.entries(op)
    if as_json:
        return json.dumps([entry_json(e) for e in entries], indent=2)
    note = f" (read-only: {store.read_only})" if store.read_only else ""
    lines = [f"{store.path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}{note}"]
    for e in entries:
        flag = "" if e.complete else "  (incomplete)"
        t = e.candidates.get(e.choice)
        ms = f"{t.time_ms * 1e3:.2f} us" if t is not None and t.time_ms is not None else ""
        lines.append(f"  {e.op:<10} {e.signature:<48} {e.device:<28} -> {e.choice} {ms}{flag}")
    untuned = store.untuned(op)
    if untuned:
        lines.append(f"{len(untuned)} signature(s) recorded untuned")
        lines += [f"  {u.op:<10} {u.signature:<48} {u.device}" for u in untuned]
    return "\n".join(lines)
