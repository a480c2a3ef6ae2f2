"""The ``tunekit`` command (also ``python -m tunekit``).

    tunekit ops                                   every op, its candidates, and whether each can run here
    tunekit explore silu --shape 4096x4096 --dtype float16 [--json] [--plot FILE.png]
    tunekit explore silu --sizes 64K..64M --plot silu.png     a size sweep (or several --shape)
    tunekit bench [--ops silu gelu ...] [--dtypes ...] [--out DIR] [--quick]
                                                  the benchmark suites: report.md, plots, raw JSON
    tunekit report FILE.json ... --out DIR        the same report and plots from saved results
    tunekit tune [--op silu] [--gpus all|N|0,2] [--file untuned.jsonl]   offline tuning of recorded signatures
    tunekit results show | export FILE.csv [--valid-only] | export-untuned FILE.jsonl | import FILE.csv | clear

``--results PATH`` (before the command) picks the results file; the default is the one the settings name
(``TUNEKIT_RESULTS`` or the per-user cache path). Errors are one line on stderr, ``tunekit: ...``, never a
traceback; exit code 2 for input the command cannot use (arguments, settings), 1 for a run that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import re
import sys
import warnings

import torch

from ._version import __version__
from .bench.report import add_bench_arguments, add_report_arguments
from .bench.suites import sizes
from .tunable import context
from .tunable.dtypes import BY_NAME as DTYPES
from .tunable.errors import ResultsImportError, ResultsStoreError, SettingsError
from .tunable.registry import all_ops, get_op
from .tunable.screen import supports
from .tunable.stores import results_store
#: the most elements one explored shape may have (8 TiB of float64): larger is a typo, refused before allocating
MAX_ELEMENTS = 2 ** 40


class UsageError(SystemExit):
    """Input the command cannot use: ``main`` prints ``tunekit: <message>``; exit code 2, as argparse's errors."""
    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (``tunekit: explore: argument --repeats: ...``) and exit code 2."""
    def error(self, message):
        where = self.prog.removeprefix("tunekit").strip()
        self.exit(2, f"tunekit: {where + ': ' if where else ''}{message} (see {self.prog} --help)\n")


def _text(exc) -> str:
    """An exception as one line: ``path: reason`` for a file error."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return " ".join(str(exc).split())


def _device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.suppress(RuntimeError, ValueError):
        device, count = torch.device(requested), torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.type, device.index) in (("cpu", None), ("cpu", 0)) or device.type == "cuda" and count > (device.index or 0):
            return device
        if device.type == "cuda" and not count:
            raise UsageError(f"--device {requested}: no CUDA device is present on this machine")
    raise UsageError(f"--device {requested!r}: expected cpu, cuda or cuda:N of the {torch.cuda.device_count()} GPU(s)")


def _device_note(device: torch.device) -> str:
    if device.type == "cuda":
        return f"device: {torch.cuda.get_device_name(device)}"
    return "device: cpu (no CUDA device is present: running on the CPU; GPU candidates are skipped)"


def _parse_shape(text: str) -> tuple[int, ...]:
    """``4096x4096`` (or ``4096,4096``): every dim a whole number >= 1, at most MAX_ELEMENTS in all."""
    parts = text.strip().lower().replace(",", "x").split("x")
    shape = tuple(int(p) for p in parts) if all(p.isascii() and p.isdigit() for p in parts) else ()
    if not shape or min(shape) < 1 or len(shape) > 8 or math.prod(shape) > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: 1 to 8 dims >= 1 joined by x (4096x4096), <= 2^40 in all")
    return shape


def _parse_sizes(text: str) -> list[int]:
    """``--sizes`` (bench/suites/sizes.py), each size at most MAX_ELEMENTS (checked before 2^N is computed)."""
    if any(int(n) > 40 for n in re.findall(r"\^\s*(\d+)", text)) or max(found := sizes.parse_sizes(text)) > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"bad sizes {text!r}: at most 2^40 elements")
    return found


def _number(kind, low, high, words: str):
    """An argparse type: ``kind(text)`` (int or float) in [low, high], else an error with ``words``."""
    def parse(text: str):
        with contextlib.suppress(ValueError, OverflowError):
            if low <= (value := kind(text)) <= high:
                return value
        raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
    return parse


_REPEATS = _number(int, 1, 10**6, "a whole number from 1 to 1000000")


