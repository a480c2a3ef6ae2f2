"""Answers: where does a GEMM signature's first-use tuning budget (max_tuning_ms) go, with the
compile caches empty? Each check and probe of the session is timed as the budget counts it, in
order, with the time since the first call (so compile waits show as gaps), then the stored entry's
record of every candidate. GPU only.

    PYTHONPATH=src python benchmarks/experiments/gemm_first_use_budget.py [MxNxK ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

import tunekit
from tunekit.ops.gemm import GemmParams, mm_op
from tunekit.tunable import session as session_module
from tunekit.tunable.stores import results_store

EVENTS: list[tuple[float, str, str, float]] = []  # (seconds since start, what, candidate, ms)
START = [0.0]


def _timed(kind, fn, name_of):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.synchronize()
            EVENTS.append((t0 - START[0], kind, name_of(args), (time.perf_counter() - t0) * 1e3))
    return wrapper


def instrument() -> None:
    session_module.check = _timed("check", session_module.check, lambda a: a[0].name)
    session_module.TuningSession._measure = _timed("probe", session_module.TuningSession._measure, lambda a: a[1].name)
    session_module.TuningSession._screen_support = _timed("screen (not budgeted)", session_module.TuningSession._screen_support,
                                                          lambda a: "all")
    session_module.reference = _timed("reference", session_module.reference, lambda a: a[0].name)
    session_module.input_sets = _timed("input sets", session_module.input_sets, lambda a: "")
    for c in mm_op.candidates:  # background work, on the preparing threads
        if hasattr(c, "prepare"):
            c.prepare = _timed("prepare (background)", c.prepare, lambda a, name=c.name: name)


def first_use(M: int, N: int, K: int, limit_s: float, lines: list[str]) -> None:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    p = GemmParams(a, b)
    store = os.path.join(tempfile.mkdtemp(), "first.sqlite")
    EVENTS.clear()
    START[0] = time.perf_counter()
    calls = 0
    with tunekit.tuning(results=store) as s:
        while mm_op.decision(p, s) is None and time.perf_counter() - START[0] < limit_s:
            tunekit.mm(a, b)
            calls += 1
        torch.cuda.synchronize()
        r = mm_op.decision(p, s)
        entry = results_store().get("mm", p.signature(), torch.cuda.get_device_name())
    lines += [f"## {M}x{N}x{K} bf16: {calls} calls, {time.perf_counter() - START[0]:.2f} s, "
              f"choice {r.candidate.name if r else None}: {r.why if r else 'undecided'}", "",
              "| at s | step | candidate | ms |", "|---:|---|---|---:|"]
    lines += [f"| {t:.3f} | {kind} | {name} | {ms:.2f} |" for t, kind, name, ms in EVENTS]
    spent = sum(ms for _, kind, _, ms in EVENTS if "(" not in kind)  # what the budget counts
    lines += ["", f"budgeted steps listed: {spent:.0f} ms (entry's tuning_ms {entry.tuning_ms if entry else None})", ""]
    if entry:
        lines += [f"- {name}: {rec.status} {'' if rec.time_ms is None else f'{rec.time_ms:.4g} ms'} {rec.reason or ''}"
                  for name, rec in entry.candidates.items()]
    lines.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=["4097x4095x4096", "777x1555x333"])
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cold-"))
    instrument()
    lines = [f"# GEMM first-use budget: {torch.cuda.get_device_name()}", ""]
    for text in args.shapes:
        first_use(*map(int, text.split("x")), args.limit, lines)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
