"""Activation ops (silu, gelu, gelu-tanh; forward and backward): every tunekit candidate, the tuned
choice, torch eager and ``torch.compile``, against the copy bandwidth, all in one run.

Run: ``PYTHONPATH=src python benchmarks/suites/activations.py [--out DIR] [--cases silu,gelu_bwd,...]``.
Writes ``activations-<device>.md`` (tables) and ``.json`` (every raw number) into ``--out``.

The measuring and the report live in the package (``tunekit/benchsuite/activations.py``, whose
docstring gives the method and its reasons: CUDA-graph replay, L2-cold rotated inputs, medians,
head-to-head timing, the 1 GiB copy bandwidth measured in the same run), so ``tunekit bench``
measures the same way from an installed wheel. This script keeps its options and its files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunekit.bench.suites.activations import (  # noqa: F401  (re-exported for existing importers)
    CASES,
    DEFAULT_SHAPES,
    TARGET_PCT,
    TARGET_RATIO,
    TARGET_SHAPES,
    Case,
    case_tables,
    make_compiled,
    measure_shape,
    names_in,
    parse_shapes,
    render,
    run,
    summary,
)
from tunekit.bench.suites.common import DTYPES, fmt, head_to_head, log, pct, shape_text  # noqa: F401


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=names_in(CASES), default=list(CASES), help="default: " + ",".join(CASES))
    ap.add_argument("--dtypes", type=names_in(DTYPES), default=list(DTYPES), help="default: " + ",".join(DTYPES))
    ap.add_argument("--shapes", type=parse_shapes, default=DEFAULT_SHAPES, help="e.g. 4096x4096,8192x8192")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--json", help="raw numbers (default: the Markdown file's stem + .json)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    command = " ".join(["python benchmarks/suites/activations.py"] + (argv if argv is not None else sys.argv[1:]))
    raw = run(cases=args.cases, dtypes=args.dtypes, shapes=args.shapes, device=torch.device(args.device),
              repeats=args.repeats, compile=not args.no_compile, args=vars(args), command=command)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"activations-{raw['device'].replace(' ', '_')}.md"
    md.write_text(render(raw))
    jpath = Path(args.json) if args.json else md.with_suffix(".json")
    jpath.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    log(f"wrote {md} and {jpath}; elapsed {raw['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
