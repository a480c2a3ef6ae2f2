"""First use: what a fresh process with default settings gets on new signatures, against the goals.

Run: ``PYTHONPATH=src python benchmarks/suites/first_use.py [--out DIR] [--families silu,gelu,gelu_tanh,logsumexp]
[--dtypes ...] [--quick | --smoke] [--device cuda]``. Writes ``first_use-<device>.json`` (every raw number)
and ``.md`` (the goals' verdicts, a table per family and cache state) into ``--out`` after every child
process, so a run cut short keeps what it measured.

One fresh process per op family and cache state (empty, then warm): per signature the first call's
wall time, the calls until the choice is final, the device time of the choices after call 1, call
20 and at the end against offline tuning's, torch eager, torch.compile and a same-size copy. The
measuring and the report live in the package (``tunekit/bench/suites/first_use.py``, whose docstring
gives the method; ``first_use_report.py``: the goals), so ``tunekit bench --first-use`` measures the
same way. ``--time-limit`` (default 400 s; smoke 120) bounds the whole run: signatures not reached are
listed as not measured. The goals' table is printed at the end. ``--smoke`` runs on the CPU in well under a minute (one family,
tiny shapes, no torch.compile, no graphs): it shows the path works, not how fast anything is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunekit.bench.suites import activations, logsumexp  # noqa: E402
from tunekit.bench.suites.common import DTYPES, log  # noqa: E402
from tunekit.bench.suites.first_use import FAMILIES, PRESETS, run, write_files  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="GPU: 4 logsumexp shapes instead of 9")
    mode.add_argument("--smoke", action="store_true", help="CPU: silu float32 at tiny shapes, no compile, no graphs")
    ap.add_argument("--families", type=activations.names_in(FAMILIES), help="default: " + ",".join(FAMILIES))
    ap.add_argument("--dtypes", type=activations.names_in(DTYPES), help="default: " + ",".join(DTYPES))
    ap.add_argument("--shapes", type=activations.parse_shapes, help="activations, e.g. 4096x4096,8192x8192")
    ap.add_argument("--lse-shapes", type=logsumexp.parse_shapes, help="logsumexp, e.g. 4096x4096:0,32768x64")
    ap.add_argument("--device", help="cuda (default) or cpu (smoke: cpu)")
    ap.add_argument("--repeats", type=int, help="rounds of the head-to-head timing (default 10; smoke 3)")
    ap.add_argument("--max-calls", type=int, default=200, help="calls allowed until the choice is final")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--no-shipped", action="store_true",
                    help="children ignore shipped pre-tuned results (TUNEKIT_USE_SHIPPED=0); files end in -no_shipped")
    ap.add_argument("--time-limit", type=float, help="seconds for the whole run (default: the mode's)")
    ap.add_argument("--keep-caches", action="store_true", help="keep the cache folders (their path is printed)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = ap.parse_args(argv)
    options = dict(PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"])
    for key, value in (("families", args.families), ("dtypes", args.dtypes), ("act_shapes", args.shapes),
                       ("lse_shapes", args.lse_shapes), ("device", args.device), ("repeats", args.repeats),
                       ("time_limit", args.time_limit)):
        if value is not None:
            options[key] = value
    if args.no_compile:
        options["compile"] = False
    if args.no_shipped:
        options["shipped"] = False
    command = " ".join(["python benchmarks/suites/first_use.py"] + (argv if argv is not None else sys.argv[1:]))
    raw = run(**options, max_calls=args.max_calls, keep_caches=args.keep_caches, command=command, args=vars(args),
              on_update=lambda partial: write_files(partial, args.out))
    paths = write_files(raw, args.out)
    goals = paths[1].read_text().partition("## Goals")[2].partition("\n## ")[0]
    log(f"## Goals{goals}\nwrote {paths[0]} and {paths[1]}; elapsed {raw['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
