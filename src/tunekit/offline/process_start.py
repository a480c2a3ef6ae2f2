"""What a fresh tuning process pays once before its first signature, and how it pays less.

Why this matters: offline tuning on N GPUs runs N processes, and each pays its own start (S)
before tuning anything; two GPUs take about S + W/2 against one GPU's S + W, so S bounds the
speed-up more than anything inside tuning does. Two parts of S are paid less here:

- CUDA initialisation takes longer with every GPU of the host visible than with one. A worker uses
  one GPU, so it makes only that one visible (:func:`visible_devices`), before CUDA is initialised
  in it.
- Triton's cache key (``triton_key()``: a SHA-256 of Triton's sources and its ~0.5 GB library) is
  needed before the first Triton kernel is found in the cache. It is hashed on a thread while the
  main thread creates the CUDA context (:func:`prepare`): hashing releases the GIL, and so does the
  driver-API context creation, where torch's own CUDA initialisation holds it; a process after the
  first on an install takes the key the first stored (:mod:`tunekit.backends.triton_key`).

The phases of a worker's start, as measured (``benchmarks/checks/offline_start.py``):
``docs/measurements.md``.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from ..backends import triton_key

__all__ = ["visible_devices", "prepare"]


def visible_devices(index: int, environ=os.environ) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that makes GPU ``index`` of this process (as torch numbers
    it) the only GPU of a child process: the index-th entry of this process's own setting (an
    index or a UUID), or the index itself when it has none."""
    current = environ.get("CUDA_VISIBLE_DEVICES")
    if current is None:
        return str(index)
    entries = [e.strip() for e in current.split(",") if e.strip()]
    if not 0 <= index < len(entries):
        raise ValueError(f"GPU {index} is not among CUDA_VISIBLE_DEVICES={current!r}")
    return entries[index]


def _triton_cache_key() -> None:
    """Compute (and cache, in Triton's own lru_cache) Triton's cache key, when Triton kernels will
    be looked up in its cache in this process."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return
    try:
        from triton.runtime import cache
        cache.triton_key  # noqa: B018 - a version that keys its cache otherwise has none
    except (ImportError, AttributeError):  # no Triton, or a version that keys its cache otherwise
        return
    try:
        triton_key.installed_key(cache)
    except Exception:  # a broken install: the first Triton candidate reports it, as it would have
        pass


def _retain_primary_context(ordinal: int) -> None:
    """Create the GPU's primary context (the one torch's runtime then uses) through the driver API
    by ctypes, which releases the GIL for the call: the Triton key's thread runs meanwhile, as it
    cannot while torch initialises CUDA holding the GIL. Any failure is left to torch's own
    initialisation, which follows and reports it."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0:
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)  # held for the process's life
    except (OSError, AttributeError):
        pass


def prepare(device: torch.device) -> None:
    """Pay this process's fixed start for tuning on ``device`` now, overlapped: Triton's cache key
    on a thread while the main thread creates ``device``'s CUDA context. Idempotent and cheap once
    done (both parts are cached by their owners); on the CPU it does nothing. Call it before
    ``torch.cuda.set_device`` or ``torch.cuda.device(...)``: either creates the context itself,
    holding the GIL."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = threading.Thread(target=_triton_cache_key, name="tunekit-triton-key", daemon=True)
    key.start()
    try:
        _retain_primary_context(index)
    finally:
        key.join()
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
