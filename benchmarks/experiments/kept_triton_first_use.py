"""Answers: with Triton kernels kept and shipped as cubins with their launch recipes
(``backends/triton_static.py``), when is a process's first Triton choice in effect, is Triton imported
at all, and what does a cached call cost the host, against the same with TUNEKIT_TRITON_STATIC=0
(Triton's import, start and Python launcher, as before)?

GPU only. ``PYTHONPATH=src python benchmarks/experiments/kept_triton_first_use.py [--calls N]``: for each
signature below whose shipped choice (this GPU's file) is a Triton kernel, a fresh process per mode:
kept launches on / off, each with empty caches then warm ones (the same folders again). Per process:
the first call's wall, the call (and ms after the first call's start) from which the shipped choice
is in effect, whether Triton was imported by the end, and the wall per call of 500 back-to-back
calls once decided, the median of 7 such batches (host-bound at these sizes: the host time of a
cached call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = {"lse_f32_32768x64": ((32768, 64), "float32"), "lse_bf16_8192x1024": ((8192, 1024), "bfloat16"),
         "lse_f32_8192x1024": ((8192, 1024), "float32")}


def child(case: str, calls: int) -> dict:
    import torch

    shape, dtype = CASES[case]
    t_start = time.perf_counter()
    import tunekit
    from tunekit.tunable.registry import get_op
    x = torch.randn(*shape, device="cuda", dtype=getattr(torch, dtype))
    torch.logsumexp(x, -1)  # torch's own kernel loaded: not part of what is measured
    torch.cuda.synchronize()
    op = get_op("logsumexp")
    params = op.make_params(x, -1)
    first_wall, in_effect_call, in_effect_ms, name = None, None, None, "-"
    t0 = time.perf_counter()
    for i in range(calls):
        start = time.perf_counter()
        tunekit.logsumexp(x, -1)
        torch.cuda.synchronize()
        if i == 0:
            first_wall = (time.perf_counter() - start) * 1e3
        decision = op.decision(params)
        if decision is not None and in_effect_call is None:
            in_effect_call, in_effect_ms, name = i + 1, (time.perf_counter() - t0) * 1e3, decision.candidate.name
            break  # the next call runs it
        time.sleep(0.002)
    for _ in range(200):
        tunekit.logsumexp(x, -1)
    torch.cuda.synchronize()
    batches = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(500):
            tunekit.logsumexp(x, -1)
        torch.cuda.synchronize()
        batches.append((time.perf_counter() - t) / 500 * 1e6)
    per_call_us = sorted(batches)[3]
    return {"first_call_ms": first_wall, "choice_from_call": in_effect_call, "choice_after_ms": in_effect_ms,
            "choice": name, "triton_imported": "triton" in sys.modules, "cached_call_us": per_call_us,
            "process_s": time.perf_counter() - t_start}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return
    print("case | kept launches | cache | first call ms | choice from call | after ms | choice | Triton imported "
          "| cached call us")
    for case in CASES:
        for static in ("1", "0"):
            root = tempfile.mkdtemp(prefix="kept-triton-")
            for cache in ("empty", "warm"):
                env = {**os.environ, "TUNEKIT_CACHE": os.path.join(root, "tunekit"),
                       "TRITON_CACHE_DIR": os.path.join(root, "triton"), "TUNEKIT_TRITON_STATIC": static}
                out = subprocess.run([sys.executable, __file__, "--child", case, "--calls", str(args.calls)], env=env,
                                     capture_output=True, text=True)
                if out.returncode:
                    print(f"{case} | {static} | {cache} | failed: {out.stderr[-500:]}")
                    continue
                r = json.loads(out.stdout.splitlines()[-1])
                after = "-" if r["choice_after_ms"] is None else f"{r['choice_after_ms']:.1f}"
                print(f"{case} | {'on' if static == '1' else 'off'} | {cache} | {r['first_call_ms']:.1f} | "
                      f"{r['choice_from_call']} | {after} | {r['choice']} | {r['triton_imported']} | "
                      f"{r['cached_call_us']:.1f}", flush=True)


if __name__ == "__main__":
    main()
