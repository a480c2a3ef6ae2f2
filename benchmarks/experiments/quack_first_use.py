"""Answers: in a fresh process, what does a user get from a shipped quack choice (the H100's fused
``linear_act(x, w, b, "gelu_tanh")`` at 4096 x 14336 x 4096 bfloat16) on the first calls: with
quack-kernels installed and no kernel built yet (a child process builds it, the entry's next fastest
candidate meanwhile; before 2026-11-27 morning quack was imported and compiled in this process), and without quack-kernels (the choice cannot be prepared:
the next fastest runnable candidate for good)? Every call's wall time and the candidate its decision
names, for ``--seconds`` of calls.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/quack_first_use.py [--seconds S]``; run with
``TUNEKIT_CACHE`` set to an empty folder for a cold first use (no kernel built yet).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import tunekit
from tunekit.backends import quack
from tunekit.ops.gemm import AddmmParams, addmm_op


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(14336, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    params = AddmmParams(b, x, w.t(), activation="gelu_tanh")
    print(torch.cuda.get_device_name(), "quack installed:", quack.version())
    start, rows, last = time.perf_counter(), [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            tunekit.linear_act(x, w, b, "gelu_tanh")
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
            decision = addmm_op.decision(params)
            name = decision.candidate.name if decision is not None else \
                f"(pending: {addmm_op.in_effect(params)[0].name} runs meanwhile)"
            rows.append((time.perf_counter() - start, wall, name))
            if name != last:
                print(f"t={rows[-1][0]:7.3f} s  call {len(rows):5d}  {wall:8.2f} ms  {name}")
                last = name
    walls = sorted(r[1] for r in rows)
    print(f"{len(rows)} calls; first {rows[0][1]:.1f} ms, max {walls[-1]:.1f} ms, median {walls[len(walls) // 2]:.2f} ms")
    final = addmm_op.decision(params)
    print("final:", None if final is None else (final.candidate.name, final.why))
    for w_ in caught:
        print("warning:", str(w_.message)[:300])


if __name__ == "__main__":
    main()
