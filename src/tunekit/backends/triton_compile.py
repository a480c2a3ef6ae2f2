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

Any failure (no worker, a worker's error or death, a Triton without these hooks, a user's own cache
hook, a kernel defined in ``__main__``, a specialization JSON cannot hold) just leaves the compile to
the calling process, as before: the same kernel, the same errors. :func:`confirm` checks that the
warm-up found the worker's build; a kernel function whose build differs compiles in-process from then
on. The hook makes Triton write every compile's specialization as JSON, also for the user's own
kernels: where JSON cannot hold it, the writer tunekit installs returns None instead of raising (as
Triton's own warm-up pool does), and that compile goes on as without the hook.

``TUNEKIT_TRITON_SUBPROCESS=0`` turns it off.

Triton's disk-cache key of its own install (``triton_key``: a hash of its sources and of the 500 MB
``libtriton.so``, 0.3-0.4 s, once per process) is the first lookup's cost, for a build in the cache
too: :func:`hash_triton_key` starts it on a thread of its own as soon as tunekit imports Triton's
kernels, so that it runs beside the warm-up's first steps (the hashing releases the GIL) instead of
after them; lookups wait for it (:func:`wait_for_key`) rather than hash a second time. A process
after the first on an install takes the key stored by it (:mod:`tunekit.backends.triton_key`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading

from . import triton_compile_worker as worker_file
from . import triton_key, triton_workers
from .env import switch

__all__ = ["enabled", "compile_elsewhere", "confirm", "stats", "rebuilt", "hash_triton_key", "wait_for_key"]

#: counters for tests and experiments: compiled by a worker, then found (or not) by the warm-up
stats = {"offloaded": 0, "found": 0, "rebuilt": 0, "failed": 0, "cached": 0}
_in_process: set[int] = set()  # id() of kernel functions left to in-process compiles
rebuilt: list[tuple[str, str]] = []  # their names, and the specialization the worker built


_key_done = threading.Event()
_key_lock = threading.Lock()
_key_started = False


def hash_triton_key() -> None:
    """Start Triton's ``triton_key()`` (cached by Triton for the process) on a daemon thread, once;
    nothing where it does not exist or under the interpreter (which builds nothing)."""
    global _key_started
    with _key_lock:
        if _key_started or os.environ.get("TRITON_INTERPRET") == "1":
            return
        _key_started = True
    try:
        threading.Thread(target=_hash_key, name="tunekit-triton-key", daemon=True).start()
    except RuntimeError:  # no thread to be had (interpreter shutdown): lookups hash for themselves
        _key_done.set()


def _forked_child() -> None:
    """A child forked while the hash ran has no such thread: nothing to wait for there."""
    global _key_started, _key_done
    _key_started, _key_done = False, threading.Event()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


def _hash_key() -> None:
    try:
        from triton.runtime import cache
        triton_key.installed_key(cache)
    except Exception:  # noqa: BLE001 - another Triton: its own lookup computes what it needs
        pass
    finally:
        _key_done.set()


def wait_for_key(timeout: float = 30.0) -> None:
    """Wait for :func:`hash_triton_key`'s hash, if one was started (a lookup would hash again)."""
    if _key_started:
        _key_done.wait(timeout)


def enabled() -> bool:
    return (switch("TUNEKIT_TRITON_SUBPROCESS") and os.environ.get("TRITON_INTERPRET") != "1"
            and not triton_workers.given_up())


class _Capture(threading.local):
    active = False
    data: dict | None = None
    asked: str | None = None  # the last specialization this thread had a worker build


_capture = _Capture()
_hook_lock = threading.Lock()
_installed = {"done": False, "previous": None}


def _hook(**kwargs):
    """Triton's ``jit_cache_hook``: in a capturing thread, keep the specialization and skip the
    compile (True; None where JSON could not hold it: compile here); elsewhere, whatever hook was
    installed before (or compile as usual)."""
    if _capture.active:
        if kwargs["compile"].get("specialization_data") is None:
            return None
        _capture.data = kwargs["compile"]
        return True
    previous = _installed["previous"]
    return previous(**kwargs) if previous is not None else None


def _safe_writer(write):
    def serialize_specialization_data(*args, **kwargs):
        try:
            return write(*args, **kwargs)
        except (TypeError, ValueError):  # a constexpr JSON cannot hold (a Gluon layout, a complex)
            return None
    serialize_specialization_data.tunekit_safe = True
    return serialize_specialization_data


def _install_hook() -> bool:
    """Our hook in Triton's knobs and the safe JSON writer (once); False where this Triton has no
    such hook, or someone else's hook replaced ours since."""
    try:
        from triton import knobs
        from triton.runtime import jit
        current, write = knobs.runtime.jit_cache_hook, jit.serialize_specialization_data
    except (ImportError, AttributeError):  # Triton before 3.4
        return False
    with _hook_lock:
        if current is _hook:
            return True
        if _installed["done"]:
            return False  # installed once and replaced since: the user's hook wins
        if not getattr(write, "tunekit_safe", False):
            jit.serialize_specialization_data = _safe_writer(write)
        _installed.update(done=True, previous=current)
        knobs.runtime.jit_cache_hook = _hook
        return True


def _capture_specialization(fn, grid, args, kwargs) -> dict | None:
    """The specialization a warm-up with these arguments would compile (None: already compiled)."""
    _capture.active, _capture.data = True, None
    try:
        fn.warmup(*args, grid=grid, **kwargs)
        return _capture.data
    finally:
        _capture.active, _capture.data = False, None


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
    module). Never raises: whatever fails here, the warm-up that follows meets it again."""
    if id(fn) in _in_process or not enabled():
        return None
    try:
        if not _install_hook():
            return None
        data = _capture_specialization(fn, grid, args, kwargs)
        if data is None:
            return None
        from triton.runtime import driver
        target = driver.active.get_current_target()
        wait_for_key()
        if _in_cache(fn, data, target):
            stats["cached"] += 1
            return None
        request = _request(fn, data, target)
        reply = None if request is None else triton_workers.ask(request)
    except Exception:
        return None
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
