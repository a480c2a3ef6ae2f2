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

#: the signatures profiled when none is named: "<op> <fwd|bwd> <rows>x<cols>[:dim] <dtype>"
CALLS = ["silu fwd 4096x4096 float32", "gelu fwd 4096x4096 float16", "logsumexp fwd 4096x4096:-1 float16",
         "logsumexp fwd 32768x64:-1 float32"]


def make_call(label: str):
    """(fn, x) for a label: the public function as the first-use suite calls it (a backward directly,
    not through autograd); fresh random inputs."""
    op, direction, shape, dtype_name = label.split()
    rows, _, dim_text = shape.partition(":")
    dim = int(dim_text or -1)
    x = torch.randn(tuple(int(v) for v in rows.split("x")), device="cuda", dtype=getattr(torch, dtype_name))
    if op == "logsumexp" and direction == "bwd":
        lse = torch.logsumexp(x.float(), dim).to(x.dtype)
        dy = torch.randn_like(lse)
        from tunekit.ops.logsumexp import logsumexp_backward_op
        from tunekit.ops.logsumexp.params import LogsumexpBackwardParams

        def decided():
            r = logsumexp_backward_op.decision(LogsumexpBackwardParams(dy, x, lse, (dim % x.dim(),), False))
            return "undecided" if r is None else f"runs {r.candidate.name}: {r.why}"
        return (lambda t: tunekit.logsumexp_backward(dy, t, lse, dim)), x, decided
    if op == "logsumexp":
        return (lambda t: tunekit.logsumexp(t, dim)), x, lambda: tunekit.explain("logsumexp", x, dim)
    if direction == "bwd":  # silu_backward(dy, x) / gelu_backward(dy, x)
        dy, grad = torch.randn_like(x), getattr(tunekit, f"{op}_backward")
        return (lambda t: grad(dy, t)), x, lambda: tunekit.explain(f"{op}_backward", dy, x)
    fn = getattr(tunekit, op)
    return (lambda t: fn(t)), x, lambda: tunekit.explain(op, x)


def timed(fn, x) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _torch_twin(label: str):
    """torch's own function for a label's op (its first call pays torch's lazy kernel loading)."""
    op, direction, shape, _ = label.split()
    dim = int(shape.partition(":")[2] or -1)
    if op == "logsumexp":
        return (lambda t: torch.logsumexp(t, dim)) if direction == "fwd" else \
            (lambda t: t.sub(torch.logsumexp(t, dim, keepdim=True)).exp_())
    return getattr(torch.nn.functional, op)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    ap.add_argument("--call", action="append", default=None, help="a signature to profile (repeatable), e.g. "
                    "'logsumexp bwd 32768x64:-1 float32'; default: %s" % CALLS)
    ap.add_argument("--torch-first", action="store_true",
                    help="also time torch's own first call of each signature's op, before tunekit's")
    args = ap.parse_args()
    out = io.StringIO()
    torch.ones(1, device="cuda").add_(1).cpu()  # the context every GPU program has
    out.write(f"# first calls, {torch.cuda.get_device_name()}\n\nimport tunekit: {IMPORT_S * 1e3:.0f} ms\n\n")
    for label in args.call or CALLS:
        fn, x, decided_text = make_call(label)
        if args.torch_first:
            out.write(f"torch's own first call ({label}): {timed(_torch_twin(label), x):.1f} ms\n\n")
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        first = timed(fn, x)
        prof.disable()
        second = timed(fn, x)
        try:
            decided = decided_text()
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
