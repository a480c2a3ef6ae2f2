"""Answers: on a process's first call of a shipped signature, which steps hold the calling thread, and which run on
workers meanwhile? Wall-clock spans (perf_counter, thread name) of the runtime's steps, wrapped in place (no profiler:
cProfile inflates Python-heavy steps), for each named signature's first call in one fresh process (CUDA context made
and one torch kernel run first), then its second call. GPU only.

    PYTHONPATH=src python benchmarks/experiments/first_call_timeline.py [--call 'gelu fwd 4096x4096 float16' ...]
"""
from __future__ import annotations

import argparse
import functools
import importlib
import sys
import threading
import time

import torch

sys.path.insert(0, "benchmarks/experiments")
T0 = time.perf_counter()
import tunekit  # noqa: E402

IMPORT_MS = (time.perf_counter() - T0) * 1e3
from first_call_profile import CALLS, make_call, timed  # noqa: E402

#: (module, attribute path) of the steps timed; a class method as "Class.method"
STEPS = [("tunekit.tunable.tunable_op", "TunableOp.resolve"), ("tunekit.tunable.tunable_op", "TunableOp.decide_here"),
         ("tunekit.tunable.tunable_op", "results_store"), ("tunekit.tunable.validators", "candidate_hashes"),
         ("tunekit.tunable.validators", "environment"), ("tunekit.tunable.shipped", "shipped_entry"),
         ("tunekit.tunable.shipped", "Preparation.wait"), ("tunekit.tunable.shipped", "_prepare"),
         ("tunekit.backends.shipped_kernels", "shipped_cubin"), ("tunekit.backends.shipped_kernels", "shipped_static"),
         ("tunekit.backends.cuda", "_load_module"), ("tunekit.backends.cuda", "_module"),
         ("tunekit.backends.fast_call", "build"), ("tunekit.backends.extension", "load"),
         ("tunekit.backends.extension", "verify"), ("tunekit.backends.triton_static", "load"),
         ("tunekit.tunable.tunable_op", "TunableOp._add_runner"), ("tunekit.backends.nvrtc", "compile_cubin"),
         ("tunekit.backends.nvrtc", "nvrtc_release"), ("tunekit.backends.nvrtc", "headers_digest"),
         ("tunekit.backends.nvrtc", "include_dirs"), ("tunekit.backends.nvrtc", "_usable_cache"),
         ("tunekit.backends.nvrtc", "source"), ("tunekit.backends.kernel_units", "unit_identity"),
         ("tunekit.backends.cuda", "_prepare"), ("tunekit.backends.thread_context", "bind"),
         ("tunekit.backends.shipped_kernels", "_open"), ("tunekit.backends.shipped_kernels", "_read"),
         ("tunekit.backends.cuda", "arch_of"), ("tunekit.backends.cuda", "libcuda"),
         ("tunekit.backends.cuda", "compile_cubin"), ("tunekit.backends.cuda", "source"),
         ("tunekit.backends.nvrtc", "shipped_cubin"), ("tunekit.backends.nvrtc", "cubin_name")]
SPANS: list[tuple[float, float, str, str]] = []


def _wrap(module_name: str, path: str) -> None:
    module = importlib.import_module(module_name)
    owner, _, attr = path.rpartition(".")
    target = getattr(module, owner) if owner else module
    fn = getattr(target, attr, None)
    if fn is None:
        print(f"(no {module_name}.{path})")
        return

    @functools.wraps(fn)
    def spanned(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS.append((start, time.perf_counter(), threading.current_thread().name, path))
    setattr(target, attr, spanned)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--call", action="append", default=None)
    args = ap.parse_args()
    for module_name, path in STEPS:
        _wrap(module_name, path)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"# first-call timelines, {torch.cuda.get_device_name()}, torch {torch.__version__}; import tunekit "
          f"{IMPORT_MS:.0f} ms; spans of 0.3 ms or more, ms from the call's start")
    for label in args.call or CALLS:
        fn, x, _ = make_call(label)
        SPANS.clear()
        start = time.perf_counter()
        first = timed(fn, x)
        time.sleep(0.2)  # the workers' spans after the call, too
        second = timed(fn, x)
        print(f"## {label}: first call {first:.1f} ms, second {second:.2f} ms")
        for s, e, thread, name in sorted(SPANS):
            if (e - s) * 1e3 >= 0.3:
                print(f"  {(s - start) * 1e3:7.1f} -> {(e - start) * 1e3:7.1f}  {(e - s) * 1e3:6.1f}  {thread[:28]:28s} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
