"""Where does a patched model step's extra time go? (model_step with GEMM patched ran 0.91x torch's on
the H200 with every GEMM routed to torch's function.)

Builds model_step's pair of models, runs patched steps until nothing is tuning, then per variant:
host time of a step (launches only) and its whole time (after a synchronize), interleaved, and a
cProfile of a few steps (top functions by own time). Run: ``PYTHONPATH=src python
benchmarks/experiments/model_step_host_profile.py [--model gpt2] [--patch-ops silu,gelu,gemm]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import model_step as ms  # noqa: E402
import tunekit  # noqa: E402


def thread_cpu() -> dict:
    """CPU seconds per thread of this process, by Python thread name where known (/proc, Linux)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid)) or open(f"/proc/self/task/{tid}/comm").read().strip()
        out[f"{name}[{tid}]"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def per_variant_counts(one, variants, steps=30) -> None:
    """Per variant: CPU seconds each thread spent and GC collections, over ``steps`` steps."""
    collections = []
    gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
    for v in variants:
        collections.clear()
        before = thread_cpu()
        for _ in range(steps):
            one(v)
        torch.cuda.synchronize()
        after = thread_cpu()
        busy = {k: round(after[k] - before.get(k, 0.0), 3) for k in after if after[k] - before.get(k, 0.0) > 0.005}
        print(f"{v:8s} {steps} steps: thread CPU s {busy}; gc collections by generation "
              f"{[collections.count(g) for g in range(3)]}")
    gc.callbacks.pop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--patch-ops", default="silu,gelu,gemm")
    args = ap.parse_args()
    import transformers
    device, dtype, cfg = torch.device("cuda"), torch.bfloat16, dict(ms.FULL)
    ops = args.patch_ops.split(",")
    plain, patched = ms.model_pair(args.model, cfg, transformers, device, dtype, ops)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    models = {"torch": plain, "patched": patched}

    def one(v):
        models[v].zero_grad(set_to_none=True)
        if v == "torch":
            return ms.step(models[v], ids)
        with tunekit.patch(ops):
            return ms.step(models[v], ids)
    t0 = time.perf_counter()
    for i in range(300):
        marks = ms.session_calls()
        one("patched")
        one("torch")
        if i >= 3 and not ms.tuning_since(marks):
            break
    torch.cuda.synchronize()
    print(f"tuned after {i + 1} step pairs, {time.perf_counter() - t0:.1f} s; threads:",
          [t.name for t in threading.enumerate()])
    host, whole = {v: [] for v in models}, {v: [] for v in models}
    for _ in range(15):
        for v in models:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            one(v)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host[v].append((t1 - t0) * 1e3)
            whole[v].append((time.perf_counter() - t0) * 1e3)
    for v in models:
        print(f"{v:8s} host {statistics.median(host[v]):7.2f} ms   whole {statistics.median(whole[v]):7.2f} ms")
    per_variant_counts(one, list(models))
    gc.disable()
    host = {v: [] for v in models}
    for _ in range(15):
        for v in models:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            one(v)
            host[v].append((time.perf_counter() - t0) * 1e3)
    gc.enable()
    print("gc disabled: " + ", ".join(f"{v} host {statistics.median(t):.2f} ms" for v, t in host.items()))
    for v in models:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            one(v)
        torch.cuda.synchronize()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(f"\n===== {v}: cProfile, 5 steps =====")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
