"""Answers: when a GEMM signature with no shipped entry is tuned online (fresh results file, shipped results off),
which calls after the first take longer than the 20 ms step, and what is the calling thread doing in them?
quack_first_use-without-no_entry-* saw one 367 ms call while tuning linear + bias + gelu tanh at 4096x14336x4096.
Each call is timed (synchronized); the session's steps inside it are listed (first_use_call_trace.instrument),
and a watchdog samples the calling thread's Python stack every 2 ms once a call passes 20 ms.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/gemm_stall_trace.py M N K ACT [SECONDS] [--profile-first]``
(ACT: none for ``tunekit.linear``, else ``linear_act``'s activation, with a bias; ``--profile-first``: the first
call under cProfile, its 25 costliest functions by cumulative time printed after the trace).
"""

from __future__ import annotations

import collections
import cProfile
import gc
import pstats
import os
import sys
import tempfile
import threading
import time
import traceback

import torch

import tunekit
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op

sys.path.insert(0, os.path.dirname(__file__))
from first_use_call_trace import EVENTS, instrument  # noqa: E402

SAMPLES: collections.Counter = collections.Counter()
IN_CALL = {"since": None}
GC_PAUSES: list[float] = []


def _watchdog(main_id: int) -> None:
    while True:
        time.sleep(0.002)
        since = IN_CALL["since"]
        if since is None or time.perf_counter() - since < 0.02:
            continue
        frame = sys._current_frames().get(main_id)
        if frame is not None:
            stack = traceback.extract_stack(frame)[-7:]
            SAMPLES[" < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(stack))] += 1


def _gc_timer(phase, info, start=[0.0]):
    if phase == "start":
        start[0] = time.perf_counter()
    else:
        GC_PAUSES.append((time.perf_counter() - start[0]) * 1e3)


def main() -> None:
    profile_first = "--profile-first" in sys.argv
    argv = [a for a in sys.argv if a != "--profile-first"]
    M, N, K = (int(v) for v in argv[1:4])
    act = argv[4]
    seconds = float(argv[5]) if len(argv) > 5 else 8.0
    profiler = cProfile.Profile() if profile_first else None
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    if act == "none":
        op, params, call = mm_op, GemmParams(x, w.t()), lambda: tunekit.linear(x, w)
    else:
        op, params = addmm_op, AddmmParams(b, x, w.t(), activation=act)
        call = lambda: tunekit.linear_act(x, w, b, act)  # noqa: E731
    instrument()
    gc.callbacks.append(_gc_timer)
    threading.Thread(target=_watchdog, args=(threading.get_ident(),), daemon=True).start()
    store = os.path.join(tempfile.mkdtemp(), "r.sqlite")
    print(f"{torch.cuda.get_device_name()} {M}x{N}x{K} act={act}; shipped results off, fresh results file")
    start, calls, last, walls = time.perf_counter(), 0, None, []
    with tunekit.tuning(results=store, use_shipped=False) as s:
        while time.perf_counter() - start < seconds:
            EVENTS.clear()
            SAMPLES.clear()
            del GC_PAUSES[:]
            torch.cuda.synchronize()
            t0 = IN_CALL["since"] = time.perf_counter()
            if profiler is not None and calls == 0:
                profiler.runcall(call)
            else:
                call()
            torch.cuda.synchronize()
            IN_CALL["since"] = None
            ms = (time.perf_counter() - t0) * 1e3
            calls += 1
            walls.append(ms)
            runs, busy = op.in_effect(params, s)
            if runs.name != last or ms > 20:
                inside = ", ".join(f"{k}{' ' + n if n else ''} {v:.1f}" for k, n, v in EVENTS if v > 0.5)
                gcs = f"; gc pauses {[round(p, 1) for p in GC_PAUSES if p > 1]}" if any(p > 1 for p in GC_PAUSES) else ""
                print(f"call {calls:6d} t={time.perf_counter() - start:7.3f}s {ms:8.2f} ms runs {runs.name} "
                      f"tuning={busy}: {inside}{gcs}")
                for stack, n in SAMPLES.most_common(4):
                    print(f"      {n * 2:4d} ms  {stack}")
                last = runs.name
            if op.decision(params, s) is not None:
                break
        final = op.decision(params, s)
    later = sorted(walls[1:]) or [0.0]
    print(f"{calls} calls; first {walls[0]:.1f} ms; slowest later {later[-1]:.1f} ms; median {later[len(later) // 2]:.2f} ms")
    print("final:", None if final is None else (final.candidate.name, final.why))
    if profiler is not None:
        print("\nthe first call under cProfile (its times include the profiler's overhead):")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
