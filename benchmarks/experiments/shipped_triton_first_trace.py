"""Answers: in a fresh process whose first Triton choice comes from the shipped results (logsumexp
32768x64 float32 on an H100), where do the seconds until the choice is in effect go, and which calls
stall? A timeline of the steps of Triton's start and of the choice's preparation (thread, start,
duration), and every call's wall time with the candidate that ran it.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/shipped_triton_first_trace.py [--calls N]``;
run it twice with the same TRITON_CACHE_DIR / TUNEKIT_CACHE to see a warm cache; ``--no-early-key``:
Triton's key of its install hashed only when its first lookup needs it (as before).
"""

from __future__ import annotations

import argparse
import functools
import threading
import time

T0 = time.perf_counter()
EVENTS: list[tuple[float, float, str, str]] = []  # start s, duration ms, thread, what


def timed(owner, attr: str, label: str, after=None) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((start - T0, (time.perf_counter() - start) * 1e3, threading.current_thread().name, label))
            if after is not None:
                after()
    setattr(owner, attr, wrapper)


def instrument() -> None:
    """tunekit's steps now; Triton's once tunekit has imported it (importing it here would add an
    import the program does not make)."""
    from tunekit.backends import shipped_kernels, triton as triton_backend, triton_compile
    timed(triton_backend, "_module", "import the kernels module (Triton's import included)", after=_triton_once)
    timed(shipped_kernels, "seed_triton_cache", "seed Triton's cache from the shipped builds")
    timed(triton_compile, "compile_elsewhere", "compile_elsewhere (worker process)")
    timed(triton_compile, "_in_cache", "  _in_cache (Triton's disk-cache key)")
    from tunekit.backends import triton_workers
    timed(triton_workers, "ask", "  triton_workers.ask (a worker compiles)")


@functools.lru_cache(maxsize=None)
def _triton_once() -> None:
    import importlib
    import triton.compiler.compiler as compiler
    import triton.runtime.jit as jit
    timed(jit.JITFunction, "warmup", "JITFunction.warmup (key, cache lookup or compile)")
    timed(compiler.CompiledKernel, "_init_handles", "CompiledKernel._init_handles (module load, launcher)")
    cache = importlib.import_module("triton.runtime.cache")
    timed(cache, "triton_key", "    triton_key (hashes Triton's sources and libtriton.so)")
    timed(cache, "get_cache_key", "   get_cache_key")
    nvidia = importlib.import_module("triton.backends.nvidia.compiler")
    timed(nvidia.CUDABackend, "hash", "    CUDABackend.hash (ptxas version)")
    driver = importlib.import_module("triton.backends.nvidia.driver")
    for name in ("compile_module_from_src", "make_launcher"):
        if hasattr(driver, name):
            timed(driver, name, f"nvidia.driver.{name} (C launcher build or load)")
    for cls in ("CudaLauncher", "CudaUtils"):
        if hasattr(driver, cls):
            timed(getattr(driver, cls), "__init__", f"{cls}.__init__")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--no-early-key", action="store_true",
                    help="Triton's key hashed where Triton's lookup first needs it (before 2026-11-26 afternoon)")
    args = ap.parse_args()
    import torch
    import tunekit
    from tunekit.tunable.registry import get_op
    torch.cuda.init()
    x = torch.randn(args.rows, args.cols, device="cuda")
    torch.logsumexp(x, -1)  # torch's own kernel loaded: not part of the trace
    torch.cuda.synchronize()
    setup = time.perf_counter()
    instrument()
    if args.no_early_key:
        from tunekit.backends import triton_compile
        triton_compile.hash_triton_key = lambda: None
    op = get_op("logsumexp")
    calls, final = [], None
    for i in range(args.calls):
        start = time.perf_counter()
        tunekit.logsumexp(x, -1)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
        decision = op.decision(op.make_params(x, -1))
        name = decision.candidate.name if decision is not None else "-"
        calls.append((start - T0, wall, name))
        if final is None and "triton" in name:
            final = i + 1
        time.sleep(0.005)
    print(f"# setup {(setup - T0):.2f} s after start; the choice in effect from call {final}")
    for start, ms, thread, what in sorted(EVENTS):
        if ms < 0.5:  # the kernels module is looked up on every Triton call: only its import counts
            continue
        print(f"event {start:7.3f} s {ms:9.1f} ms  {thread:24s} {what}")
    shown = [c for i, c in enumerate(calls) if i < 3 or c[1] > 5 or (i and calls[i - 1][2] != c[2])]
    for start, wall, name in shown:
        print(f"call  {start:7.3f} s {wall:9.2f} ms  {name}")


if __name__ == "__main__":
    main()
