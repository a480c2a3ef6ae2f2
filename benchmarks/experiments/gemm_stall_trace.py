"""Answers: when a GEMM signature with no shipped entry is tuned online (fresh results file, shipped results off),
which calls after the first take longer than the 20 ms step, and what is the calling thread doing in them?
quack_first_use-without-no_entry-* saw one 367 ms call while tuning linear + bias + gelu tanh at 4096x14336x4096.
Each call is timed (synchronized); the session's steps inside it are listed (first_use_call_trace.instrument),
and a watchdog samples the calling thread's Python stack every 2 ms once a call passes 20 ms. Until 2026-11-27
~09:05 a sample read the stack with traceback.extract_stack: ~7 ms under the GIL each, which lengthened every call
over 20 ms (the -before-, -after- and -screen_off_thread- results carry that); now a sample walks the frames.

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

import torch

import tunekit
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op

sys.path.insert(0, os.path.dirname(__file__))
from first_use_call_trace import EVENTS, instrument  # noqa: E402

SAMPLES: collections.Counter = collections.Counter()
TOTALS: collections.Counter = collections.Counter()  # ms of each kind of session step, over every call
COUNTS: collections.Counter = collections.Counter()
IN_CALL = {"since": None}
GC_PAUSES: list[float] = []


def _watchdog(main_id: int) -> None:
    while True:
        time.sleep(0.002)
        since = IN_CALL["since"]
        if since is None or time.perf_counter() - since < 0.02:
            continue
        frame, names = sys._current_frames().get(main_id), []
        while frame is not None and len(names) < 7:  # no source lines read: a sample costs microseconds, not the
            code = frame.f_code                      # ~7 ms of traceback.extract_stack, held under the GIL
            names.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        if names:
            SAMPLES[" < ".join(names)] += 1


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
            for kind, _, step_ms in EVENTS:
                TOTALS[kind] += step_ms
                COUNTS[kind] += 1
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
    print("session steps over all calls (ms, count):", ", ".join(f"{k} {v:.1f} ({COUNTS[k]})" for k, v in TOTALS.most_common()))
    if final is not None and final.entry is not None:
        for name, record in final.entry.candidates.items():
            if record.status != "unsupported":
                time_ms = f"{record.time_ms * 1e3:.1f} us" if record.time_ms else "-"
                print(f"    {name:48s} {record.status:10s} {time_ms:>10s}  {(record.reason or '')[:90]}")
    if profiler is not None:
        print("\nthe first call under cProfile (its times include the profiler's overhead):")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
