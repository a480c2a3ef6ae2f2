"""The ``tunekit`` command (also ``python -m tunekit``).

    tunekit ops                                   every op, its candidates, and whether each can run here
    tunekit explore silu --shape 4096x4096 --dtype float16 [--json] [--plot FILE.png]
    tunekit explore silu --sizes 64K..64M --plot silu.png     a size sweep (or several --shape)
    tunekit bench [--ops silu gelu ...] [--dtypes ...] [--out DIR] [--quick]
                                                  the benchmark suites: report.md, plots, raw JSON
    tunekit report FILE.json ... --out DIR        the same report and plots from saved results
    tunekit tune [--op silu] [--gpus all|N|0,2] [--file untuned.jsonl]   offline tuning of recorded signatures
    tunekit results show | export FILE.csv [--valid-only] | export-untuned FILE.jsonl | import FILE.csv | clear

``--results PATH`` (before the command) picks the results file; the default is the one the settings
name (``TUNEKIT_RESULTS`` or the per-user cache path).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ._version import __version__
from .bench.report import add_bench_arguments, add_report_arguments
from .bench.suites import sizes
from .tunable import context
from .tunable.dtypes import BY_NAME as DTYPES
from .tunable.errors import ResultsImportError
from .tunable.registry import all_ops, get_op
from .tunable.screen import supports
from .tunable.stores import results_store
NO_GPU = "no CUDA device is present: running on the CPU; GPU candidates are skipped"


def _device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"tunekit: --device {requested}: no CUDA device is present on this machine")
    return device


def _device_note(device: torch.device) -> str:
    if device.type == "cuda":
        return f"device: {torch.cuda.get_device_name(device)}"
    return "device: cpu (" + NO_GPU + ")"


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().replace(",", "x").split("x") if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected e.g. 4096x4096") from None
    if not shape or any(s < 0 for s in shape):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected e.g. 4096x4096")
    return shape


def cmd_ops(args) -> int:
    device = _device(args.device)
    report = []
    for op in all_ops():
        rows = []
        for c in op.candidates:
            reasons = {}
            for name in ("float32", "float16", "bfloat16"):
                reasons[name] = supports(c, op.make_example((1024,), DTYPES[name], device))
            rows.append({"candidate": c.name, "default": c is op.default, "unsupported": {k: v for k, v in reasons.items() if v}})
        report.append({"op": op.name, "candidates": rows})
    if args.json:
        print(json.dumps({"device": str(device), "ops": report}, indent=2))
        return 0
    print(_device_note(device))
    for op in report:
        print(f"\n{op['op']}")
        for row in op["candidates"]:
            status = "runs here" if not row["unsupported"] else "; ".join(f"{k}: {v}" for k, v in row["unsupported"].items())
            print(f"  {row['candidate']:<24} {'default' if row['default'] else '':<8} {status}")
    return 0


def _explore_shapes(args) -> list[tuple[int, ...]]:
    """Every ``--shape``, or the ``--sizes`` sweep laid out as rows of ``--shape``'s last dim (1-D without it)."""
    shapes = args.shape or [(4096, 4096)]
    if not args.sizes:
        return shapes
    if args.shape and len(args.shape) > 1:
        raise SystemExit("tunekit: --sizes takes at most one --shape (whose last dim is the row length)")
    try:
        return sizes.layout(args.sizes, args.shape[0][-1] if args.shape and len(args.shape[0]) >= 2 else None)
    except ValueError as exc:
        raise SystemExit(f"tunekit: --sizes: {exc}") from None


def _explore_one(op, shape, args, device, bandwidth) -> dict:
    from .bench.measure import measure_candidates

    dtype = DTYPES[args.dtype]
    torch.manual_seed(args.seed)
    arguments = {"approximate": args.approximate} if args.approximate else {}
    params = op.make_example(shape, dtype, device, **arguments)
    timings = measure_candidates(op, params, repeats=args.repeats, graph=not args.no_graph)
    chosen = op.resolve(params, context.current())
    nbytes = params.bytes_moved()
    base = timings[op.default.name].time_ms
    rows = []
    for name, t in timings.items():
        row = {"candidate": name, "status": t.status, "reason": t.reason, "first_values": t.first_values,
               "time_ms": t.time_ms, "spread": t.spread, "default": name == op.default.name,
               "tuned_choice": name == chosen.candidate.name}
        if t.time_ms:
            gbps = nbytes / (t.time_ms * 1e-3) / 1e9
            row.update(gbps=gbps, pct_copy=100 * gbps / bandwidth, vs_default=base / t.time_ms if base else None)
        rows.append(row)
    return {"op": op.name, "shape": list(shape), "dtype": args.dtype, "arguments": arguments, "device": _device_note(device),
            "signature": params.signature(), "bytes": nbytes, "copy_gbps": bandwidth, "repeats": args.repeats,
            "tuned_choice": chosen.candidate.name, "why": chosen.why, "candidates": rows}


