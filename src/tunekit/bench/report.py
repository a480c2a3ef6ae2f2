"""Benchmark reports: a folder with a Markdown report and PNG plots, from a run or from saved JSON.

- ``tunekit bench [--ops ...] [--dtypes ...] [--out DIR] [--quick]`` runs the suites of
  :mod:`tunekit.bench.suites` (the same code as ``benchmarks/suites/activations.py`` and
  ``benchmarks/suites/logsumexp.py``, so the same method: CUDA-graph replay, L2-cold rotated inputs,
  medians, head-to-head timing, the copy bandwidth measured in the same run) and writes
  ``report.md``, one plot per op / direction / dtype, an overview plot per suite, and each suite's
  full tables (``<suite>.md``) and raw numbers (``<suite>.json``, the scripts' format).
- ``tunekit bench --first-use [--ops ...] [--dtypes ...] [--out DIR] [--quick]`` runs the first-use
  benchmark instead (:mod:`tunekit.bench.suites.first_use`: a fresh process per op family and cache
  state, default settings) and writes ``first_use-<device>.json`` and ``.md``; on a CPU, its smoke run.
- ``tunekit report FILE.json ... --out DIR`` (also ``python -m tunekit.bench.report``) draws the same
  report from files already written (the committed ``benchmarks/results/*.json``, a bench folder's
  JSON, ``tunekit explore --json`` output), so plots never need a GPU.

``--quick`` exists so CI can run the whole path on a CPU: tiny shapes, 3 repeats, no
torch.compile unless asked, a short tuning budget. The report says when times are CPU times.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from pathlib import Path

from .._version import __version__
from .suites.common import DTYPES

__all__ = ["BENCH_OPS", "bench", "first_use_command", "main", "plot_explore", "report_from_files", "write_report"]

# op name (as `tunekit ops` lists it) -> (suite, what of the suite runs it: activations case names, logsumexp directions)
BENCH_OPS = {
    "silu": ("activations", ("silu",)), "silu_backward": ("activations", ("silu_bwd",)),
    "gelu": ("activations", ("gelu", "gelu_tanh")), "gelu_backward": ("activations", ("gelu_bwd", "gelu_tanh_bwd")),
    "logsumexp": ("logsumexp", ("fwd",)), "logsumexp_backward": ("logsumexp", ("bwd",)),
}
CPU_NOTE = ("**CPU timings.** No CUDA device was used: these are host-clock times of CPU kernels at tiny sizes, "
            "inputs are not rotated (they stay in the CPU's caches, so more than 100% of the copy bandwidth is "
            "possible) and GPU candidates are skipped. They show that the suite runs end to end; they say nothing "
            "about GPU performance.")


def _names(known, what: str):
    """argparse type: one name or a comma-separated list, each from ``known``."""
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or text!r}; known: {', '.join(known)}")
        return names
    return parse


def _flatten(groups) -> list[str]:
    return list(dict.fromkeys(n for group in groups for n in group))


# -- running the suites -----------------------------------------------------------------------
def bench(*, ops: list[str], dtypes: list[str], out: Path, device, quick: bool = False, repeats: int | None = None,
          compile: bool | None = None, plots: bool = True, time_limit: float | None = None, command: str = "tunekit bench",
          progress=None) -> list[Path]:
    """Run the suites covering ``ops`` and write the report folder; returns the files written. Each
    suite's JSON is written as soon as it ends, so a later failure keeps it."""
    from .suites import activations, logsumexp
    from .suites.progress import ProgressBar

    if plots:
        from .plots import require_matplotlib
        require_matplotlib()  # fail before the run, not after it
    compile = (not quick) if compile is None else compile
    cases = [c for op in ops if BENCH_OPS[op][0] == "activations" for c in BENCH_OPS[op][1]]
    directions = tuple(d for d in ("fwd", "bwd") if any(BENCH_OPS[op] == ("logsumexp", (d,)) for op in ops))
    act_shapes = activations.QUICK_SHAPES if quick else activations.DEFAULT_SHAPES
    lse_shapes = logsumexp.QUICK_SHAPES if quick else logsumexp.SHAPES
    total = len(cases) * len(dtypes) * len(act_shapes) + len(directions) * len(dtypes) * len(lse_shapes)
    progress = progress or ProgressBar(total)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raws, written = {}, []
    try:
        if cases:
            raws["activations"] = activations.run(
                cases=cases, dtypes=dtypes, shapes=act_shapes, device=device, repeats=repeats or (3 if quick else 15),
                compile=compile, tuning_ms=200.0 if quick else 3000.0, command=command, progress=progress)
            written.append(_write_json(out / "activations.json", raws["activations"]))
        if directions:
            raws["logsumexp"] = logsumexp.run(
                dtypes=dtypes, shapes=lse_shapes, device=device, directions=directions,
                repeats=repeats or (3 if quick else 10), compile=compile, tuning_ms=200.0 if quick else 2000.0,
                shape_budget=10.0 if quick else 40.0, time_limit=time_limit, command=command, progress=progress)
            written.append(_write_json(out / "logsumexp.json", raws["logsumexp"]))
    finally:
        progress.close()
    return written + write_report(raws, out, command=command, plots=plots)


