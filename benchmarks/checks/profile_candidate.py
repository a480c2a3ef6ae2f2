"""Run chosen candidates of an op a few times each, for a profiler (``ncu``) to capture.

Run: ``ncu --kernel-name regex:NAME [sections] python benchmarks/checks/profile_candidate.py OP SHAPE DTYPE
CANDIDATE [ARG=VALUE ...]``, e.g. ``logsumexp 64x1048576 float16 logsumexp_block_split_f16_vec
dim=-1``. Inputs are fresh N(0, 9) values; every run writes a fresh output. Not a timing script
(``tunekit explore`` and the benchmarks time); it only gives a profiler the launches to look at.
"""

import argparse
import ast
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunekit.tunable.registry import get_op  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op")
    ap.add_argument("shape", help="e.g. 64x1048576")
    ap.add_argument("dtype", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("candidate")
    ap.add_argument("arguments", nargs="*", help="op arguments as NAME=VALUE (Python literals)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    op = get_op(args.op)
    kwargs = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in args.arguments)}
    shape = tuple(int(s) for s in args.shape.split("x"))
    params = op.make_example(shape, getattr(torch, args.dtype), torch.device("cuda"), **kwargs)
    by_name = {c.name: c for c in op.candidates}
    if args.candidate not in by_name:
        raise SystemExit(f"{args.candidate!r} is not a candidate of {op.name}: {', '.join(sorted(by_name))}")
    candidate = by_name[args.candidate]
    why = candidate.supports(params)
    if why:
        raise SystemExit(f"{args.candidate} does not support these inputs: {why}")
    for _ in range(args.runs):
        candidate.run(params)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
