"""logsumexp forward and backward over the issue's shapes: every candidate, the tuned choice, torch
eager and torch.compile, checked against the issue's targets, all in one run.

Run: ``PYTHONPATH=src python benchmarks/suites/logsumexp.py [--dtypes float32,float16] [--no-compile]
[--no-backward] [--out DIR]``. Writes ``logsumexp-<device>.md`` (targets summary and tables) and
``.json`` (every raw number) into ``--out`` after every shape, so a run cut short keeps what it
measured; prints the Markdown at the end. A full run (3 dtypes, forward and backward, compile: 54
rows, 54 torch.compile compilations, most of the time) is estimated at 4-6 minutes on an H200;
``--time-limit`` (default 420 s) starts no new row after that, so the run ends inside 10 minutes.

The measuring, the targets and the report live in the package (``tunekit/benchsuite/logsumexp.py``,
whose docstring gives the method: CUDA-graph replay, L2-cold rotated inputs, medians, the 1 GiB
copy bandwidth measured in the same run), so ``tunekit bench`` measures the same way from an
installed wheel. This script keeps its options and its files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunekit.bench.suites.common import DTYPES, device_name, fmt, log, pct, reason, shape_text  # noqa: F401
from tunekit.bench.suites.logsumexp import (  # noqa: F401  (re-exported: tests and readers use these names)
    BIG_INPUT,
    COPY_PCT,
    DIRECTIONS,
    EAGER_DTYPES,
    EAGER_SPEEDUP,
    SHAPES,
    TARGETS,
    detail_lines,
    evaluate,
    lse_backward_composite,
    measure_all,
    measure_row,
    parse_dtypes,
    parse_shapes,
    per_call,
    render,
    run,
    summary_lines,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Method: see tunekit/benchsuite/logsumexp.py's docstring.")
    ap.add_argument("--dtypes", type=parse_dtypes, default=list(DTYPES), help="default: " + ",".join(DTYPES))
    ap.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                    help="SHAPE[:DIM],... e.g. 4096x4096:0,32768x64 (default: the issue's nine)")
    ap.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True, help="also the backward (default)")
    ap.add_argument("--forward", action=argparse.BooleanOptionalAction, default=True, help="the forward (default)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--repeats", type=int, default=10, help="measurements per median (default 10)")
    ap.add_argument("--tuning-ms", type=float, default=2000.0, help="tuning budget per signature (default 2000)")
    ap.add_argument("--shape-budget", type=float, default=40.0,
                    help="seconds of candidate timing per shape; later candidates are skipped (default 40)")
    ap.add_argument("--time-limit", type=float, default=420.0,
                    help="no new row starts after this many seconds; files are written as rows finish (default 420)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--stem", default="logsumexp", help="file name stem: <stem>-<device>.md/.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    directions = tuple(d for d, on in (("fwd", args.forward), ("bwd", args.backward)) if on)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.stem}-{device_name(device).replace(' ', '_')}"
    md, jpath = out_dir / f"{stem}.md", out_dir / f"{stem}.json"

    def write(raw: dict) -> str:
        meta = {k: v for k, v in raw.items() if k not in ("final", "rows")}
        text = render(meta, raw["rows"])
        md.write_text(text)
        jpath.write_text(json.dumps(raw, indent=1, default=str) + "\n")
        return text

    raw = run(dtypes=args.dtypes, shapes=args.shapes, device=device, directions=directions, repeats=args.repeats,
              compile=not args.no_compile, tuning_ms=args.tuning_ms, shape_budget=args.shape_budget,
              time_limit=args.time_limit, args={**vars(args), "shapes": [[list(s), d] for s, d in args.shapes]},
              command=" ".join(["python benchmarks/suites/logsumexp.py"] + (argv if argv is not None else sys.argv[1:])),
              on_row=write)
    print(write(raw))
    log(f"wrote {md} and {jpath}; {raw['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
