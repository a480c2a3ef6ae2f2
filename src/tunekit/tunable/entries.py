"""What the results store holds, as values: a tuning result (:class:`Entry`, with a
:class:`CandidateRecord` per candidate) and a signature met untuned (:class:`UntunedRecord`), and
their one row format, shared by the SQLite table and the CSV export (so whatever is stored or
exported can always be read back, and a row that does not check out is refused the same way
everywhere). Nested data is JSON, never pickle: a results file may come from elsewhere and must not
be able to run code. Stdlib only (no torch), so tools can read results cheaply.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import pathlib
from dataclasses import dataclass

from .errors import ResultsImportError

__all__ = ["SCHEMA_VERSION", "APPLICATION_ID", "SCHEMA", "STATUSES", "CSV_COLUMNS", "CandidateRecord", "Entry",
           "UntunedRecord", "default_results_path", "check_entry", "to_row", "from_row", "from_csv", "load_rows",
           "untuned_from_row", "load_untuned", "write_whole", "write_csv", "read_csv", "inspect_schema"]

SCHEMA_VERSION = 1
APPLICATION_ID = 0x544B5231  # "TKR1" in PRAGMA application_id marks the file as ours

#: the SQLite file's tables (the claims of offline tuning may add their own)
KEY_COLUMNS = "op TEXT NOT NULL, signature TEXT NOT NULL, device TEXT NOT NULL"
SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS entries ({KEY_COLUMNS}, choice TEXT NOT NULL, complete INTEGER NOT NULL,"
    " validators TEXT NOT NULL, candidates TEXT NOT NULL, tuned_at REAL NOT NULL,"
    " tuning_ms REAL NOT NULL, PRIMARY KEY (op, signature, device))",
    f"CREATE TABLE IF NOT EXISTS untuned ({KEY_COLUMNS}, spec TEXT NOT NULL, first_seen REAL NOT NULL,"
    " PRIMARY KEY (op, signature, device))",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    f"INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}')",
    f"PRAGMA application_id = {APPLICATION_ID}",  # part of the transaction, like the tables
)
STATUSES = ("chosen", "timed", "slower", "pruned", "unsupported", "numerics", "error", "skipped")
CSV_COLUMNS = ("op", "signature", "device", "choice", "complete", "tuned_at", "tuning_ms",
               "validators", "candidates")


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
    damaged: str = ""             # why the stored row cannot be used ("" for a sound record)


def default_results_path() -> pathlib.Path:
    """$TUNEKIT_RESULTS, else $XDG_CACHE_HOME/tunekit/results.sqlite, else ~/.cache/tunekit/...
    (results are a cache of measurements, so by default they live in the user's cache dir)."""
    explicit = os.environ.get("TUNEKIT_RESULTS")
    if explicit and explicit.strip():  # empty: the default, as the settings read it
        return pathlib.Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(cache).expanduser() if cache else pathlib.Path.home() / ".cache"
    return base / "tunekit" / "results.sqlite"


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _require(ok, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_entry(e: Entry) -> None:
    """Raise ValueError unless the entry is storable.  put(), import_csv() and reading the
    file share these rules, so whatever is stored or exported can always be read back."""
    for name in ("op", "signature", "device", "choice"):
        value = getattr(e, name)
        _require(isinstance(value, str) and value, f"{name} must be a non-empty string, got {value!r}")
    _require(isinstance(e.complete, bool), f"complete must be a bool, got {e.complete!r}")
    for name in ("tuned_at", "tuning_ms"):
        value = getattr(e, name)
        _require(_is_number(value), f"{name} must be a finite number, got {value!r}")
    _require(isinstance(e.validators, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in e.validators.items()),
             "validators must be an object of string -> string")
    _require(isinstance(e.candidates, dict), "candidates must map names to CandidateRecord")
    for name, rec in e.candidates.items():
        problem = _record_problem(name, rec)
        if problem:  # the message only for a bad record: formatting one per record was a third of a row's read
            raise ValueError(problem)
    _require(e.choice in e.candidates, f"choice {e.choice!r} is not one of the candidates")


def _record_problem(name, rec) -> str | None:
    """What is wrong with one (name, CandidateRecord) of an entry, or None."""
    if not (isinstance(name, str) and isinstance(rec, CandidateRecord)):
        return f"candidate {name!r} must map a string to a CandidateRecord"
    if rec.status not in STATUSES:
        return f"candidate {name!r} has unknown status {rec.status!r}"
    if not (rec.time_ms is None or _is_number(rec.time_ms)):
        return f"candidate {name!r} time_ms must be a finite number or null, got {rec.time_ms!r}"
    if not (rec.reason is None or isinstance(rec.reason, str)):
        return f"candidate {name!r} reason must be a string or null"
    return None


def to_row(e: Entry) -> tuple:
    """Entry -> values in CSV_COLUMNS order (the database row and the CSV row alike)."""
    candidates = {name: {"status": r.status, "time_ms": r.time_ms, "reason": r.reason}
                  for name, r in e.candidates.items()}
    return (e.op, e.signature, e.device, e.choice, int(e.complete), float(e.tuned_at),
            float(e.tuning_ms), json.dumps(e.validators), json.dumps(candidates))


def _parse(parse, text, what: str):
    """parse(text), failing with a ValueError that names the column."""
    try:
        return parse(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} cannot be parsed: {e}") from None


def from_row(op, signature, device, choice, complete: bool, tuned_at, tuning_ms,
              validators: str, candidates: str) -> Entry:
    """Values in CSV_COLUMNS order -> checked Entry; ValueError says what is wrong."""
    tuned_at, tuning_ms = _parse(float, tuned_at, "tuned_at"), _parse(float, tuning_ms, "tuning_ms")
    data = _parse(json.loads, candidates, "candidates")
    _require(isinstance(data, dict), "candidates must be a JSON object")
    try:
        records = {name: CandidateRecord(**rec) for name, rec in data.items()}
    except TypeError:
        raise ValueError("each candidate must be an object with status, time_ms, reason") from None
    entry = Entry(op, signature, device, choice, complete, _parse(json.loads, validators, "validators"),
                  records, tuned_at, tuning_ms)
    check_entry(entry)
    return entry


def from_csv(row: dict) -> Entry:
    """One csv.DictReader row -> checked Entry; ValueError says what is wrong."""
    _require(None not in row, f"has more fields than the {len(CSV_COLUMNS)} columns")
    empty = [c for c in CSV_COLUMNS if not (row.get(c) or "").strip()]
    _require(not empty, f"missing or empty column(s): {', '.join(empty)}")
    values = [row[c] for c in CSV_COLUMNS]
    complete = values[4].strip().lower()
    _require(complete in ("0", "1", "true", "false"), f"complete must be 0/1/true/false, got {values[4]!r}")
    values[4] = complete in ("1", "true")
    return from_row(*values)


def load_rows(rows) -> list[Entry]:
    """Database rows -> entries.  A row that does not parse (edited or damaged by hand) is
    treated as absent, so it gets retuned and overwritten instead of crashing the caller."""
    entries = []
    for row in rows:
        with contextlib.suppress(TypeError, ValueError):
            entries.append(from_row(*row[:4], bool(row[4]), *row[5:]))
    return entries


def untuned_from_row(op, signature, device, spec, first_seen) -> UntunedRecord:
    """A row of the untuned table -> UntunedRecord; ValueError names what is damaged (a spec that is
    not a JSON object, a first_seen that is not a finite number)."""
    for name, value in (("op", op), ("signature", signature), ("device", device)):
        _require(isinstance(value, str) and value, f"{name} must be a non-empty string, got {value!r}")
    data = _parse(json.loads, spec, "spec")
    _require(isinstance(data, dict), "spec must be a JSON object")
    seen = _parse(float, first_seen, "first_seen")
    _require(math.isfinite(seen), f"first_seen must be a finite number, got {first_seen!r}")
    return UntunedRecord(op, signature, device, data, seen)


def write_whole(path, write) -> None:
    """``write(f)`` to a text file that appears at ``path`` whole or not at all: written beside it and
    renamed over it, so a failure (a full disk) leaves what was there. OSError names ``path``."""
    path = pathlib.Path(path)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(staging, "w", newline="", encoding="utf-8") as f:
            write(f)
        os.replace(staging, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        if isinstance(e, OSError) and e.errno is not None:  # name the file asked for, not the staging one
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def write_csv(path, entries) -> int:
    """Write entries as CSV (header CSV_COLUMNS, floats exact), whole or not at all; rows written."""
    rows = []

    def write(f):
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        rows.extend(to_row(e) for e in entries)
        writer.writerows(rows)
    write_whole(path, write)
    return len(rows)


def read_csv(path) -> list[tuple]:
    """Rows (in CSV_COLUMNS order, checked) of a CSV file like write_csv writes. All or nothing:
    if any row is bad, ResultsImportError lists every one as (line number, reason), the header
    being line 1. OSError when the file cannot be read."""
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
    return rows


def load_untuned(rows) -> tuple[list[UntunedRecord], str]:
    """Rows of the untuned table -> (records, "" or what the damaged rows left out are and why)."""
    records, damaged = [], []
    for row in rows:
        try:
            records.append(untuned_from_row(*row))
        except ValueError as e:
            damaged.append(f"{row[0]} {row[1]} [{row[2]}]: {e}")
    if not damaged:
        return records, ""
    more = "; ..." if len(damaged) > 3 else ""
    return records, f"{len(damaged)} damaged untuned record(s) left out ({'; '.join(damaged[:3])}{more})"


def inspect_schema(conn) -> str:
    """"new" for an empty SQLite database, "ours" for a tunekit store; ValueError says what else it
    is. Call in a transaction: between two autocommit reads another process could create the
    schema, and we would see its tables without its application_id."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id == 0 and not tables:
        return "new"
    _require(app_id == APPLICATION_ID, f"is an SQLite database of another application (application_id {app_id:#x})")
    missing = sorted({"entries", "untuned", "meta"} - tables)
    _require(not missing, f"is missing table(s) {', '.join(missing)}")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = str(row[0]) if row else ""
    _require(version.isdigit() and int(version) >= 1, f"has an invalid schema_version {version!r}")
    _require(int(version) <= SCHEMA_VERSION, f"was written by a newer tunekit (schema version {version}, "
                                             f"this one reads {SCHEMA_VERSION})")
    return "ours"
