"""Triton kernels at run time: the kernel modules of ``tunekit/kernels/triton`` imported at first use,
and the checks every Triton candidate shares.

Why lazily: ``import tunekit`` never imports Triton (it costs time and is an optional extra), and
tests can set ``TRITON_INTERPRET=1`` (run the kernels on CPU tensors in Triton's interpreter) before
a kernels module is imported and its kernels decorated.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading

import torch

from . import thread_context, triton_compile
from .shipped_kernels import seed_triton_cache

__all__ = ["NO_TRITON", "kernel", "interpreted", "device_problem", "on_device", "launch", "warming"]

NO_TRITON = "needs triton (pip install 'tunekit[triton]')"


@functools.lru_cache(maxsize=None)
def _module(name: str):
    """``tunekit.kernels.triton.<name>``, or None without Triton. A broken kernels module raises:
    it must not read as "no triton"."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    module = importlib.import_module(f"tunekit.kernels.triton.{name}")
    triton_compile.hash_triton_key()  # Triton's first cache lookup needs it: hashed from now, beside the rest
    return module


def kernel(module: str, name: str):
    """The ``@triton.jit`` function ``name`` of ``tunekit.kernels.triton.<module>``, or None without Triton."""
    found = _module(module)
    return None if found is None else getattr(found, name)


def interpreted(fn) -> bool:
    """True when ``fn`` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    return type(fn).__name__ == "InterpretedFunction"


def device_problem(device: torch.device, fn=None) -> str | None:
    """Why a Triton kernel cannot run on ``device`` (None when it can): a CUDA device, or the CPU in
    Triton's interpreter; ``fn`` (the kernel, if already loaded) must have been decorated for it."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not (device.type == "cpu" and interpreting):
        return "needs a CUDA device (or TRITON_INTERPRET=1 for CPU tensors)"
    if device.type == "cpu" and fn is not None and not interpreted(fn):
        return "Triton kernels were compiled for the GPU (TRITON_INTERPRET=1 set after they loaded)"
    return None


def on_device(device: torch.device):
    """A context in which launches go to ``device``: Triton launches on the current device's current
    stream, so another CUDA device is made current for the launch."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


class _Warming(threading.local):
    active = False


_warming = _Warming()
_compiling: dict[int, threading.Lock] = {}  # id(kernel) -> the lock its warm-up compiles hold
_compiling_lock = threading.Lock()


def launch(fn, grid, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``; inside :func:`warming`, compile for these arguments without
    launching (Triton's ``warmup``: the same specialization a launch would compile and cache). Warm-up
    compiles of one kernel function run one at a time (its cache of specializations is shared);
    different functions compile at once on several worker threads, each compile done by a worker
    process where it can be (:mod:`tunekit.backends.triton_compile`: a compile on a thread takes the
    GIL from the caller's calls). The warm-up also loads the compiled module onto the device
    (milliseconds per kernel that a first launch, inside a tuning check, would otherwise pay); a
    kernel the device cannot hold (shared memory) raises here."""
    if not (_warming.active and not interpreted(fn)):
        fn[grid](*args, **kwargs)
        return
    with _compiling_lock:
        lock = _compiling.setdefault(id(fn), threading.Lock())
    with lock:
        built = triton_compile.compile_elsewhere(fn, grid, args, kwargs)
        triton_compile.wait_for_key()
        compiled = fn.warmup(*args, grid=grid, **kwargs)
        triton_compile.confirm(fn, built, compiled)
    load = getattr(compiled, "_init_handles", None)  # Triton's own first-launch step (3.x)
    if load is not None:
        load()


@contextlib.contextmanager
def warming(device: torch.device | None = None):
    """A block in which this thread's Triton launches (through :func:`launch`) only compile and load:
    what a candidate's ``prepare`` runs on a worker thread, so a later launch finds its kernel ready.
    ``device`` is made current for the block (a worker thread starts on device 0). The shipped
    Triton builds are copied into Triton's cache first (once per process:
    :func:`tunekit.backends.shipped_kernels.seed_triton_cache`), so a shipped kernel loads instead of compiling."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        seed_triton_cache()
    before, _warming.active = _warming.active, True
    try:  # capture_relaxed: its loads and allocations never break a user's CUDA graph capture
        with on_device(device) if device is not None else contextlib.nullcontext(), thread_context.capture_relaxed():
            yield
    finally:
        _warming.active = before