def _write_json(path: Path, raw: dict) -> Path:
    path.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return path


# -- the report -------------------------------------------------------------------------------
def _suite_markdown(suite: str, raw: dict) -> str:
    from .suites import activations, logsumexp

    if suite == "activations":
        return activations.render(raw)
    return logsumexp.render({k: v for k, v in raw.items() if k not in ("final", "rows")}, raw["rows"])


def _summary_lines(suite: str, raw: dict) -> list[str]:
    """The suite's targets table, with the suite's headings one level down."""
    from .suites import activations, logsumexp

    if suite == "activations":
        big = "1 GiB" if activations.is_graph_timed(raw) else "256 MiB"
        lines = activations.summary(raw["results"], raw["copy_gbps_start"], big) if raw["results"] else []
        return [("#" + ln) if ln.startswith("## ") else ln for ln in lines]
    if not raw["rows"]:
        return []
    return ["### Targets", ""] + logsumexp.summary_lines(raw["rows"], raw["copy_gbps_start"]) + [""]


def _overviews(suite: str, panels) -> dict[str, tuple[str, list]]:
    """{file key: (title, panels)}: activations get one overview per direction (six cases in one
    picture are unreadable), logsumexp one for both."""
    if suite == "activations":
        groups = {"overview-fwd": ("activations, forward", [p for p in panels if "forward" in p.what]),
                  "overview-bwd": ("activations, backward", [p for p in panels if "backward" in p.what])}
        return {k: v for k, v in groups.items() if v[1]}
    if suite == "logsumexp":
        return {"overview": ("logsumexp", panels)}
    return {}


def _draw(suite: str, raw, out: Path, *, prefix: str, only, dpi: int) -> list[tuple[str, Path]]:
    """Every plot of one results file that ``only`` lets through: [(title, path)]."""
    from .suites.panels import panels_from
    from .plots import plot_overview, plot_panel

    panels = panels_from(raw)
    figures = [(f"{suite}-{key}", f"{title}: tuned choice, torch eager and torch.compile, % of the copy",
                lambda path, t=title, g=group: plot_overview(g, path, title=t, dpi=dpi))
               for key, (title, group) in _overviews(suite.split("-")[0], panels).items()]
    figures += [(f"{suite}-{p.key}", p.title, lambda path, p=p: plot_panel(p, path, dpi=dpi)) for p in panels]
    return [(title, draw(out / f"{prefix}{name}.png")) for name, title, draw in figures
            if not only or any(fnmatch.fnmatch(name, pattern) for pattern in only)]


def _section(suite: str, raw, images, tables: Path | None, source: str) -> list[str]:
    """report.md's part for one results file: device, copy bandwidth, targets, links, plots."""
    lines = [f"## {suite}", ""]
    if tables is not None:
        end, v = raw.get("copy_gbps_end"), raw["versions"]
        big = "256 MiB" if raw["device"] == "cpu" else "1 GiB"
        lines += [(f"Device: **{raw['device']}**; torch {v['torch']}, CUDA {v['cuda']}, triton {v['triton']}; "
                   f"measured {raw['date']}, {raw['elapsed_s']:.0f} s."), "",
                  (f"Copy bandwidth ({big}, read + write, measured in the same run): **{raw['copy_gbps_start']:.0f} "
                   f"GB/s** at the start" + (f", {end:.0f} GB/s at the end." if end else ".")
                   + " Every % is of the start figure."), ""]
        lines += _summary_lines(suite.split("-")[0], raw)
        lines += [(f"Every candidate, the tuned choice, eager, compile, per shape: [{tables.name}]({tables.name}); "
                   f"raw numbers: `{source}`."), ""]
    else:
        first = raw[0] if isinstance(raw, list) else raw
        lines += [f"`tunekit explore` on **{first['device']}**, copy bandwidth {first['copy_gbps']:.0f} GB/s (same run).", ""]
    for title, path in images:
        lines += [f"### {title}", "", f"![{title}]({path.name})", ""]
    return lines


