"""Does tuning's host-time tie-break keep the choice within noise of the default's device time?

For the cases where the H100 activations run (2026-11-21) saw the tuned choice 2.5-3% slower than
torch eager (GELU tanh backward, 16-bit, 1024x2048 and 2048x1024), plus controls, this tunes each
signature ``--runs`` times with the confirmed tie-break and ``--runs`` times without it (the code before
the confirmation), alternating (``find_fastest`` directly: no store), and prints each run's choice with the
records that explain it (device times, host times, the head-to-head confirmation), then times the
default and every chosen candidate head to head as ``benchmarks/suites/activations.py`` does (CUDA-graph
replay, L2-cold input sets, ~1 ms per measurement, median of ``--repeats``).

Run on a CUDA machine: ``PYTHONPATH=src python benchmarks/checks/tie_break_check.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402,F401
from tunekit.bench.suites.common import head_to_head  # noqa: E402
from tunekit.ops.gelu import gelu_backward_op, gelu_op  # noqa: E402
from tunekit.ops.silu import silu_op  # noqa: E402
from tunekit.tunable import find_fastest  # noqa: E402
from tunekit.tunable.context import TuningSettings  # noqa: E402
from tunekit.tunable.screen import input_sets  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402

ff = importlib.import_module("tunekit.tunable.find_fastest")  # the module (the package exports the function)

CASES = [
    ("gelu_tanh_bwd", gelu_backward_op, (1024, 2048), torch.float16, {"approximate": "tanh"}),
    ("gelu_tanh_bwd", gelu_backward_op, (2048, 1024), torch.bfloat16, {"approximate": "tanh"}),
    ("gelu_tanh", gelu_op, (1024, 2048), torch.float16, {"approximate": "tanh"}),
    ("silu", silu_op, (1024, 1024), torch.float16, {}),
]


def _unconfirmed(*args, **kwargs):
    return True, float("nan")


def check(label, op, shape, dtype, kwargs, device, runs, repeats, lines):
    """Runs alternate between the confirmed tie-break (the code) and the unconfirmed one (before)."""
    params = op.make_example(shape, dtype, device, **kwargs)
    chosen = {"confirmed": Counter(), "unconfirmed (before)": Counter()}
    lines.append(f"\n## {label} {str(dtype).removeprefix('torch.')} {shape[0]}x{shape[1]}\n")
    confirm = ff.confirmed_tie
    for run in range(2 * runs):
        mode = "confirmed" if run % 2 == 0 else "unconfirmed (before)"
        ff.confirmed_tie = confirm if run % 2 == 0 else _unconfirmed
        try:
            report = find_fastest(op, params, TuningSettings())
        finally:
            ff.confirmed_tie = confirm
        chosen[mode][report.choice] += 1
        default = op.default.name
        notes = [f"run {run}, {mode}: **{report.choice}** ({report.tuning_ms:.0f} ms, complete={report.complete})"]
        for name, rec in report.candidates.items():
            if name in (report.choice, default) or "host" in (rec.reason or ""):
                t = f"{rec.time_ms * 1e3:.2f} us" if rec.time_ms else "-"
                notes.append(f"  - {name}: {rec.status}, {t}: {rec.reason}")
        lines.extend(notes)
    sets = input_sets(params, make_trial(params))
    names = set().union(*chosen.values()) - {op.default.name}
    contenders = {name: (op.candidate(name).run, True) for name in [op.default.name] + sorted(names)}
    timed = head_to_head(contenders, sets, device, repeats)
    base = timed[op.default.name][0]
    lines.append(f"\nchoices over {runs} runs each: " + "; ".join(f"{m}: {dict(c)}" for m, c in chosen.items()))
    lines.append(f"\nhead to head ({repeats} repeats, graph replay, {len(sets)} L2-cold input sets):")
    for name, (ms, spread) in timed.items():
        lines.append(f"  - {name}: {ms * 1e3:.2f} us ({ms / base:.3f}x the default; spread {spread:.1%})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    lines = [f"# Tie-break check: {name}", "", f"torch {torch.__version__}; `benchmarks/checks/tie_break_check.py "
             f"--runs {args.runs} --repeats {args.repeats}`; tuning with the default settings (50 ms budget)."]
    for case in CASES:
        first = len(lines)
        check(*case, device, args.runs, args.repeats, lines)
        print("\n".join(lines[first:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"tie_break_check-{name.replace(' ', '_')}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
