"""What a fresh tuning process pays once before its first signature, and how it pays less.

Why this matters: offline tuning on N GPUs runs N processes, and each pays its own start (S)
before tuning anything; two GPUs take about S + W/2 against one GPU's S + W, so S bounds the
speed-up more than anything inside tuning does. Measured on a 2 x H200 host
(``benchmarks/offline_start.py``), a worker's start was ~1 s, of which:

- CUDA initialisation with every GPU of the host visible: 0.53-0.60 s in a fresh process, against
  0.33 s with one GPU visible. A worker uses one GPU, so it makes only that one visible
  (:func:`visible_devices`), before CUDA is initialised in it.
- Triton's cache key (``triton_key()``: a SHA-256 of Triton's sources and its ~0.5 GB library),
  0.27-0.37 s, needed before the first Triton kernel is found in the cache. It is hashed on a
  thread while the main thread initialises CUDA (:func:`prepare`); hashing releases the GIL.
  Measured alone: 0.37 s + 0.53 s in sequence, 0.79 s overlapped.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

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
        from triton.runtime.cache import triton_key
    except ImportError:  # no Triton, or a version that keys its cache otherwise
        return
    try:
        triton_key()
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
