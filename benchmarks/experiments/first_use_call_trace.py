"""Answers: what makes a call that resumes a signature's tuning take longer than its step
(tuning_step_ms, 20 ms)? Each call of a fresh signature is timed (synchronized), with the session's
steps inside it (checks, probes, measurement set-up, rounds, the store write). GPU only.

    PYTHONPATH=src python benchmarks/experiments/first_use_call_trace.py [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import tunekit
from tunekit.tunable import session as session_module
from tunekit.tunable import tunable_op as tunable_op_module

EVENTS: list[tuple[str, str, float]] = []


def _timed(kind, fn, name_of=lambda a: ""):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((kind, name_of(args), (time.perf_counter() - t0) * 1e3))
    return wrapper


def _timed_steps(kind, steps_fn):
    """``_timed`` for a generator function (the session's pieces): each piece's time, as the call that ran it saw."""
    def wrapper(*args, **kwargs):
        steps = steps_fn(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(steps)
            except StopIteration as done:
                EVENTS.append((kind, "", (time.perf_counter() - t0) * 1e3))
                return done.value
            EVENTS.append((kind, "", (time.perf_counter() - t0) * 1e3))
            yield item
    return wrapper


def instrument() -> None:
    S = session_module.TuningSession
    session_module.check = _timed("check", session_module.check, lambda a: a[0].name)
    S._measure = _timed("probe", S._measure, lambda a: a[1].name)
    S._prepared = _timed("graph set-up", S._prepared, lambda a: a[1].name)
    S._screen_support = _timed("screen", S._screen_support)
    S._wait = _timed("wait (for preparation)", S._wait)
    S._decide = _timed_steps("decide", S._decide)
    session_module.reference = _timed("reference", session_module.reference)
    session_module.input_sets = _timed("input sets", session_module.input_sets)
    session_module.host_time_steps = _timed_steps("host-time tie", session_module.host_time_steps)
    tunable_op_module.TunableOp._store = _timed("store entry", tunable_op_module.TunableOp._store)


def trace(name, fn, calls: int, lines: list[str]) -> None:
    lines += [f"## {name}", "", "| call | ms | steps inside (ms) |", "|---:|---:|---|"]
    for i in range(calls):
        EVENTS.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        inside = ", ".join(f"{k}{' ' + n if n else ''} {v:.1f}" for k, n, v in EVENTS)
        lines.append(f"| {i + 1} | {ms:.1f} | {inside} |")
    lines.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--first", action="store_true",
                    help="no silu call before the traced one, shipped results off: the process's first signature")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cold-"))
    instrument()
    lines = [f"# First-use call trace: {torch.cuda.get_device_name()}", "",
             "Default settings, a fresh results file, empty Triton cache (NVRTC cubins: the default cache).", ""]
    x = torch.randn(4096, 4096, device="cuda", dtype=getattr(torch, args.dtype))
    with tunekit.tuning(results=os.path.join(tempfile.mkdtemp(), "r.sqlite"), use_shipped=not args.first):
        if not args.first:
            tunekit.silu(torch.randn(1000, device="cuda"))  # context, first allocations
        trace(f"silu {args.dtype} 4096x4096", lambda: tunekit.silu(x), args.calls, lines)
        trace(f"logsumexp {args.dtype} 4096x4096 dim -1", lambda: tunekit.logsumexp(x, -1), args.calls, lines)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
