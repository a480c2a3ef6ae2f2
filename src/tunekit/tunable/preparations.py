"""A tuning session's background preparations (compiles), and what an op's choice cache holds while a
session can do nothing but wait for them.

A candidate's ``prepare(params)`` (compile and load its kernel, never a launch) runs on a worker
thread so that no call waits 0.1-1 s for a compile (``tunable/session.py``). Two things follow:

- While every remaining check waits for a preparation, a call that resumes the session finds
  nothing to do, yet paid for the op's resolve path (the signature, the lock, the session): ~50 us
  per call on the H200 host, 4-5x a small GEMM's whole host time, for the seconds that forty Triton
  configurations take to compile. Such a session is *parked*: the op caches a :class:`ParkedChoice`
  that runs the incumbent directly until a preparation finishes (a count the workers' callbacks
  keep), then hands the call back to the resolve path.
- Preparations the session will never check (its choice is made, or its budget ran out) are
  cancelled if they have not started: a worker left compiling after the choice takes the caller's
  GIL for nothing.
- A preparation may be asked to use kept builds only (:func:`builds_only`): a shipped Triton choice is
  first prepared that way, so it is ready in milliseconds where its build was kept, and so is every
  stand-in until the choice has failed; a backend that would have to compile (NVRTC, or start a
  compiler, as Triton's import) raises :class:`NeedsCompiler` instead (``tunable/shipped.py``). The C
  launch extensions' builds (``fast_launch``, ``fast_call``) are not gated: a choice builds them too.
- An op may cap how many candidates an online session compiles (``TunableOp.online_preparations``):
  the first ones worth trying, in the op's order (best first); the rest are recorded as skipped for
  offline tuning (``tunekit tune``, which compiles every one), and the entry still counts as complete.
  Why: Triton's compiler holds the GIL for much of a compile, so compiles on worker threads slow the
  caller's own Python. A LLaMA-style training step with the GEMMs patched met 14 GEMM signatures of
  forty Triton configurations each; its compiles kept the step at 0.74x torch's for 200 steps (H100),
  and the signatures undecided.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

__all__ = ["PREPARE_WORKERS", "preparer", "session_worker", "Preparations", "ParkedChoice", "park", "NeedsCompiler",
           "compilers_allowed", "builds_only"]


class NeedsCompiler(RuntimeError):
    """A preparation asked for kept builds only (:func:`builds_only`) met one it would have to compile."""


_compilers = contextvars.ContextVar("tunekit_compilers_allowed", default=True)


def compilers_allowed() -> bool:
    """False inside :func:`builds_only`: backends must then raise NeedsCompiler rather than compile."""
    return _compilers.get()


@contextlib.contextmanager
def builds_only():
    """A block whose preparations may load kept builds but not compile (nor import a compiler)."""
    token = _compilers.set(False)
    try:
        yield
    finally:
        _compilers.reset(token)

#: worker threads for preparations: compilers release the GIL (NVRTC) or run as subprocesses
#: (Triton's ptxas), so a few compile at once; the caller's thread keeps one core
PREPARE_WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))

_pool: ThreadPoolExecutor | None = None
_own_pool: ThreadPoolExecutor | None = None
_count_lock = threading.Lock()
_pools_lock = threading.Lock()


def preparer() -> ThreadPoolExecutor:
    """The worker threads for every op's preparations (compiles), off the caller's thread."""
    global _pool
    with _pools_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=PREPARE_WORKERS, thread_name_prefix="tunekit-prepare")
        return _pool


def session_worker() -> ThreadPoolExecutor:
    """One thread for tuning sessions' own work (their support screens, the check's warm-up): on the compile
    workers a new signature's screen queued behind earlier signatures' compiles (one worker on a 2-core host)."""
    global _own_pool
    with _pools_lock:
        if _own_pool is None:
            _own_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-session")
        return _own_pool


class Preparations:
    """The preparations one session started, by candidate name. ``finished``: how many have ended
    (done, failed or cancelled) so far; it only grows, so a changed count says something is ready."""

    def __init__(self):
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()  # a preparation may start others from its worker (the session's screen)
        self._closed = False  # cancel() of every one: what would start later never starts (a screen still running)
        self.finished = 0

    def __len__(self) -> int:  # preparations started
        return len(self._futures)

    def start(self, name: str, prepare: Callable, params, *, own: bool = False) -> None:
        """``prepare(params)`` on a compile worker (``own``: the session's own work, on :func:`session_worker`);
        nothing once every preparation was cancelled (the session ended or was forgotten), nor for a name whose
        preparation is pending or succeeded."""
        with self._lock:
            known = self._futures.get(name)
            if self._closed or (known is not None and not (known.done() and (known.cancelled() or known.exception()))):
                return  # closed, or this one pending or done (a screen run again after failing on its worker)
            try:
                future = (session_worker() if own else preparer()).submit(prepare, params)
            except RuntimeError:  # the pools shut down (the interpreter exits): not started, the session goes on
                return
            self._futures[name] = future
        future.add_done_callback(self._count)

    def _count(self, future: Future) -> None:  # a worker's callback; the lock: no increment lost
        with _count_lock:
            self.finished += 1

    def started(self, name: str) -> bool:
        """Whether ``name`` has a preparation (running, done or cancelled) in this session."""
        return name in self._futures

    def ready(self, name: str) -> bool:
        """Whether ``name`` can be checked now (its preparation ended, or it has none)."""
        future = self._futures.get(name)
        return future is None or future.done()

    def result(self, name: str):
        """What ``name``'s preparation returned (waiting for it; what it raised is raised here)."""
        return self._futures[name].result()

    def failure(self, name: str) -> BaseException | None:
        """What ``name``'s preparation raised (None: it has none, has not ended, was cancelled, or returned)."""
        future = self._futures.get(name)
        return future.exception() if future is not None and future.done() and not future.cancelled() else None

    def succeeded(self, name: str) -> bool:
        """Whether ``name``'s preparation ran and returned (not cancelled, not failed, not pending)."""
        future = self._futures.get(name)
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    def first_pending(self) -> Future | None:
        with self._lock:
            return next((f for f in self._futures.values() if not f.done()), None)

    def cancel(self, name: str | None = None) -> None:
        """Cancel ``name``'s preparation (None: every one, and any started later) where it has not started."""
        with self._lock:
            names = [name] if name is not None else list(self._futures)
            self._closed = self._closed or name is None
        for key in names:
            future = self._futures.get(key)
            if future is not None:
                future.cancel()


class ParkedChoice:
    """What an op's choice cache holds for a call key while its signature's session is parked
    (``TuningSession.parked``): runs the incumbent with no lookup of the session; once a preparation
    ended, drops itself and hands the call to ``miss(params)`` (the op's resolve path, which resumes
    the session)."""

    __slots__ = ("session", "choices", "key", "miss")

    def __init__(self, session, choices: dict, key, miss: Callable):
        self.session, self.choices, self.key, self.miss = session, choices, key, miss

    @property
    def name(self) -> str:
        return self.session.incumbent.name

    def run(self, params, **kwargs):
        self.session.calls += 1
        if self.session.parked():
            return self.session.incumbent.run(params, **kwargs)
        if self.choices.get(self.key) is self:
            self.choices.pop(self.key, None)
        return self.miss(params).run(params, **kwargs)


def park(session, choices: dict, key, miss: Callable) -> None:
    """Put a :class:`ParkedChoice` under ``key`` in ``choices`` when ``session`` (or None) is parked."""
    if session is not None and session.parked():
        choices[key] = ParkedChoice(session, choices, key, miss)
