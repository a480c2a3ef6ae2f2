"""Answers: in a fresh process, what does a user get from a shipped quack choice (the H100's fused
``linear_act(x, w, b, "gelu_tanh")`` at 4096 x 14336 x 4096 bfloat16) on the first calls: with
quack-kernels installed and no kernel built yet (a child process builds it, the entry's next fastest
candidate meanwhile; before 2026-11-27 morning quack was imported and compiled in this process), and without quack-kernels (the choice cannot be prepared:
the next fastest runnable candidate for good)? Every call's wall time and the candidate its decision
names, for ``--seconds`` of calls. ``--stored``: the same entry as the user's own stored result (a fresh
results file, shipped results off), as after ``tunekit tune``: since 47e6eed a stored quack choice whose kernel is
not built is prepared on a worker as a shipped one is, instead of building inside the first call.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/quack_first_use.py [--seconds S] [--stored]``; run with
``TUNEKIT_CACHE`` set to an empty folder for a cold first use (no kernel built yet).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import warnings

import torch

import tunekit
from tunekit.backends import quack
from tunekit.ops.gemm import AddmmParams, addmm_op
from tunekit.tunable import shipped, validators
from tunekit.tunable.results import ResultsStore


def stored_settings(params: AddmmParams):
    """Settings whose results file holds the shipped entry for ``params`` as the user's own, shipped results off."""
    device = torch.device("cuda", torch.cuda.current_device())
    current = {**validators.environment(device), **validators.candidate_hashes(addmm_op.candidates)}
    entry = shipped.shipped_entry(addmm_op.name, params.signature(), torch.cuda.get_device_name(), current)
    assert entry is not None, "no valid shipped entry to store"
    path = os.path.join(tempfile.mkdtemp(), "results.sqlite")
    ResultsStore(path).put(entry)
    print("stored entry:", entry.choice)
    return tunekit.tuning(results=path, use_shipped=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--stored", action="store_true")
    args = ap.parse_args()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(14336, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    params = AddmmParams(b, x, w.t(), activation="gelu_tanh")
    print(torch.cuda.get_device_name(), "quack installed:", quack.version())
    start, rows, last = time.perf_counter(), [], None
    settings = stored_settings(params) if args.stored else contextlib.nullcontext()
    with settings, warnings.catch_warnings(record=True) as caught:
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
        final = addmm_op.decision(params)  # under the loop's settings
    walls = sorted(r[1] for r in rows)
    print(f"{len(rows)} calls; first {rows[0][1]:.1f} ms, max {walls[-1]:.1f} ms, median {walls[len(walls) // 2]:.2f} ms")
    print("final:", None if final is None else (final.candidate.name, final.why))
    for w_ in caught:
        print("warning:", str(w_.message)[:300])


if __name__ == "__main__":
    main()
