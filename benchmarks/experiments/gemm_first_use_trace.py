"""Answers: on a GPU with no shipped entry for a GEMM signature (empty stores, use_shipped off), which
kernel does F.linear's first use reach, after how many calls and seconds? Per call: what runs, a line
whenever it changes or a call takes over 20 ms; at the end the stored entry's record of each candidate.
GPU only. ``PYTHONPATH=src python benchmarks/experiments/gemm_first_use_trace.py M N K [limit_s]``"""
import sys, time, tempfile, os
import torch
import tunekit
from tunekit.ops.gemm import GemmParams, mm_op

M, N, K = (int(v) for v in sys.argv[1:4])
limit = float(sys.argv[4]) if len(sys.argv) > 4 else 8.0
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
p = GemmParams(x, w.t())
store = os.path.join(tempfile.mkdtemp(), "r.sqlite")
start, last, calls = time.perf_counter(), None, 0
with tunekit.tuning(results=store, use_shipped=False) as s:
    while True:
        t0 = time.perf_counter()
        tunekit.linear(x, w)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        calls += 1
        runs, busy = mm_op.in_effect(p, s)
        if runs.name != last or dt > 0.02:
            print(f"call {calls:6d} t={time.perf_counter() - start:7.3f}s call {dt * 1e3:8.2f} ms  runs {runs.name}  tuning={busy}")
            last = runs.name
        r = mm_op.decision(p, s)
        if r is not None or time.perf_counter() - start > limit:
            break
print(f"{M}x{N}x{K}: {calls} calls, {time.perf_counter() - start:.2f} s, decision: {None if r is None else (r.candidate.name, r.why)}")
if r is not None and r.entry is not None:
    for name, rec in r.entry.candidates.items():
        print(f"  {name:50s} {rec.status:10s} {rec.time_ms if rec.time_ms is not None else float('nan'):9.4f} ms  {rec.reason}")
from tunekit.backends import triton_compile
print(f"Triton compiles in worker processes: {triton_compile.enabled()}, {triton_compile.stats}")
