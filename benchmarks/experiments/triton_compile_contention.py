"""Answers: while Triton GEMM candidates compile in the background (a tuning session's preparations),
how much slower are the program's own calls, with the compiles on worker threads vs in worker
processes (TUNEKIT_TRITON_SUBPROCESS)? And how long do the compiles take in each mode?

One process per mode, each with a fresh Triton cache. The program: a loop of small eager CUDA ops
(x + 1 on 4096 floats, then tunekit.silu of it, decided beforehand), each iteration timed on the host.
First a quiet second (nothing compiling), then the same loop while every Triton candidate that
supports the problem is prepared on tunekit's preparation pool, as a session does.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/triton_compile_contention.py [M N K]``
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(m: int, n: int, k: int) -> dict:
    import torch
    import tunekit
    from tunekit.backends import triton_compile
    from tunekit.ops.gemm import GemmParams
    from tunekit.ops.gemm.triton_candidates import triton_candidates
    from tunekit.tunable.preparations import preparer

    x = torch.randn(4096, device="cuda")
    tunekit.silu(x)
    with tunekit.tuning(tuning_step_ms=float("inf")):
        tunekit.silu(x)  # decided: later calls are the cached path
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    p = GemmParams(a, b)
    chosen = [c for c in triton_candidates() if c.supports(p) is None]

    def loop(until) -> list[float]:
        walls = []
        while not until():
            t0 = time.perf_counter()
            tunekit.silu(x + 1)
            walls.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return walls

    quiet_end = time.perf_counter() + 1.0
    quiet = loop(lambda: time.perf_counter() > quiet_end)
    start = time.perf_counter()
    futures = [preparer().submit(c.prepare, p) for c in chosen]
    busy = loop(lambda: all(f.done() for f in futures))
    compile_s = time.perf_counter() - start
    errors = [repr(f.exception())[:120] for f in futures if f.exception() is not None]

    def summary(walls):
        walls = sorted(walls)
        return {"iterations": len(walls), "median_us": statistics.median(walls) * 1e6,
                "p99_us": walls[int(0.99 * (len(walls) - 1))] * 1e6, "max_ms": walls[-1] * 1e3,
                "per_s": len(walls) / sum(walls)}

    return {"candidates": len(chosen), "compile_s": compile_s, "quiet": summary(quiet), "busy": summary(busy),
            "errors": errors, "stats": dict(triton_compile.stats), "rebuilt": triton_compile.rebuilt}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(*(int(v) for v in sys.argv[2:5]))))
        return
    m, n, k = (sys.argv[1:4] if len(sys.argv) > 3 else ["4097", "4095", "4096"])
    for mode in ("0", "1"):
        cache = tempfile.mkdtemp()
        env = dict(os.environ, TUNEKIT_TRITON_SUBPROCESS=mode, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                   TUNEKIT_RESULTS=":memory:", TUNEKIT_USE_SHIPPED="0")
        done = subprocess.run([sys.executable, __file__, "--child", m, n, k], env=env, capture_output=True,
                              text=True, timeout=500)
        if done.returncode != 0:
            print(f"mode {mode}: failed\n{done.stderr[-3000:]}")
            continue
        r = json.loads(done.stdout.splitlines()[-1])
        label = "worker processes" if mode == "1" else "worker threads"
        print(f"{m}x{n}x{k}, compiles on {label}: {r['candidates']} candidates compiled in {r['compile_s']:.2f} s; "
              f"stats {r['stats']} {r['rebuilt']}; errors {r['errors']}")
        for name in ("quiet", "busy"):
            s = r[name]
            print(f"  {name:5s}: {s['iterations']:7d} calls, {s['per_s']:9.0f}/s, median {s['median_us']:7.1f} us, "
                  f"p99 {s['p99_us']:8.1f} us, max {s['max_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
