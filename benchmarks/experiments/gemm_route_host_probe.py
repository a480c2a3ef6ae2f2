"""Where does a routed GEMM call's host time go? (``gemm_host_time`` on the H200 host read 4.5x torch's
for routed calls where the 2-core development host read 1.02-1.08x.)

Times each piece of ``tunekit.linear(x, w)`` / ``tunekit.mm(x, w)`` on 64x64 float32 operands after
warm-up: torch's Python function, the C++ route alone (``routes.linear(x, w)``), its key alone, and
the public function; reports the decisions, routed keys and live threads.
Run: ``PYTHONPATH=src python benchmarks/experiments/gemm_route_host_probe.py [--device cuda]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.bench.measure import host_us_per_call  # noqa: E402
from tunekit.ops.gemm import routes  # noqa: E402
from tunekit.ops.gemm.op import mm_op  # noqa: E402
from tunekit.ops.gemm.params import GemmParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--all-cases", action="store_true", help="first warm up every gemm_host_time case (bmm, matmul, ...)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print("routes ready:", routes.ready())
    x, w = (torch.randn(64, 64, device=device, dtype=dtype) for _ in range(2))
    if args.all_cases:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
        from gemm_host_time import cases
        for name, _, ours in cases(device, dtype):
            with torch.set_grad_enabled("backward" in name):
                t0 = time.perf_counter()
                for _ in range(300):
                    ours()
                print(f"warm-up {name}: {time.perf_counter() - t0:.3f} s")
    with torch.no_grad():
        t0 = time.perf_counter()
        for i in range(400):
            tunekit.linear(x, w)
            tunekit.mm(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"400 warm-up call pairs: {time.perf_counter() - t0:.3f} s")
        for p in (GemmParams(x, w.t()), GemmParams(x, w)):
            r = mm_op.decision(p)
            entry = getattr(r, "entry", None)
            print(p.signature(), "->", r and r.candidate.name, r and r.why, "complete:", entry and entry.complete)
        print("routed keys:", list(routes.routed_keys().values()))
        print("route hit linear:", routes.linear(x, w, None) is not None, " mm:", routes.mm(x, w) is not None)
        print("threads:", [t.name for t in threading.enumerate()])
        fns = {"F.linear": lambda: F.linear(x, w), "route linear": lambda: routes.linear(x, w, None),
               "key linear": lambda: routes.linear.key(x, w, None), "tunekit.linear": lambda: tunekit.linear(x, w),
               "torch.mm": lambda: torch.mm(x, w), "route mm": lambda: routes.mm(x, w),
               "tunekit.mm": lambda: tunekit.mm(x, w), "x.t() (a trivial op)": lambda: x.t()}
        for k, v in host_us_per_call(fns, device, repeats=9).items():
            print(f"{k:24s} {v:8.2f} us")
        torch.cuda.synchronize() if device.type == "cuda" else None
        print("threads after:", [t.name for t in threading.enumerate()])


if __name__ == "__main__":
    main()