def _print_explore(result: dict) -> None:
    rows, bandwidth = result["candidates"], result["copy_gbps"]
    shape = "x".join(str(s) for s in result["shape"])
    print(f"{result['op']} {shape} {result['dtype']}   {result['device']}")
    print(f"signature {result['signature']}   copy bandwidth {bandwidth:.0f} GB/s (read+write, same run)")
    w = max(len(r["candidate"]) for r in rows) + 2
    print(f"{'':2}{'candidate':<{w}}{'first values':>28}{'median':>13}{'GB/s':>9}{'% copy':>8}{'vs default':>11}")
    for r in rows:
        mark = "*" if r["tuned_choice"] else " "
        vals = ", ".join(f"{v:.8g}" for v in r["first_values"])
        if r["status"] != "ok":
            print(f"{mark} {r['candidate']:<{w}}{vals:>28}   rejected ({r['status']}): {r['reason']}")
            continue
        print(f"{mark} {r['candidate']:<{w}}{vals:>28}{r['time_ms'] * 1e3:>10.2f} us{r['gbps']:>9.1f}"
              f"{r['pct_copy']:>7.1f}%{r['vs_default']:>10.2f}x")
    print(f"* tuned choice: {result['tuned_choice']} ({result['why']})")


def cmd_explore(args) -> int:
    from .bench.measure import copy_bandwidth

    device = _device(args.device)
    op = get_op(args.op)
    shapes = _explore_shapes(args)
    if args.plot:
        from .bench.plots import MatplotlibMissing, require_matplotlib
        try:
            require_matplotlib()  # before the timing, not after it
        except MatplotlibMissing as exc:
            print(f"tunekit explore --plot: {exc}", file=sys.stderr)
            return 2
    bandwidth = copy_bandwidth(device)
    results = [_explore_one(op, shape, args, device, bandwidth) for shape in shapes]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for i, result in enumerate(results):
            if i:
                print()
            _print_explore(result)
    if args.plot:
        from .bench.report import plot_explore
        path = plot_explore(results, args.plot)
        print(f"plot: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_bench(args) -> int:
    from .bench.report import bench_command

    return bench_command(args, _device(args.device))


def cmd_report(args) -> int:
    from .bench.report import report_command

    return report_command(args)


def cmd_results(args) -> int:
    store = results_store(args.results)
    if args.action == "show":
        entries = store.entries(args.op)
        if args.json:
            print(json.dumps([_entry_json(e) for e in entries], indent=2))
            return 0
        print(f"{store.path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        for e in entries:
            flag = "" if e.complete else "  (incomplete)"
            t = e.candidates.get(e.choice)
            ms = f"{t.time_ms * 1e3:.2f} us" if t is not None and t.time_ms is not None else ""
            print(f"  {e.op:<10} {e.signature:<48} {e.device:<28} -> {e.choice} {ms}{flag}")
        untuned = store.untuned(args.op)
        if untuned:
            print(f"{len(untuned)} signature(s) recorded untuned")
            for u in untuned:
                print(f"  {u.op:<10} {u.signature:<48} {u.device}")
        return 0
    if args.action == "export":
        from .offline.transfer import export_results

        n = export_results(store, args.file, ops=args.op, valid_only=args.valid_only)
        print(f"exported {n} entr{'y' if n == 1 else 'ies'} to {args.file}")
        return 0
    if args.action == "export-untuned":
        from .offline.files import export_untuned

        n = export_untuned(store, args.file, ops=args.op)
        print(f"exported {n} untuned signature{'' if n == 1 else 's'} to {args.file} (tune them: tunekit tune --file)")
        return 0
    if args.action == "import":
        from .offline.transfer import import_results

        try:
            report = import_results(store, args.file, check=not args.all)
        except ResultsImportError as exc:
            print(f"tunekit: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"tunekit: cannot read {args.file}: {exc}", file=sys.stderr)
            return 1
        n = len(report.imported)
        print(f"imported {n} entr{'y' if n == 1 else 'ies'} into {store.path}")
        print(report)
        return 0
    n = store.clear(args.op)
    print(f"cleared {n} entr{'y' if n == 1 else 'ies'} from {store.path}")
    return 0


def cmd_tune(args) -> int:
    """Offline tuning: the records ``tuning(record_untuned=True)`` left in the results file. Each
    entry is stored as soon as it is tuned, so an interrupted run loses at most the signature in
    progress and the next run carries on. Under torchrun the ranks share the work."""
    from .offline import run as tune
    from .offline.summary import text_progress

    changes = {} if args.max_tuning_ms is None else {"max_tuning_ms": args.max_tuning_ms}
    with context.tuning(**changes) as settings:
        try:
            summary = tune.run(results_store(), ops=args.ops, gpus=args.gpus, file=args.file, settings=settings,
                               progress=text_progress())
        except KeyboardInterrupt:
            print("tunekit: interrupted; what was tuned is stored, run tunekit tune again to go on", file=sys.stderr)
            return 130
        except (ValueError, OSError) as exc:
            print(f"tunekit: {exc}", file=sys.stderr)
            return 2
    print(summary)
    return 1 if summary.failed else 0


def _entry_json(e) -> dict:
    return {"op": e.op, "signature": e.signature, "device": e.device, "choice": e.choice, "complete": e.complete,
            "tuned_at": e.tuned_at, "tuning_ms": e.tuning_ms, "validators": e.validators,
            "candidates": {k: vars(v) for k, v in e.candidates.items()}}


def _add_explore(sub) -> None:
    p = sub.add_parser("explore", help="time every candidate of an op on one shape, or several (a size sweep)")
    p.add_argument("op")
    p.add_argument("--shape", type=_parse_shape, action="append",
                   help="e.g. 4096x4096 (default); repeat it for several shapes")
    p.add_argument("--sizes", type=sizes.parse_sizes,
                   help="a size sweep in elements, e.g. 64K..64M (x2 steps), 1M,4M or 2^16..2^26:4; laid out as rows "
                        "of --shape's last dim when --shape is given, else 1-D")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats; the median is reported")
    p.add_argument("--no-graph", action="store_true", help="time eager launches instead of CUDA-graph replays")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--approximate", choices=["none", "tanh"], help="gelu / gelu_backward: which form")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="also plot GB/s against size per candidate (needs matplotlib)")
    p.set_defaults(func=cmd_explore)


def _add_tune(sub) -> None:
    p = sub.add_parser("tune", help="tune the recorded untuned signatures (offline; resumable; several GPUs)")
    p.add_argument("--op", action="append", dest="ops", help="only this op (repeatable)")
    p.add_argument("--gpus", help="one worker per GPU: all, a count N, or indices 0,2 (default: this process)")
    p.add_argument("--file", help="tune the signatures of this file (from tunekit results export-untuned)")
    p.add_argument("--max-tuning-ms", type=float, help="tuning budget per signature (default: the settings')")
    p.set_defaults(func=cmd_tune)


def _add_results(sub) -> None:
    p = sub.add_parser("results", help="show, export, import or clear stored tuning results")
    rs = p.add_subparsers(dest="action", required=True)
    q = rs.add_parser("show")
    q.add_argument("--op")
    q.add_argument("--json", action="store_true")
    q = rs.add_parser("export", help="entries as CSV, to carry to machines of the same GPU model")
    q.add_argument("file")
    q.add_argument("--op", action="append", help="only this op (repeatable)")
    q.add_argument("--valid-only", action="store_true", help="only entries whose validators match this machine")
    q = rs.add_parser("export-untuned", help="recorded untuned signatures as JSON lines (for tunekit tune --file)")
    q.add_argument("file")
    q.add_argument("--op", action="append", help="only this op (repeatable)")
    q = rs.add_parser("import", help="entries from CSV: those valid on this machine (the rest reported)")
    q.add_argument("file")
    q.add_argument("--all", action="store_true", help="import every row, valid here or not")
    q = rs.add_parser("clear")
    q.add_argument("--op")
    p.set_defaults(func=cmd_results)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunekit", description="Fast, tunable GPU operators for PyTorch.")
    parser.add_argument("--version", action="version", version=f"tunekit {__version__}")
    parser.add_argument("--results", help="results file (default: TUNEKIT_RESULTS or the per-user cache)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ops", help="every op and its candidates, and whether each can run here")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ops)
    _add_explore(sub)
    p = sub.add_parser("bench", help="run the benchmark suites; write a Markdown report and PNG plots into a folder")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("report", help="plots and a Markdown report from results JSON (benchmarks/results/*.json, ...)")
    add_report_arguments(p)
    p.set_defaults(func=cmd_report)
    _add_tune(sub)
    _add_results(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.results:
        with context.tuning(results=args.results):
            return args.func(args)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