def _op_name(text: str) -> str:
    if text in (known := [o.name for o in all_ops()]):
        return text
    raise argparse.ArgumentTypeError(f"no tunekit op named {text!r}; known ops: {', '.join(known)}")


def _known_or_stored(store, op: str | None) -> str | None:
    """``--op`` of ``results show`` / ``clear``: an op of this tunekit, or one the store has entries of."""
    known = [o.name for o in all_ops()]
    if op is None or op in known or store.query("SELECT 1 FROM entries WHERE op = ? LIMIT 1", (op,)):
        return op
    raise UsageError(f"--op {op!r}: no such op here or in {store.path}; known ops: {', '.join(known)}")


def cmd_ops(args) -> int:
    device = _device(args.device)
    examples = {op.name: {n: op.make_example((1024,), DTYPES[n], device) for n in ("float32", "float16", "bfloat16")}
                for op in all_ops()}
    report = [{"op": op.name, "candidates": [
        {"candidate": c.name, "default": c is op.default,
         "unsupported": {n: why for n, params in examples[op.name].items() if (why := supports(c, params))}}
        for c in op.candidates]} for op in all_ops()]
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
    if not args.sizes:
        return args.shape or [(4096, 4096)]
    if args.shape and len(args.shape) > 1:
        raise UsageError("--sizes takes at most one --shape (whose last dim is the row length)")
    try:
        return sizes.layout(args.sizes, args.shape[0][-1] if args.shape and len(args.shape[0]) >= 2 else None)
    except ValueError as exc:
        raise UsageError(f"--sizes: {exc}") from None


def _check_explore(op, shapes, args, device) -> None:
    """Before any timing: an argument the op does not take, shapes too large (inputs, outputs, reference), --plot's folder."""
    if args.approximate and "approximate" not in inspect.signature(op.make_example).parameters:
        takes = [o.name for o in all_ops() if "approximate" in inspect.signature(o.make_example).parameters]
        raise UsageError(f"--approximate applies to {', '.join(takes)}, not to {op.name}")
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    need = 3 * max(math.prod(s) for s in shapes) * DTYPES[args.dtype].itemsize
    if need > memory:
        raise UsageError(f"the largest shape needs about {need / 2**30:.3g} GiB; {device.type} has {memory / 2**30:.3g}")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise UsageError(f"--plot {args.plot}: no such folder")


def cmd_explore(args) -> int:
    from .bench.explore import explore_one, print_explore
    from .bench.measure import copy_bandwidth

    device = _device(args.device)
    op = get_op(args.op)
    shapes = _explore_shapes(args)
    _check_explore(op, shapes, args, device)
    if args.plot:
        from .bench.plots import MatplotlibMissing, require_matplotlib
        try:
            require_matplotlib()  # before the timing, not after it
        except MatplotlibMissing as exc:
            raise UsageError(f"explore --plot: {exc}") from None
    bandwidth = copy_bandwidth(device)
    arguments = {"approximate": args.approximate} if args.approximate else {}
    results = [explore_one(op, shape, DTYPES[args.dtype], device, bandwidth, repeats=args.repeats,
                           graph=not args.no_graph, seed=args.seed, arguments=arguments,
                           device_note=_device_note(device)) for shape in shapes]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for i, result in enumerate(results):
            if i:
                print()
            print_explore(result)
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
        from .offline.transfer import describe
        print(describe(store, _known_or_stored(store, args.op), as_json=args.json))
        if store.problem:
            print(f"tunekit: results file {store.path!r} {store.problem}: its results cannot be read", file=sys.stderr)
        return 1 if store.problem else 0
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
        report = import_results(store, args.file, check=not args.all)  # a bad file: ResultsImportError, exit 1
        n = len(report.imported)
        print(f"imported {n} entr{'y' if n == 1 else 'ies'} into {store.path}")
        print(report)
        return 0
    op = _known_or_stored(store, args.op)
    store.require_writable("clear results")  # before, and after: the file may fail on the way
    n = store.clear(op)
    store.require_writable("clear results")
    print(f"cleared {n} entr{'y' if n == 1 else 'ies'} from {store.path}")
    return 0


def cmd_tune(args) -> int:
    """Offline tuning of recorded signatures, each entry stored once tuned; under torchrun the ranks share it."""
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
        except (ValueError, OSError) as exc:  # --gpus, --file: what the run was given
            raise UsageError(_text(exc)) from None
    print(summary)
    return 0 if summary.ok else 1


