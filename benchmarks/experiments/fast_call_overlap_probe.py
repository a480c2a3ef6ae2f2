"""Answers: what does the fast-call extension's background load cost a process's first tunekit call, and which
way of loading it costs least? (Results: ``benchmarks/results/fast_call_overlap_probe-*``: loading it later, after
1000 calls, cost more in all than the load beside the first call; that design was not kept.)

A fresh process per run (default settings, shipped results, a fresh results file), its first call
``tunekit.silu(x)`` on a 4096x4096 float32 tensor, synchronized; then ``--calls`` - 1 more.
Variants, alternated run by run:

- ``torch``: ``F.silu(x)`` instead (torch's own first call: its lazy kernel load);
- ``default``: as shipped; ``off``: ``TUNEKIT_FAST_CALL=0`` (no extension: the bound);
- ``preload``: ``fast_call.load()`` on the calling thread just before the first call (its time is reported
  apart and added to the first call's: what loading it synchronously at the first call would cost);
- ``early``: ``fast_call.start_loading()`` right after ``import tunekit`` (the load overlaps the setup instead);
- ``switch``: ``sys.setswitchinterval(0.0005)`` (is the cost the interpreter lock's 5 ms hand-over?);
- ``old-<variant>``: ``<variant>`` run with ``--old-src`` first on the path (another checkout: a before/after).

Besides the first call: the sum of calls 2..``--calls`` (each synchronized), where a later load shows.

``warm``: one cache folder, built once before the runs (every extension built); ``empty``: a new cache folder per
run (the extension builds in the background; the child exits without waiting for it).

    PYTHONPATH=src python benchmarks/experiments/fast_call_overlap_probe.py [--runs 5] [--variants ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
variant, device = sys.argv[1], sys.argv[2]
calls = int(sys.argv[3])
if variant == "switch":
    sys.setswitchinterval(0.0005)
import torch
import torch.nn.functional as F
import tunekit
from tunekit.backends import fast_call
if variant == "early":
    fast_call.start_loading()
x = torch.randn(4096, 4096, device=device)
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
(torch.cuda.synchronize() if device == "cuda" else None)
load_ms = 0.0
if variant == "preload":
    t = time.perf_counter()
    fast_call.load()
    load_ms = (time.perf_counter() - t) * 1e3
fn = (lambda: F.silu(x)) if variant == "torch" else (lambda: tunekit.silu(x))
walls = []
for _ in range(calls):
    t = time.perf_counter()
    fn()
    (torch.cuda.synchronize() if device == "cuda" else None)
    walls.append((time.perf_counter() - t) * 1e3)
print("RESULT " + json.dumps({"load_ms": load_ms, "walls": walls, "loaded": fast_call.loaded() is not None}), flush=True)
if variant == "prebuild":
    fast_call.load()
    sys.exit(0)
os._exit(0)
"""


def run_child(variant: str, cache: Path, root: Path, device: str, calls: int, old_src: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEKIT_")}
    env.update(TUNEKIT_CACHE=str(cache), TRITON_CACHE_DIR=str(cache / "triton"),
               TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TUNEKIT_RESULTS=str(Path(tempfile.mkdtemp(dir=root)) / "results.sqlite"))
    if variant.startswith("old-"):
        variant = variant[4:]
        env["PYTHONPATH"] = os.pathsep.join([old_src, env.get("PYTHONPATH", "")])
    if variant == "off":
        env["TUNEKIT_FAST_CALL"] = "0"
    out = subprocess.run([sys.executable, "-c", CHILD, variant, device, str(calls)], env=env, capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{variant}: no result\n{out.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--variants", default="torch,default,off,preload,early,switch")
    ap.add_argument("--empty-variants", default="default,off")
    ap.add_argument("--device", default="cuda", help="cpu: only checks that it runs")
    ap.add_argument("--calls", type=int, default=50, help="calls per child (the first, then the rest summed)")
    ap.add_argument("--old-src", help="the src folder the old-<variant> runs import tunekit from")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tunekit-overlap-"))
    warm = root / "warm"
    t = time.perf_counter()
    run_child("prebuild", warm, root, args.device, args.calls)
    print(f"# prebuild (every extension built into the warm cache): {time.perf_counter() - t:.1f} s")
    rows: dict[str, list[dict]] = {}
    for i in range(args.runs):
        for state, variants in (("warm", args.variants), ("empty", args.empty_variants)):
            for variant in variants.split(","):
                cache = warm if state == "warm" else root / f"empty-{variant}-{i}"
                rows.setdefault(f"{state} {variant}", []).append(run_child(variant, cache, root, args.device, args.calls, args.old_src))
    print(f"{'state variant':16s} {'first call ms (each run)':44s} {'median':>7s} {f'calls 2-{args.calls} ms':>14s} loaded")
    for name, runs in rows.items():
        firsts = [r["walls"][0] + r["load_ms"] for r in runs]
        rest = [sum(r["walls"][1:]) for r in runs]
        print(f"{name:16s} {' '.join(f'{v:6.2f}' for v in firsts):44s} {statistics.median(firsts):7.2f} "
              f"{statistics.median(rest):14.2f} {sum(r['loaded'] for r in runs)}/{len(runs)}"
              + ("  (load " + " ".join(f"{r['load_ms']:.2f}" for r in runs) + ")" if any(r["load_ms"] for r in runs) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
