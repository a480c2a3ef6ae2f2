"""What an offline tuning run reports: a :class:`TuneSummary` per device name, and a text progress bar."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["TuneSummary", "Progress", "text_progress"]

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
    def worker_errors(self) -> list[str]:
        """One line per worker process that failed (its exception's last line)."""
        return [f"worker {w.get('worker')} [{w.get('device')}]: {(w['error'].strip().splitlines() or ['?'])[-1]}"
                for w in self.workers if w.get("error")]

    @property
    def ok(self) -> bool:
        """Nothing failed: no signature, no worker."""
        return not self.failed and not self.worker_errors

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
        lines += [f"  failed: {line}" for line in self.worker_errors]
        return "\n".join(lines)


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