def _add_explore(sub) -> None:
    p = sub.add_parser("explore", help="time every candidate of an op on one shape, or several (a size sweep)")
    p.add_argument("op", type=_op_name)
    p.add_argument("--shape", type=_parse_shape, action="append",
                   help="e.g. 4096x4096 (default); repeat it for several shapes")
    p.add_argument("--sizes", type=_parse_sizes, help="a size sweep in elements, e.g. 64K..64M (x2 steps), 1M,4M or "
                   "2^16..2^26:4; laid out as rows of --shape's last dim when --shape is given, else 1-D")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--repeats", type=_REPEATS, default=20, help="timed repeats; the median is reported")
    p.add_argument("--no-graph", action="store_true", help="time eager launches instead of CUDA-graph replays")
    p.add_argument("--seed", type=_number(int, 0, 2**63 - 1, "a whole number >= 0"), default=0)
    p.add_argument("--approximate", choices=["none", "tanh"], help="gelu / gelu_backward: which form")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="also plot GB/s against size per candidate (needs matplotlib)")
    p.set_defaults(func=cmd_explore)


def _add_tune(sub) -> None:
    p = sub.add_parser("tune", help="tune the recorded untuned signatures (offline; resumable; several GPUs)")
    p.add_argument("--op", action="append", dest="ops", type=_op_name, help="only this op (repeatable)")
    p.add_argument("--gpus", help="one worker per GPU: all, a count N, or indices 0,2 (default: this process)")
    p.add_argument("--file", help="tune the signatures of this file (from tunekit results export-untuned)")
    p.add_argument("--max-tuning-ms", type=_number(float, 1e-6, 1e12, "a number of milliseconds > 0"),
                   help="tuning budget per signature, doubled on each of up to two retries of an incomplete "
                        "tuning (default: the settings')")
    p.set_defaults(func=cmd_tune)


def _add_results(sub) -> None:
    p = sub.add_parser("results", help="show, export, import or clear stored tuning results")
    rs = p.add_subparsers(dest="action", required=True)
    q = rs.add_parser("show")
    q.add_argument("--op")
    q.add_argument("--json", action="store_true")
    for name, what in (("export-untuned", "recorded untuned signatures as JSON lines (for tunekit tune --file)"),
                       ("export", "entries as CSV, to carry to machines of the same GPU model")):
        q = rs.add_parser(name, help=what)
        q.add_argument("file")
        q.add_argument("--op", action="append", type=_op_name, help="only this op (repeatable)")
    q.add_argument("--valid-only", action="store_true", help="only entries whose validators match this machine")
    q = rs.add_parser("import", help="entries from CSV: those valid on this machine (the rest reported)")
    q.add_argument("file")
    q.add_argument("--all", action="store_true", help="import every row, valid here or not")
    q = rs.add_parser("clear")
    q.add_argument("--op")
    p.set_defaults(func=cmd_results)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tunekit", description="Fast, tunable GPU operators for PyTorch.")
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
    p._option_string_actions["--repeats"].type = _REPEATS  # the suites' plain int and float, range-checked
    p._option_string_actions["--time-limit"].type = _number(float, 1e-3, 1e9, "a number of seconds > 0")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("report", help="plots and a Markdown report from results JSON (benchmarks/results/*.json, ...)")
    add_report_arguments(p)
    p._option_string_actions["--dpi"].type = _number(int, 1, 2000, "a whole number from 1 to 2000")
    p.set_defaults(func=cmd_report)
    _add_tune(sub)
    _add_results(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; its exit code. Errors are one line on stderr (module docstring)."""
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_, **__: print(f"tunekit: warning: {_text(message)}", file=sys.stderr)
        try:
            with context.tuning(results=args.results) if args.results else contextlib.nullcontext():
                return args.func(args)
        except (UsageError, SettingsError) as exc:  # settings, the backends' too (read at first use)
            print(f"tunekit: {_text(exc)}", file=sys.stderr)
            raise (exc if isinstance(exc, UsageError) else UsageError(_text(exc))) from None
        except KeyboardInterrupt:
            print("tunekit: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:  # one line, no traceback: the run failed (exit code 1)
            expected = isinstance(exc, (ResultsStoreError, ResultsImportError, OSError))
            print(f"tunekit: {'' if expected else f'{args.command} failed: {type(exc).__name__}: '}{_text(exc)}",
                  file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