def _on_cpu(raw) -> bool:
    return any(str(r.get("device", "")).lower().startswith(("cpu", "device: cpu"))
               for r in (raw if isinstance(raw, list) else [raw]))


def write_report(raws: dict[str, dict], out, *, command: str | None = None, only: list[str] | None = None,
                 prefix: str = "", markdown: bool = True, plots: bool = True, dpi: int = 100,
                 sources: dict[str, str] | None = None) -> list[Path]:
    """Plots and ``report.md`` for ``raws`` ({suite: raw results}; a key may carry a suffix,
    ``activations-2``, when one report shows two files of a suite); returns the files written.
    ``only``: shell patterns on plot names (``activations-silu-*``, ``logsumexp-overview``);
    ``prefix`` starts every file name; ``sources``: {suite: where the raw numbers are}, for links."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sections: list[str] = []
    for suite, raw in raws.items():
        images = _draw(suite, raw, out, prefix=prefix, only=only, dpi=dpi) if plots else []
        written += [path for _, path in images]
        if not markdown:
            continue
        tables = None
        if suite.split("-")[0] in ("activations", "logsumexp"):
            tables = out / f"{prefix}{suite}.md"
            tables.write_text(_suite_markdown(suite.split("-")[0], raw))
            written.append(tables)
        sections += _section(suite, raw, images, tables, (sources or {}).get(suite, f"{prefix}{suite}.json"))
    if markdown:
        devices = ", ".join(dict.fromkeys(str(r.get("device", "?")) for r in raws.values() if isinstance(r, dict)))
        head = [f"# tunekit benchmark report: {devices or 'explore'}", "",
                (f"tunekit {__version__}; written {time.strftime('%Y-%m-%d %H:%M:%S')}"
                 + (f" by `{command}`" if command else "") + "."), ""]
        if any(_on_cpu(raw) for raw in raws.values()):
            head += [CPU_NOTE, ""]
        head += [("Plots: bandwidth (bytes the op must read and write, over its time) against size for every "
                  "candidate; the tuned choice, torch eager, torch.compile and a same-size copy drawn thick; the "
                  "copy bandwidth measured in the same run as the dashed ceiling (right axis: % of it)."), ""]
        report = out / f"{prefix}report.md"
        report.write_text("\n".join(head + sections).rstrip("\n") + "\n")
        written.append(report)
    return written


def report_from_files(paths, out, **options) -> list[Path]:
    """``write_report`` for results files already on disk (suite told apart by content)."""
    from .suites.panels import suite_of

    raws, sources = {}, {}
    for path in map(Path, paths):
        raw = json.loads(path.read_text())
        suite = suite_of(raw)
        key = suite if suite not in raws else f"{suite}-{len(raws) + 1}"
        raws[key], sources[key] = raw, str(path)
    return write_report(raws, out, sources=sources, **options)


def plot_explore(results: list[dict], path, *, dpi: int = 100) -> Path:
    """``tunekit explore --plot``: the candidates of one op over the explored shapes, one PNG."""
    from .suites.panels import explore_panels
    from .plots import plot_panel

    (panel,) = explore_panels(results)  # one op and dtype per explore run
    return plot_panel(panel, path, dpi=dpi)


# -- command line -----------------------------------------------------------------------------
def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", nargs="+", type=_names(BENCH_OPS, "op"), default=[list(BENCH_OPS)],
                   help="ops to benchmark, spaces or commas (default: " + ", ".join(BENCH_OPS) + ")")
    p.add_argument("--dtypes", nargs="+", type=_names(DTYPES, "dtype"), default=[list(DTYPES)],
                   help="default: " + ", ".join(DTYPES))
    p.add_argument("--out", default="tunekit-bench", help="report folder (default: ./tunekit-bench)")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, 3 repeats, no torch.compile unless --compile: a smoke run (CPU-only machines too)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--repeats", type=int, help="measurements per median (default: 15 activations, 10 logsumexp; 3 quick)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also time torch.compile (default: on, off with --quick)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="PNG plots (needs matplotlib)")
    p.add_argument("--time-limit", type=float,
                   help="seconds after which no new logsumexp row starts (--first-use: for the whole run)")
    p.add_argument("--first-use", action="store_true",
                   help=("instead of the suites: the first-use benchmark (fresh processes, default settings, empty "
                         "and warm caches; first-call wall, calls until final, device time against offline tuning, "
                         "eager and torch.compile) into --out/first_use-<device>.json and .md"))


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE.json",
                   help="results: benchmarks/results/*.json, a bench folder's JSON, or tunekit explore --json output")
    p.add_argument("--out", default="tunekit-report", help="folder for the plots and report.md (default: ./tunekit-report)")
    p.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="plots to draw, shell patterns on their names, e.g. 'activations-silu-*' logsumexp-overview")
    p.add_argument("--prefix", default="", help="start every file name with this (e.g. h200-)")
    p.add_argument("--markdown", action=argparse.BooleanOptionalAction, default=True, help="also report.md and tables")
    p.add_argument("--dpi", type=int, default=100)


def first_use_command(args, device) -> int:
    """``tunekit bench --first-use``: the first-use benchmark of the families of ``--ops``; a GPU run is
    "full" (``--quick``: fewer logsumexp shapes), a CPU run the smoke run (tiny shapes, no compile)."""
    from .suites import first_use

    ops, dtypes = _flatten(args.ops), _flatten(args.dtypes)
    # a family's process measures both directions: silu_backward -> silu, gelu -> gelu and gelu_tanh
    families = list(dict.fromkeys(case.removesuffix("_bwd") if suite == "activations" else suite
                                  for suite, cases in (BENCH_OPS[op] for op in ops) for case in cases))
    options = dict(first_use.PRESETS["smoke" if device.type == "cpu" else "quick" if args.quick else "full"])
    options.update(families=families, dtypes=dtypes, device=str(device))
    for key, value in (("repeats", args.repeats), ("compile", args.compile), ("time_limit", args.time_limit)):
        if value is not None:
            options[key] = value
    command = " ".join(["tunekit bench --first-use", "--ops", ",".join(ops), "--dtypes", ",".join(dtypes), "--out",
                        str(args.out)] + ["--quick"] * args.quick)
    raw = first_use.run(**options, command=command, on_update=lambda partial: first_use.write_files(partial, args.out))
    files = first_use.write_files(raw, Path(args.out))
    print(f"wrote {len(files)} files into {args.out}: " + ", ".join(f.name for f in files))
    return 0


def bench_command(args, device) -> int:
    """``tunekit bench`` (the CLI resolves ``device``)."""
    from .plots import MatplotlibMissing

    if args.first_use:
        return first_use_command(args, device)
    ops, dtypes = _flatten(args.ops), _flatten(args.dtypes)
    command = " ".join(["tunekit bench", "--ops", ",".join(ops), "--dtypes", ",".join(dtypes), "--out", str(args.out)]
                       + ["--quick"] * args.quick + ([f"--repeats {args.repeats}"] if args.repeats else [])
                       + ([] if args.compile is None else ["--compile" if args.compile else "--no-compile"]))
    try:
        files = bench(ops=ops, dtypes=dtypes, out=Path(args.out), device=device,
                      quick=args.quick, repeats=args.repeats, compile=args.compile, plots=args.plots,
                      time_limit=args.time_limit, command=command)
    except MatplotlibMissing as exc:
        print(f"tunekit bench: {exc}; or run with --no-plots", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} files into {args.out}: " + ", ".join(f.name for f in files))
    return 0


def report_command(args) -> int:
    """``tunekit report`` and ``python -m tunekit.bench.report``."""
    from .plots import MatplotlibMissing

    try:
        files = report_from_files(args.files, Path(args.out), only=args.only, prefix=args.prefix,
                                  markdown=args.markdown, dpi=args.dpi,
                                  command="tunekit report " + " ".join(args.files))
    except MatplotlibMissing as exc:
        print(f"tunekit report: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError) as exc:
        print(f"tunekit report: cannot read the results: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not files:
        print("tunekit report: nothing written (no plot matched --only)", file=sys.stderr)
        return 1
    for f in files:
        print(f)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tunekit.bench.report", description=__doc__.splitlines()[0])
    add_report_arguments(parser)
    return report_command(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
