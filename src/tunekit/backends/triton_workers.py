"""The Triton compile worker processes (``triton_compile_worker.py``) of this process: started on
demand (at most :data:`WORKERS`), reused, ended with it. Used by :mod:`tunekit.backends.triton_compile`.

A worker that cannot answer (it died, timed out, replied out of step, or is another Python) is
killed, never reused; after :data:`MAX_FAILURES` such failures in a row no worker is asked again in
this process (the caller compiles in-process, as without workers).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import select
import subprocess
import sys
import threading

from . import triton_compile_worker as worker_file
from . import triton_key

__all__ = ["WORKERS", "REPLY_TIMEOUT_S", "MAX_FAILURES", "start", "ask", "given_up", "shutdown"]

#: worker processes at most (the preparation threads that wait on them are as many)
WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))
#: the longest a compile may take before its worker is taken for hung (Triton's largest take ~1 min)
REPLY_TIMEOUT_S = 600.0
#: failed asks in a row after which this process stops asking workers
MAX_FAILURES = 3
_WORKER_FILE = os.path.abspath(worker_file.__file__)

_ids = itertools.count()
_idle: queue.SimpleQueue = queue.SimpleQueue()
_slots = threading.Semaphore(WORKERS)  # asks at once: never more than there are workers
_lock = threading.Lock()
_all: list["_Worker"] = []
_state = {"failures": 0, "started": False}


def _environment() -> dict:
    """The caller's environment, plus where its Triton is and looks for builds, and Triton's key of
    itself (a hash of its 400 MB library: each worker need not compute it again). A worker whose
    own Triton is another installation refuses every request (the key would be wrong)."""
    import triton
    from triton import knobs
    from triton.runtime import cache
    env = dict(os.environ)
    env.update(TRITON_CACHE_DIR=knobs.cache.dir, TUNEKIT_TRITON_FILE=os.path.realpath(triton.__file__),
               TUNEKIT_TRITON_KEY=triton_key.installed_key(cache))
    return env


class _Worker:
    def __init__(self):
        self.pid = os.getpid()
        self.process = subprocess.Popen([sys.executable, _WORKER_FILE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        env=_environment(), text=True, bufsize=1)

    def ask(self, request: dict) -> dict | None:
        """The reply to ``request``, or None (and the worker killed) when there is none in step."""
        request = dict(request, id=next(_ids))
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT_S)
            reply = json.loads(self.process.stdout.readline() or "null") if ready else None
        except (OSError, ValueError):  # ValueError: a closed pipe, or a reply that is not JSON
            reply = None
        if not isinstance(reply, dict) or reply.get("id") != request["id"]:
            self.kill()
            return None
        return reply

    def usable(self) -> bool:
        return self.pid == os.getpid() and self.process.poll() is None

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except Exception:  # already gone
            pass

    def close(self) -> None:
        try:
            self.process.stdin.close()  # the worker ends at the end of its input
        except OSError:
            pass


def _spawn() -> _Worker | None:
    """A new worker, if fewer than WORKERS of this process are alive."""
    with _lock:
        _all[:] = [w for w in _all if w.usable()]
        if len(_all) >= WORKERS:
            return None
        try:
            worker = _Worker()
        except Exception:  # no interpreter to start, no Triton knobs: the caller compiles itself
            return None
        _all.append(worker)
        return worker


def _alive() -> int:
    with _lock:
        return sum(w.usable() for w in _all)


def start() -> None:
    """Start the workers now, in the background (a worker's start, Triton's import, takes a few
    tenths of a second), once per process, at its first compile: a process whose kernels all load
    from the cache (shipped or stored choices) starts none."""
    with _lock:
        if _state["started"]:
            return
        _state["started"] = True

    def run():
        while (worker := _spawn()) is not None:
            _idle.put(worker)

    threading.Thread(target=run, name="tunekit-triton-workers", daemon=True).start()


def _take() -> _Worker | None:
    """An idle worker, a new one, or (all started and busy or starting) the next one freed."""
    while True:
        try:
            worker = _idle.get_nowait()
        except queue.Empty:
            worker = _spawn()
            if worker is None:
                if not _alive():
                    return None
                try:
                    worker = _idle.get(timeout=1.0)
                except queue.Empty:  # one may have died meanwhile: look again
                    continue
        if worker.usable():
            return worker


def ask(request: dict) -> dict | None:
    """Send ``request`` to a worker; its reply, or None if none could answer."""
    if given_up():
        return None
    start()  # the first compile asked for: the other workers start for the compiles that follow
    with _slots:
        worker = _take()
        reply = None if worker is None else worker.ask(request)
        if worker is not None and worker.usable():
            _idle.put(worker)
    with _lock:
        _state["failures"] = 0 if reply is not None and reply.get("ok") else _state["failures"] + 1
    return reply


def given_up() -> bool:
    """Whether MAX_FAILURES asks in a row failed: workers are not asked again in this process."""
    return _state["failures"] >= MAX_FAILURES


def shutdown() -> None:
    """End the workers (they also end when this process does: their stdin closes)."""
    with _lock:
        while _all:
            _all.pop().close()


atexit.register(shutdown)
