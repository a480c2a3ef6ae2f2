"""Triton compiles in worker processes, so that a candidate compiling never slows the user's calls.

A candidate's ``prepare`` compiles its Triton kernel on a worker thread (``tunable/preparations.py``)
while the user's program goes on calling. Triton's compiler holds the GIL for much of a compile
(its Python front end, and passes called without releasing it), so on a thread it takes the GIL
from every call the program makes meanwhile: on the H100 a numerical check of 4 ms CPU read 45 ms of
wall while GEMM configurations compiled, and a GEMM-patched training step ran at 0.74x torch's.
Inductor compiles in subprocesses for the same reason.

How, in :func:`compile_elsewhere`: Triton's ``jit_cache_hook`` is called with a kernel's full
specialization (the JSON ``JITFunction.preload`` reads) just before Triton would compile it; the
warm-up runs once with the hook returning True (capture, no compile), a worker process
(``triton_compile_worker.py``: Triton alone, no torch) compiles that specialization into Triton's
disk cache, and the warm-up then runs for real and finds it there, which costs milliseconds. The
worker thread waits on a pipe meanwhile, holding no GIL.

Any failure (no worker, a worker's error or death, a user's own cache hook, a kernel defined in
``__main__``) just leaves the compile to the calling process, as before: the same kernel, the same
errors. :func:`confirm` checks that the warm-up found the worker's build; a kernel function whose
build differs (a specialization the JSON does not carry) compiles in-process from then on.

``TUNEKIT_TRITON_SUBPROCESS=0`` turns it off.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading

from . import triton_compile_worker as worker_file
from .env import switch

__all__ = ["WORKERS", "enabled", "start_workers", "compile_elsewhere", "confirm", "stats", "shutdown"]

#: worker processes at most (the preparation threads that wait on them are as many)
WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))
_WORKER_FILE = os.path.abspath(worker_file.__file__)

#: counters for tests and experiments: compiled by a worker, then found (or not) by the warm-up
stats = {"offloaded": 0, "found": 0, "rebuilt": 0, "failed": 0, "cached": 0}
_in_process: set[int] = set()  # id() of kernel functions left to in-process compiles
rebuilt: list[tuple[str, str]] = []  # their names, and the specialization the worker built


def enabled() -> bool:
    return switch("TUNEKIT_TRITON_SUBPROCESS") and os.environ.get("TRITON_INTERPRET") != "1"


class _Capture(threading.local):
    active = False
    data: dict | None = None
    asked: str | None = None  # the last specialization this thread had a worker build


_capture = _Capture()
_hook_lock = threading.Lock()
_previous_hook = None


def _hook(**kwargs):
    """Triton's ``jit_cache_hook``: in a capturing thread, keep the specialization and skip the
    compile (True); elsewhere, whatever hook was installed before (or compile as usual)."""
    if _capture.active:
        _capture.data = kwargs["compile"]
        return True
    return _previous_hook(**kwargs) if _previous_hook is not None else None


def _install_hook() -> bool:
    """Our hook in Triton's knobs (once); False when someone else's hook replaced it."""
    global _previous_hook
    from triton import knobs
    with _hook_lock:
        current = knobs.runtime.jit_cache_hook
        if current is _hook:
            return True
        if getattr(_install_hook, "done", False):
            return False  # installed once and replaced since: the user's hook wins
        _previous_hook, knobs.runtime.jit_cache_hook = current, _hook
        _install_hook.done = True
        return True


def _capture_specialization(fn, grid, args, kwargs) -> dict | None:
    """The specialization a warm-up with these arguments would compile (None: already compiled)."""
    _capture.active, _capture.data = True, None
    try:
        fn.warmup(*args, grid=grid, **kwargs)
        return _capture.data
    except Exception:  # e.g. a constexpr Triton cannot write as JSON: the real warm-up compiles here
        return None
    finally:
        _capture.active, _capture.data = False, None


class _Worker:
    def __init__(self, key: str | None):
        env = dict(os.environ)
        try:
            from triton import knobs
            env["TRITON_CACHE_DIR"] = knobs.cache.dir  # where this process looks, however it was set
        except Exception:
            pass
        if key:
            env["TUNEKIT_TRITON_KEY"] = key
        self.pid = os.getpid()
        self.process = subprocess.Popen([sys.executable, _WORKER_FILE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                        text=True, bufsize=1)

    def ask(self, request: dict) -> dict | None:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self.process.stdout.readline() or "null")
        except (OSError, ValueError):  # ValueError: a closed pipe, or a reply that is not JSON
            return None
        return reply if isinstance(reply, dict) else None

    def usable(self) -> bool:
        return self.pid == os.getpid() and self.process.poll() is None

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass


_idle: queue.SimpleQueue = queue.SimpleQueue()
_slots = threading.Semaphore(WORKERS)  # asks at once: never more than there are workers
_pool_lock = threading.Lock()
_all: list[_Worker] = []
_prestarted = False


def _triton_key() -> str | None:
    """Triton's key of its own installation (this process needs it for any compile or cache lookup;
    computed once), passed to the workers so each need not hash Triton's library again."""
    try:
        from triton.runtime.cache import triton_key
        return triton_key()
    except Exception:
        return None


