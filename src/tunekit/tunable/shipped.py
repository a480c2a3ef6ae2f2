"""Pre-tuned results shipped with the package: the tuned choice from a process's first call.

Online tuning cannot give a short program its tuned speed: a 200 ms budget is 20% of a program
that calls a 20 us op 10,000 times, and a GEMM's candidates take seconds to compile. So tunekit
ships, per GPU model, the entries that offline tuning (``benchmarks/pretune.py``: the benchmark
suites' signatures and the model step's GEMMs) chose on that GPU, as FlagGems ships tuned configs
per GPU. A signature with no valid entry in the user's results store uses a shipped entry when it
is valid here; the user's own entries (``tunekit tune``, online tuning) always come first.

Valid here means: the same GPU model (name and compute capability), CUDA driver and runtime
versions, torch and Triton versions up to the minor release (the default candidate is torch's own
kernel, and Triton compiles the Triton candidates), and exactly the same candidates (each one's
source hash). tunekit's own version is left out: the candidates' hashes say what changed. The files
are the results store's CSV export (``tunekit results export``), one per GPU model, in
``tunekit/pretuned/``; ``TUNEKIT_USE_SHIPPED=0`` (or ``tuning(use_shipped=False)``) ignores them.

A shipped choice that must be compiled first (a candidate with ``prepare``: NVRTC, Triton) is
prepared on a worker thread (:func:`start_preparing`): the first call waits for it at most the
tuning budget (``max_tuning_ms``: what a first call may spend on tuning; a warm compile cache or a
short compile fits), later calls not at all, and the default runs until it is ready, so no call
waits seconds for a compiler.
"""

from __future__ import annotations

import concurrent.futures
import functools
import pathlib
import re
import threading

from .entries import Entry, load_rows, read_csv
from .session import preparer

__all__ = ["SHIPPED_DIR", "file_for", "shipped_entry", "problems", "entries_for", "start_preparing",
           "preparation_problem", "PENDING"]

SHIPPED_DIR = pathlib.Path(__file__).resolve().parents[1] / "pretuned"
#: environment facts that must be equal; those in _MINOR only up to the minor version
_EXACT = ("device", "compute_capability", "cuda_driver")
_MINOR = ("cuda_runtime", "torch", "triton")
_lock = threading.Lock()


def file_for(device_name: str, directory: pathlib.Path | None = None) -> pathlib.Path:
    """The shipped file of a GPU model: ``NVIDIA H200`` -> ``NVIDIA_H200.csv`` (in ``SHIPPED_DIR``)."""
    return (SHIPPED_DIR if directory is None else directory) / (re.sub(r"[^A-Za-z0-9.-]+", "_", device_name).strip("_") + ".csv")


def _minor(version: str | None) -> str | None:
    return None if version is None else ".".join(re.split(r"[.+]", version)[:2])


def problems(shipped: dict[str, str], current: dict[str, str]) -> list[str]:
    """Why a shipped entry's validators do not hold here (empty when they do)."""
    out = [f"{k} {shipped.get(k)} -> {current.get(k)}" for k in _EXACT if shipped.get(k) != current.get(k)]
    out += [f"{k} {shipped.get(k)} -> {current.get(k)}" for k in _MINOR
            if _minor(shipped.get(k)) != _minor(current.get(k))]
    candidates = {k for k in set(shipped) | set(current) if k.startswith("candidate:")}
    out += [f"{k} differs" for k in sorted(candidates) if shipped.get(k) != current.get(k)]
    return out


@functools.lru_cache(maxsize=None)
def entries_for(path: pathlib.Path) -> dict[tuple[str, str], Entry]:
    """The entries of one shipped file by (op, signature); empty when there is none. A damaged file
    raises (ResultsImportError names its lines): it is part of the package, never edited by users."""
    if not path.is_file():
        return {}
    return {(e.op, e.signature): e for e in load_rows(read_csv(path)) if e.complete}


def shipped_entry(op: str, signature: str, device_name: str, current: dict[str, str],
                  directory: pathlib.Path | None = None) -> Entry | None:
    """The shipped entry for (op, signature) on this GPU model when it is valid here, else None."""
    with _lock:  # the first lookup reads the file; threads may meet their first signatures at once
        table = entries_for(file_for(device_name, directory))
    entry = table.get((op, signature))
    if entry is None or entry.device != device_name or problems(entry.validators, current):
        return None
    return entry


#: what :func:`preparation_problem` says while the preparation still runs
PENDING = "its preparation (compile) is under way"


def start_preparing(candidate, params) -> concurrent.futures.Future:
    """``candidate.prepare(params)`` on a preparation worker (done at once when it has none)."""
    prepare = getattr(candidate, "prepare", None)
    if prepare is None:
        done = concurrent.futures.Future()
        done.set_result(None)
        return done
    return preparer().submit(prepare, params)


def preparation_problem(future: concurrent.futures.Future, wait_ms: float) -> str | None:
    """None once ``future`` finished well (waiting at most ``wait_ms``), :data:`PENDING` while it
    runs, else why it failed."""
    try:
        future.result(timeout=None if wait_ms == float("inf") else max(0.0, wait_ms) / 1e3)
    except concurrent.futures.TimeoutError:
        return PENDING
    except Exception as exc:  # a compile error: the caller falls back to the default
        return f"{type(exc).__name__}: {exc}"
    return None
