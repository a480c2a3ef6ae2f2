"""logsumexp over the issue's shapes: every candidate, the tuned choice, torch eager and torch.compile.

Method as ``benchmarks/activations.py`` (whose docstring says why): device time from CUDA-graph
replays (``tunekit.bench``), inputs rotated over enough copies to be cold in L2, medians of repeats,
the 1 GiB copy bandwidth measured in the same run; bytes = input read + output written.
Run: ``PYTHONPATH=src python benchmarks/logsumexp.py [--dtypes float32,float16] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import tunekit  # noqa: E402,F401
from tunekit.bench import copy_bandwidth, measure_candidates, time_callable  # noqa: E402
from tunekit.ops.logsumexp import logsumexp_op  # noqa: E402
from tunekit.tunable.find_fastest import input_sets  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402

SHAPES = [((32768, 64), -1), ((16384, 512), -1), ((8192, 1024), -1), ((4096, 4096), -1), ((1024, 32768), -1),
          ((64, 1048576), -1), ((4, 16777216), -1), ((4096, 4096), 0), ((32, 4096, 128), 1)]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def per_call(fn, sets, device, repeats):
    """ms per call of ``fn(params)`` over the rotated input sets, graph replay."""
    def run_all():
        for p in sets:
            fn(p)
    ms, _ = time_callable(run_all, device, repeats=repeats, graph=True)
    return ms / len(sets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    device = torch.device("cuda")
    torch._dynamo.config.cache_size_limit = 256
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device)
    start = time.time()
    lines = [f"# logsumexp, {name} ({time.strftime('%Y-%m-%d')}, torch {torch.__version__})", "",
             f"`benchmarks/logsumexp.py`; CUDA-graph replay, L2-cold inputs, median of {args.repeats}; "
             f"1 GiB copy bandwidth {bw:.0f} GB/s (read + write). Cells: % of that copy bandwidth.", "",
             "| shape | dim | dtype | tuned choice | tuned % | best candidate | best % | torch eager % | "
             "torch.compile % | tuned / eager speed-up |", "|---|---|---|---|---:|---|---:|---:|---:|---:|"]
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        compiled = None if args.no_compile else torch.compile(lambda x, d: torch.logsumexp(x, d), dynamic=False)
        for shape, dim in SHAPES:
            p = logsumexp_op.make_example(shape, dtype, device, dim=dim)
            pct = lambda ms: 100 * p.bytes_moved() / (ms * 1e-3) / 1e9 / bw  # noqa: E731
            timings = measure_candidates(logsumexp_op, p, repeats=args.repeats)
            with tunekit.tuning(results=":memory:", max_tuning_ms=2000.0):
                tuned = logsumexp_op.resolve(p).candidate.name
            ok = {k: v.time_ms for k, v in timings.items() if v.status == "ok"}
            best = min(ok, key=ok.get)
            ok.setdefault(tuned, float("nan"))  # a choice the separate measurement rejected shows as nan
            sets = input_sets(p, make_trial(p))
            eager = per_call(lambda q: torch.logsumexp(q.x, q.dims), sets, device, args.repeats)
            comp = None
            if compiled is not None:
                try:
                    compiled(p.x, p.dims)
                    comp = per_call(lambda q: compiled(q.x, q.dims), sets, device, args.repeats)
                except Exception as exc:  # report and go on
                    print(f"compile failed for {shape}: {exc}", file=sys.stderr)
            row = (f"| {'x'.join(map(str, shape))} | {dim} | {dname} | {tuned} | {pct(ok[tuned]):.1f} | {best} | "
                   f"{pct(ok[best]):.1f} | {pct(eager):.1f} | {'–' if comp is None else f'{pct(comp):.1f}'} | "
                   f"{eager / ok[tuned]:.1f}x |")
            lines.append(row)
            print(row, f"[{time.time() - start:.0f} s]", file=sys.stderr)
    text = "\n".join(lines) + "\n"
    out = Path(args.out) / f"logsumexp-{name.replace(' ', '_')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out}; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