def _spawn() -> _Worker | None:
    """A new worker, if fewer than WORKERS of this process are alive."""
    with _pool_lock:
        _all[:] = [w for w in _all if w.usable()]
        if len(_all) >= WORKERS:
            return None
        try:
            worker = _Worker(_triton_key())
        except OSError:
            return None
        _all.append(worker)
        return worker


def _alive() -> int:
    with _pool_lock:
        return sum(w.usable() for w in _all)


def start_workers() -> None:
    """Start the workers now, in the background (their start, Triton's import, takes a few tenths
    of a second): called when Triton kernels are first needed in a process that uses a GPU, so the
    first compiles find them started."""
    global _prestarted
    if _prestarted or not enabled():
        return
    _prestarted = True

    def start():
        while (worker := _spawn()) is not None:
            _idle.put(worker)

    threading.Thread(target=start, name="tunekit-triton-workers", daemon=True).start()


def _ask_worker(request: dict) -> dict | None:
    """Send ``request`` to an idle worker (one is started if none is idle); None if none could
    answer."""
    with _slots:
        worker = None
        while worker is None:
            try:
                worker = _idle.get_nowait()
            except queue.Empty:
                worker = _spawn()
                if worker is None:
                    if not _alive():
                        return None  # none could be started
                    worker = _idle.get()  # all are started, and one is free (the slots) or starting
            if not worker.usable():
                worker = None
        reply = worker.ask(request)
        if worker.usable():
            _idle.put(worker)
        return reply


def _request(fn, data: dict, target) -> dict | None:
    inner = getattr(fn, "fn", None)
    module = getattr(inner, "__module__", None)
    if inner is None or module in (None, "__main__") or "<locals>" in inner.__qualname__:
        return None
    return {"module": module, "qualname": inner.__qualname__, "file": inner.__code__.co_filename,
            "target": dataclasses.asdict(target), "specialization": data["specialization_data"]}


def _in_cache(fn, data: dict, target) -> bool:
    """Whether Triton's disk cache already holds this build (a warm cache: the warm-up here loads it
    in milliseconds, no worker needed). The lookup ``triton.compile`` makes first; False if it
    cannot be made."""
    try:
        from triton.compiler import compiler
        src = compiler.ASTSource(fn, data["signature"], data["constants"], data["configs"][0])
        backend = compiler.make_backend(target)
        options = worker_file.options_of(json.loads(data["specialization_data"]))
        options = backend.parse_options(dict(options, **src.parse_options()))
        key = compiler.get_cache_key(src, backend, options, env_vars=compiler.get_cache_invalidating_env_vars())
        group = compiler.get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(
            f"{src.name[:150]}.json")
        return bool(group) and f"{src.name[:150]}.json" in group
    except Exception:
        return False


def compile_elsewhere(fn, grid, args, kwargs) -> str | None:
    """Have a worker process compile what ``fn.warmup(*args, grid=grid, **kwargs)`` would; the
    build's cache hash, or None where the calling process is left to compile or load (see the
    module)."""
    if id(fn) in _in_process or not enabled() or not _install_hook():
        return None
    data = _capture_specialization(fn, grid, args, kwargs)
    if data is None:
        return None
    from triton.runtime import driver
    target = driver.active.get_current_target()
    if _in_cache(fn, data, target):
        stats["cached"] += 1
        return None
    request = _request(fn, data, target)
    reply = None if request is None else _ask_worker(request)
    if not reply or not reply.get("ok"):
        stats["failed"] += request is not None
        return None
    stats["offloaded"] += 1
    _capture.asked = request["specialization"]
    return reply["hash"]


def confirm(fn, expected: str | None, compiled) -> None:
    """After the real warm-up: did it find the worker's build? If not, it compiled again here, and
    this kernel function compiles in-process from now on."""
    if expected is None:
        return
    if getattr(compiled, "hash", None) == expected:
        stats["found"] += 1
    else:
        stats["rebuilt"] += 1
        rebuilt.append((getattr(getattr(fn, "fn", None), "__qualname__", repr(fn)), getattr(_capture, "asked", None)))
        _in_process.add(id(fn))


def shutdown() -> None:
    """End the workers (they also end when this process does: their stdin closes)."""
    with _pool_lock:
        while _all:
            _all.pop().close()


atexit.register(shutdown)
