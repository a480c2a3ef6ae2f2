"""Files of untuned records: :func:`export_untuned` writes a store's records as JSON lines (one object
per line: op, signature, device, spec, first_seen) and :func:`tune_file` tunes the records of such a
file (e.g. recorded on a production machine, tuned on an idle one of the same GPU model)."""

from __future__ import annotations

import json
import time

from .recorded import as_store, check_ops, tune_recorded
from .summary import TuneSummary
from ..tunable.errors import ResultsImportError
from ..tunable.entries import UntunedRecord, write_whole

__all__ = ["export_untuned", "read_untuned", "import_untuned", "tune_file"]


def export_untuned(store, path, *, ops=None, device: str | None = None) -> int:
    """Write untuned records (of these op names / this device name) as JSON lines, the file whole or not at
    all; return how many."""
    ops = check_ops(ops)
    records = [r for r in as_store(store).untuned()
               if (ops is None or r.op in ops) and (device is None or r.device == device)]
    write_whole(path, lambda f: f.writelines(
        json.dumps({"op": r.op, "signature": r.signature, "device": r.device, "spec": r.spec,
                    "first_seen": r.first_seen}, sort_keys=True) + "\n" for r in records))
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
