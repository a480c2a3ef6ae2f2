"""Pre-tuned results shipped with the package: the tuned choice from a process's first call.

Online tuning cannot give a short program its tuned speed: a 200 ms budget is 20% of a program
that calls a 20 us op 10,000 times, and a GEMM's candidates take seconds to compile. So tunekit
ships, per GPU model, the entries that offline tuning (``benchmarks/pretune.py``: the first-use and
GEMM suites' signatures; not the model step's GEMMs, which tune online) chose on that GPU, as FlagGems
ships tuned configs per GPU. A signature with no valid entry in the user's results store uses a shipped entry when it
is valid here; the user's own entries (``tunekit tune``, online tuning) always come first.

Valid here means: the same GPU model (name and compute capability), CUDA driver and runtime
versions, torch and Triton versions up to the minor release (the default candidate is torch's own
kernel, and Triton compiles the Triton candidates), and the same candidates (each one's source hash)
as the entry chose among. A candidate added since does not void it: the entry's choice is still the
best of what it measured, the newcomer is measured at the next pretune (a changed or removed one does). tunekit's
own version is left out: the candidates' hashes say what changed. The files are the results store's CSV export
(``tunekit results export``), one per GPU model, in ``tunekit/pretuned/``; ``TUNEKIT_USE_SHIPPED=0`` (or
``tuning(use_shipped=False)``) ignores them.

A shipped choice that must be built first (a candidate with ``prepare``: NVRTC, Triton) is prepared
on a worker thread (:class:`Preparation`), from the builds shipped beside the file when they match
(``backends/shipped_kernels.py``: milliseconds), else by compiling. The first call waits for it at
most the tuning budget (``max_tuning_ms``), later calls not at all; until it is ready a stand-in runs
(:func:`stand_in`: the fastest other candidate the entry timed, when it beat the default), else the
default, so no call waits seconds for a compiler and few run torch's slower kernel. A choice that
cannot be prepared here (an optional backend such as quack-kernels not installed, a compile error)
leaves the stand-in for good.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import csv
import functools
import io
import pathlib
import re
import threading
import time

from .entries import Entry, from_csv, load_rows, read_csv
from .errors import ResultsImportError
from .preparations import builds_only, preparer

__all__ = ["SHIPPED_DIR", "file_for", "shipped_entry", "problems", "entries_for", "forget_files", "start_preparing",
           "preparation_problem", "PENDING", "FALLING_BACK", "UNDER_WAY", "Preparation", "stand_in", "uses_triton",
           "STAND_IN_AFTER_MS", "KEPT_WAIT_MS"]

SHIPPED_DIR = pathlib.Path(__file__).resolve().parents[1] / "pretuned"
#: environment facts that must be equal; those in _MINOR only up to the minor version
_EXACT = ("device", "compute_capability", "cuda_driver")
_MINOR = ("cuda_runtime", "torch", "triton")
_lock = threading.Lock()


def file_for(device_name: str, directory: pathlib.Path | None = None) -> pathlib.Path:
    """The shipped file of a GPU model: ``NVIDIA H200`` -> ``NVIDIA_H200.csv`` (in ``SHIPPED_DIR``)."""
    stem = re.sub(r"[^A-Za-z0-9.-]+", "_", device_name).strip("_")
    return (SHIPPED_DIR if directory is None else directory) / (stem + ".csv")


def _minor(version: str | None) -> str | None:
    return None if version is None else ".".join(re.split(r"[.+]", version)[:2])


def problems(shipped: dict[str, str], current: dict[str, str]) -> list[str]:
    """Why a shipped entry's validators do not hold here (empty when they do)."""
    out = [f"{k} {shipped.get(k)} -> {current.get(k)}" for k in _EXACT if shipped.get(k) != current.get(k)]
    out += [f"{k} {shipped.get(k)} -> {current.get(k)}" for k in _MINOR
            if _minor(shipped.get(k)) != _minor(current.get(k))]
    candidates = {k for k in shipped if k.startswith("candidate:")}  # one added since: not measured, not wrong
    out += [f"{k} differs" for k in sorted(candidates) if shipped.get(k) != current.get(k)]
    return out


