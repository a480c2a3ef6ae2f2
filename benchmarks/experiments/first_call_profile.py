"""Answers: where does a process's first tunekit call go, when its choice needs no compile (a shipped
or stored torch kernel) or loads a shipped build? One fresh process per run: the CUDA context made
and a torch kernel run first (as every GPU program has), then each listed signature's first call
timed (synchronized) and profiled (cProfile, the calling thread), then its second call. GPU only.

    PYTHONPATH=src python benchmarks/experiments/first_call_profile.py [--top 25] [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

T0 = time.perf_counter()
import tunekit  # noqa: E402

IMPORT_S = time.perf_counter() - T0

CALLS = [
    ("silu fwd 4096x4096 float32", lambda x: tunekit.silu(x), torch.float32),
    ("gelu fwd 4096x4096 float16", lambda x: tunekit.gelu(x), torch.float16),
    ("logsumexp fwd 4096x4096:-1 float16", lambda x: tunekit.logsumexp(x, -1), torch.float16),
    ("logsumexp fwd 32768x64:-1 float32", lambda x: tunekit.logsumexp(x, -1), torch.float32),
]


def timed(fn, x) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = io.StringIO()
    torch.ones(1, device="cuda").add_(1).cpu()  # the context every GPU program has
    out.write(f"# first calls, {torch.cuda.get_device_name()}\n\nimport tunekit: {IMPORT_S * 1e3:.0f} ms\n\n")
    for label, fn, dtype in CALLS:
        rows, _, dim = label.split()[2].partition(":")
        shape = tuple(int(v) for v in rows.split("x"))
        x = torch.randn(shape, device="cuda", dtype=dtype)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        first = timed(fn, x)
        prof.disable()
        second = timed(fn, x)
        op = label.split()[0]
        try:
            decided = tunekit.explain(op, x, -1) if op == "logsumexp" else tunekit.explain(op, x)
        except Exception as exc:  # noqa: BLE001 - the profile is the answer; the explanation a help
            decided = f"(explain failed: {exc!r})"
        out.write(f"## {label}: first call {first:.1f} ms, second {second:.2f} ms\n\n{decided}\n\n```\n")
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(args.top)
        out.write(text.getvalue().split("\n", 4)[-1] + "```\n\n")
    sys.stdout.write(out.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            f.write(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