@functools.lru_cache(maxsize=None)
def entries_for(path: pathlib.Path) -> dict[tuple[str, str], Entry]:
    """The entries of one shipped file by (op, signature); empty when there is none. A damaged file
    raises (ResultsImportError names its lines): it is part of the package, never edited by users.
    Reads every row (tests, pretune); a process's lookups read one row each (:func:`shipped_entry`)."""
    if not path.is_file():
        return {}
    return {(e.op, e.signature): e for e in load_rows(read_csv(path)) if e.complete}


@functools.lru_cache(maxsize=None)
def _data(path: pathlib.Path) -> bytes:
    return path.read_bytes() if path.is_file() else b""


def _row_start(op: str, signature: str) -> bytes:
    """How a row of (op, signature) begins in a file ``write_csv`` wrote (its quoting included)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([op, signature])
    return ("\n" + buf.getvalue()[:-1] + ",").encode()


@functools.lru_cache(maxsize=None)
def _lookup(path: pathlib.Path, op: str, signature: str) -> Entry | None:
    """The complete entry of (op, signature) in the shipped file ``path``, parsing that row alone:
    parsing a whole file of 100 entries took 87 ms of a process's first call (H100), its row
    takes well under one. A damaged row raises ResultsImportError (the file is part of the package)."""
    data = _data(path)
    at = data.find(_row_start(op, signature))
    if at < 0:
        return None
    end = data.find(b"\n", at + 1)
    line = data[at + 1:] if end < 0 else data[at + 1:end]
    header = data[:data.find(b"\n")]
    try:
        row = next(csv.DictReader([header.decode().rstrip("\r"), line.decode().rstrip("\r")]))
        entry = from_csv(row)
    except (ValueError, csv.Error) as exc:  # UnicodeDecodeError is a ValueError
        raise ResultsImportError(path, [(data.count(b"\n", 0, at) + 2, str(exc))]) from None
    return entry if entry.complete else None


def shipped_entry(op: str, signature: str, device_name: str, current: dict[str, str],
                  directory: pathlib.Path | None = None) -> Entry | None:
    """The shipped entry for (op, signature) on this GPU model when it is valid here, else None."""
    with _lock:  # threads may meet their first signatures at once
        entry = _lookup(file_for(device_name, directory), op, signature)
    if entry is None or entry.device != device_name or problems(entry.validators, current):
        return None
    if f"candidate:{entry.choice}" not in entry.validators:  # what it chose must be one it names (and so checks)
        return None
    return entry


def forget_files() -> None:
    """Drop what was read of the shipped files (tests write their own)."""
    entries_for.cache_clear()
    _data.cache_clear()
    _lookup.cache_clear()


#: what :func:`preparation_problem` says while the preparation still runs
PENDING = "its preparation (compile) is under way"
#: what :meth:`Preparation.wait` says when the choice failed and its stand-in still prepares
FALLING_BACK = "it could not be prepared, and the timed next fastest is preparing"
#: the problems that leave the signature undecided (the default runs this call)
UNDER_WAY = (PENDING, FALLING_BACK)


_stand_in_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _stand_in_worker() -> concurrent.futures.ThreadPoolExecutor:
    """A worker of its own for stand-ins: on a 2-core machine the preparation pool has one worker,
    and a stand-in queued behind the compile it stands in for would never stand in."""
    global _stand_in_pool
    with _lock:
        if _stand_in_pool is None:
            _stand_in_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tunekit-stand-in")
        return _stand_in_pool


def start_preparing(candidate, params, *, kept_only: bool = False) -> concurrent.futures.Future:
    """``candidate.prepare(params)`` on a preparation worker, in the caller's context (its
    ``tuning()`` settings: whether shipped builds may be used); done at once when there is nothing
    to do. ``kept_only``: loading kept builds only, NeedsCompiler failing the Future where one would
    have to be compiled (:func:`~tunekit.tunable.preparations.builds_only`)."""
    if getattr(candidate, "prepare", None) is None:
        done = concurrent.futures.Future()
        done.set_result(None)
        return done
    return preparer().submit(contextvars.copy_context().run, _prepare, candidate, params, False, kept_only)


def _prepare(candidate, params, check_support: bool, kept_only: bool) -> None:
    """Prepare ``candidate`` here; ``check_support`` (a stand-in): first ``candidate.supports(params)``, a
    refusal raising."""
    why = candidate.supports(params) if check_support and hasattr(candidate, "supports") else None
    if why is not None:
        raise RuntimeError(f"{candidate.name} does not support these inputs: {why}")
    prepare = getattr(candidate, "prepare", None)
    if prepare is not None:
        with builds_only() if kept_only else contextlib.nullcontext():
            prepare(params)


#: how long a first call waits for the shipped choice before it prepares a stand-in: a shipped cubin
#: loads in 2-5 ms on a worker (H100); a Triton kernel waited 0.3 s for the process's Triton import
STAND_IN_AFTER_MS = 5.0


def stand_in(entry: Entry, by_name: dict, default, margin: float) -> list:
    """What may run while the shipped choice prepares, fastest first: the other candidates the entry
    timed that beat the default by the margin (empty when none does). The first that supports the
    call's params and prepares runs (:meth:`Preparation._first_runnable`, on the stand-ins' worker: a
    CUDA C candidate's answer may load cuda-bindings, 0.1 s, where NVRTC is not a pip wheel), so a
    refusal (another candidate of a backend missing here) gives way to the next."""
    default_rec = entry.candidates.get(default.name)
    default_ms = default_rec.time_ms if default_rec is not None else None
    timed = sorted((r.time_ms, name) for name, r in entry.candidates.items()
                   if r.time_ms is not None and name != entry.choice and name in by_name)
    out = []
    for time_ms, name in timed:
        c = by_name[name]
        if c is default or (default_ms is not None and time_ms * (1 + margin) >= default_ms):
            break
        out.append(c)
    return out


#: how long a first call waits for a Triton choice's kept builds to load (2-5 ms per cubin, H100)
KEPT_WAIT_MS = 20.0

#: whether a Triton choice was prepared in this process: the first pays Triton's import and its
#: runtime's start (0.2-0.4 s of the interpreter on the H100, while torch.compile's import of Triton
#: leaves most of it), later ones milliseconds
_triton_prepared = False


def _note_triton_prepared(future: concurrent.futures.Future) -> None:
    global _triton_prepared
    if future.exception() is None:
        _triton_prepared = True


def uses_triton(candidate) -> bool:
    """Whether ``candidate`` runs Triton kernels: tunekit's Triton candidates are classes of its
    ``triton_*`` modules (``tests/tunable/test_shipped_preparation.py`` holds every registered candidate to it)."""
    return type(candidate).__module__.rsplit(".", 1)[-1].startswith("triton_")


class Preparation:
    """A shipped choice preparing on a worker, and what runs until it is ready: a stand-in (the
    fastest other candidate the entry timed, :func:`stand_in`), else the default. The stand-in is
    prepared when the choice is not ready within :data:`STAND_IN_AFTER_MS`.

    The process's first Triton choice is first prepared from kept builds only (``kept_only``: the
    cubins Triton built, shipped or kept by an earlier process, launched without Triton,
    ``backends/triton_static.py``): ready in milliseconds, and the first call waits for it up to
    :data:`KEPT_WAIT_MS`. Where a build would have to be compiled, that attempt fails at once,
    and then the stand-in is prepared before the choice: Triton's start would otherwise hold the
    interpreter while the stand-in loads (a stand-in ready after 0.19 s instead of milliseconds,
    H100). Such a choice takes 0.4-1.8 s to prepare (Triton's import and start; with empty caches
    its gcc builds): the first call waits for nothing, the default running it until the stand-in
    is ready (18 ms after the first call on the H100, its cubins shipped)."""

    def __init__(self, resolution, params, pick_stand_in):
        self.resolution, self.params, self._pick = resolution, params, pick_stand_in
        self.stand_in, self._stand_in_future, self._kept = None, None, None
        self._stand_in_final = False  # whether the stand-in attempt may compile (the choice failed)
        self._slow = uses_triton(resolution.candidate) and not _triton_prepared
        self._context = contextvars.copy_context()  # the caller's settings, for what a worker starts later
        if self._slow:
            self.future = concurrent.futures.Future()
            try:
                self._kept = start_preparing(resolution.candidate, params, kept_only=True)
            except Exception as exc:  # noqa: BLE001 - e.g. the worker pool shut down at exit
                self._kept = concurrent.futures.Future()
                self._kept.set_exception(exc)
            self._kept.add_done_callback(self._after_kept)
        else:
            self.future = start_preparing(resolution.candidate, params)
            if uses_triton(resolution.candidate):
                self.future.add_done_callback(_note_triton_prepared)

    def _after_kept(self, done: concurrent.futures.Future) -> None:
        """The kept-builds attempt ended: the choice is ready, or (it needs compiling) the stand-in,
        then the choice, are prepared, under the settings of the call that made this Preparation."""
        if not done.cancelled() and done.exception() is None:
            self.future.set_result(None)
            return
        self._context.copy().run(self._stand_in_then_choice)

    def _stand_in_then_choice(self) -> None:
        self._start_stand_in_safely()  # not started (the pool shut down at exit): the choice still prepares
        if self._stand_in_future is None:
            self._start_choice()
        else:  # the stand-in's worker runs the callback: the caller's settings again
            self._stand_in_future.add_done_callback(lambda _: self._context.copy().run(self._start_choice))

    def _start_choice(self) -> None:
        """The choice's full preparation (compilers allowed), once the stand-in's is done; its
        outcome becomes ``future``'s (a preparation that cannot even start fails it: never a Future
        left pending)."""
        def copy(done):
            _note_triton_prepared(done)
            if done.exception() is not None:
                self.future.set_exception(done.exception())
            else:
                self.future.set_result(done.result())
        try:
            start_preparing(self.resolution.candidate, self.params).add_done_callback(copy)
        except Exception as exc:  # noqa: BLE001 - e.g. the worker pool shut down at exit
            self.future.set_exception(exc)

    def _start_stand_in(self, final: bool = False) -> None:
        """Prepare the stand-in, from kept builds only unless ``final``: a stand-in runs while the choice
        loads (a cubin, milliseconds), and compiling one holds the interpreter longer than that load
        takes (Triton's start, 0.2-0.4 s: a first call of 283 ms, H100; an NVRTC compile of a CUDA C
        stand-in the bundle lacks: 403 ms, H200)."""
        options = self._pick()
        if options:
            self._stand_in_final = final
            self._stand_in_future = _stand_in_worker().submit(contextvars.copy_context().run, self._first_runnable,
                                                              options, final)

    def _first_runnable(self, options, final: bool = False) -> None:
        """Prepare the first of ``options`` that supports the params; it becomes ``stand_in``. It loads kept
        builds only (a cubin cached or shipped), unless ``final`` (the choice failed: the stand-in runs for
        good, so it may compile); one whose build is slow (``slow_build``: seconds on the one stand-in
        worker) always loads kept builds only. All refused: this fails."""
        problems = []
        for c in options:
            kept_only = not final or getattr(c, "slow_build", False)
            try:
                _prepare(c, self.params, True, kept_only)
            except Exception as exc:  # noqa: BLE001 - refused or failed: the next one
                problems.append(f"{c.name}: {exc}")
                continue
            self.stand_in = c
            return
        raise RuntimeError("; ".join(problems))

    def wait(self, wait_ms: float) -> tuple[str | None, object | None]:
        """(None, None) once the choice is ready, else (why not, the candidate to run meanwhile or
        None for the default), waiting at most ``wait_ms`` for the choice or a ready stand-in."""
        if self._slow:
            if wait_ms != float("inf"):  # the kept builds' load, never a compile (see the class)
                concurrent.futures.wait([self._kept], timeout=min(wait_ms, KEPT_WAIT_MS) / 1e3)
                if self._kept.done() and not self._kept.cancelled() and self._kept.exception() is None:
                    return None, None
                wait_ms = 0.0
            return self._instead(preparation_problem(self.future, wait_ms), wait_ms)
        if wait_ms == float("inf") or wait_ms <= STAND_IN_AFTER_MS:
            return self._instead(preparation_problem(self.future, wait_ms), wait_ms)
        if self._stand_in_future is None:
            problem = preparation_problem(self.future, STAND_IN_AFTER_MS)
            if problem != PENDING:
                return self._instead(problem, wait_ms - STAND_IN_AFTER_MS)
            self._start_stand_in_safely()
        waiting = [f for f in (self.future, self._stand_in_future) if f is not None]
        deadline = time.perf_counter() + (wait_ms - STAND_IN_AFTER_MS) / 1e3
        concurrent.futures.wait(waiting, timeout=deadline - time.perf_counter(),
                                return_when=concurrent.futures.FIRST_COMPLETED)
        if self.meanwhile() is None:  # no stand-in, or it failed (refused, needs a compiler): the choice
            concurrent.futures.wait([self.future], timeout=max(0.0, deadline - time.perf_counter()))
        return self._instead(preparation_problem(self.future, 0.0), max(0.0, deadline - time.perf_counter()) * 1e3)

    def _instead(self, problem: str | None, wait_ms: float) -> tuple[str | None, object | None]:
        """(problem, what runs instead). Once the choice failed (its backend missing here, a compile
        error) the stand-in runs for good: prepared now if it was not yet, or if the attempt made while
        the choice prepared (kept builds only) was refused (compiling allowed: it is final), waited for
        at most ``wait_ms``; while it still prepares, :data:`FALLING_BACK` (the
        default runs, nothing decided), so a stand-in slower to prepare than the choice took to fail
        is not passed over for the default."""
        if problem is None or problem == PENDING:
            return problem, self.meanwhile()
        deadline = time.perf_counter() + wait_ms / 1e3
        for _ in range(2):  # a kept-builds-only attempt refused (or ending refused): once more, compiling allowed
            if self._stand_in_future is None or not self._stand_in_final and self._refused(self._stand_in_future):
                self._start_stand_in_safely(final=True)
            future = self._stand_in_future
            if future is not None and not future.done() and wait_ms > 0:
                left = max(0.0, deadline - time.perf_counter())
                concurrent.futures.wait([future], timeout=None if wait_ms == float("inf") else left)
            if future is None or not future.done():
                break
        if future is not None and not future.done():
            return FALLING_BACK, None
        return problem, self.meanwhile()

    @staticmethod
    def _refused(future: concurrent.futures.Future) -> bool:
        return future.done() and preparation_problem(future, 0.0) is not None

    def _start_stand_in_safely(self, final: bool = False) -> None:
        """:meth:`_start_stand_in` on the caller's path: a failure to start (the worker pool shut down
        at exit) leaves no stand-in rather than raising into the call."""
        try:
            self._start_stand_in(final)
        except Exception:  # noqa: BLE001 - the default runs instead
            self._stand_in_future = None

    def meanwhile(self):
        """The stand-in once it is ready, else None (the default runs)."""
        future = self._stand_in_future
        return self.stand_in if future is not None and preparation_problem(future, 0.0) is None else None


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
