"""logsumexp forward and backward over the issue's shapes: every candidate, the tuned choice, torch
eager and torch.compile, checked against the issue's targets, all in one run.

Run: ``PYTHONPATH=src python benchmarks/logsumexp.py [--dtypes float32,float16] [--no-compile]
[--no-backward] [--out DIR]``. Writes ``logsumexp-<device>.md`` (targets summary and tables) and
``.json`` (every raw number) into ``--out`` after every shape, so a run cut short keeps what it
measured; prints the Markdown at the end. A full run (3 dtypes, forward and backward, compile: 54
rows, 54 torch.compile compilations, most of the time) is estimated at 4-6 minutes on an H200;
``--time-limit`` (default 420 s) starts no new row after that, so the run ends inside 10 minutes.

Method, as ``benchmarks/activations.py`` (whose docstring has the longer reasons):

- Device time from CUDA-graph replays (``tunekit.bench.time_callable``, ``graph=True``): host launch
  cost is not the op's, and the small shapes run in microseconds.
- Inputs rotated over the copies ``input_sets`` makes (enough to overflow L2 twice, the sets tuning
  uses): every run reads cold inputs. The median of ``--repeats`` measurements, per call.
- Every candidate that supports the params is first checked against the default's output (tuning's
  tolerance), then timed; one that raises, disagrees or fails to time is recorded, not fatal.
  Candidates not reached within ``--shape-budget`` seconds of a shape are recorded as skipped.
- The tuned choice is what ``op.resolve`` picks (tuning on the first call, in an in-memory store,
  ``--tuning-ms`` budget): the runtime's own decision, not the benchmark's best.
- Torch eager is ``torch.logsumexp`` and, backward, what autograd runs for it: the composite
  ``dy.unsqueeze(d) * exp(x - lse.unsqueeze(d))`` (torch's ``logsumexp_backward``); both allocate
  their result, as in a network. torch.compile (``dynamic=False``) compiles the same functions, once
  per shape and dtype (one compiled function per direction, recompiled per shape); its result is
  checked against the same math in float32.
- Bytes moved: forward x read + lse written; backward x read + dx written + dy and lse read. The
  1 GiB copy bandwidth (``copy_bandwidth``, read + write) is measured at the start and the end of
  the run; the start figure is the ceiling the targets are percentages of.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import tunekit  # noqa: E402
from tunekit.bench import copy_bandwidth, time_callable, versions  # noqa: E402
from tunekit.ops.logsumexp import logsumexp_backward_op, logsumexp_op  # noqa: E402
from tunekit.tunable.find_fastest import input_sets  # noqa: E402
from tunekit.tunable.numerics import compare  # noqa: E402
from tunekit.tunable.params import make_trial, output_tensors  # noqa: E402

SHAPES = [((32768, 64), -1), ((16384, 512), -1), ((8192, 1024), -1), ((4096, 4096), -1), ((1024, 32768), -1),
          ((64, 1048576), -1), ((4, 16777216), -1), ((4096, 4096), 0), ((32, 4096, 128), 1)]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BIG_INPUT = 32 * 2**20            # bandwidth targets apply to inputs of at least this many bytes
COPY_PCT = {"fwd": 90.0, "bwd": 85.0}
EAGER_SPEEDUP, EAGER_DTYPES = 5.0, ("float16", "bfloat16")
# key: (direction, column title, description); "extra" targets are shown but are not the issue's
TARGETS = {
    "fwd_copy": ("fwd", "fwd % copy", f"forward tuned >= {COPY_PCT['fwd']:.0f}% of the copy bandwidth (input >= 32 MiB)"),
    "fwd_eager": ("fwd", "fwd x eager", f"forward tuned >= {EAGER_SPEEDUP:.0f}x torch eager (float16, bfloat16)"),
    "fwd_compile": ("fwd", "fwd tuned/compile", "forward tuned faster than torch.compile"),
    "bwd_copy": ("bwd", "bwd % copy", f"backward tuned >= {COPY_PCT['bwd']:.0f}% of the copy bandwidth (input >= 32 MiB)"),
    "bwd_compile": ("bwd", "bwd tuned/compile", "extra, not an issue target: backward tuned faster than torch.compile"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def shape_text(shape) -> str:
    return "x".join(str(s) for s in shape)


def parse_shapes(text: str) -> list[tuple[tuple[int, ...], int]]:
    """``"4096x4096:0,32768x64"`` -> [((4096, 4096), 0), ((32768, 64), -1)] (dim -1 when not given)."""
    out = []
    try:
        for item in filter(None, text.split(",")):
            shape, _, dim = item.partition(":")
            out.append((tuple(int(s) for s in shape.lower().split("x")), int(dim) if dim else -1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shapes {text!r}: expected e.g. 4096x4096:0,32768x64") from None
    return out


def parse_dtypes(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    if not names or any(n not in DTYPES for n in names):
        raise argparse.ArgumentTypeError(f"dtypes from {', '.join(DTYPES)}, got {text!r}")
    return names


def pct(nbytes, ms, gbps) -> float | None:
    return None if not ms or not gbps else 100 * nbytes / (ms * 1e-3) / 1e9 / gbps


def fmt(v, spec=".1f", none="–") -> str:
    return none if v is None else format(v, spec)


# -- targets (pure: rows are plain dicts, so tests/test_benchmark_logsumexp.py checks them on the CPU) --
def evaluate(row: dict, gbps: float) -> dict[str, tuple[float | None, str]]:
    """{target key: (value, verdict)} for the targets of ``row``'s direction. A row needs "direction",
    "dtype", "input_bytes", "bytes", "tuned_ms", "eager_ms", "compile_ms" (None when not measured).
    Verdicts: "pass", "fail", "n/a" (the target does not apply here), "missing" (not measured)."""
    d, tuned = row["direction"], row.get("tuned_ms")
    out = {}
    for key, (direction, _, _) in TARGETS.items():
        if direction != d:
            continue
        if key.endswith("_copy"):
            value = pct(row["bytes"], tuned, gbps)
            applies, ok = row["input_bytes"] >= BIG_INPUT, value is not None and value >= COPY_PCT[d]
        elif key.endswith("_eager"):
            value = row["eager_ms"] / tuned if tuned and row.get("eager_ms") else None
            applies, ok = row["dtype"] in EAGER_DTYPES, value is not None and value >= EAGER_SPEEDUP
        else:
            value = tuned / row["compile_ms"] if tuned and row.get("compile_ms") else None
            applies, ok = True, value is not None and value < 1.0
        out[key] = (value, "n/a" if not applies else "missing" if value is None else "pass" if ok else "fail")
    return out


def summary_lines(rows: list[dict], gbps: float) -> list[str]:
    """The targets table (one line per shape, dim and dtype; forward and backward side by side) and
    a count of verdicts per target."""
    keys = {}
    for r in rows:
        keys.setdefault((tuple(r["shape"]), r["dim"], r["dtype"]), {}).update(evaluate(r, gbps))
    specs = {"fwd_copy": ".1f", "fwd_eager": ".1f", "fwd_compile": ".2f", "bwd_copy": ".1f", "bwd_compile": ".2f"}
    lines = ["| shape | dim | dtype | " + " | ".join(t[1] for t in TARGETS.values()) + " |",
             "|---|---|---|" + "---:|" * len(TARGETS)]
    counts = {k: {"pass": 0, "fail": 0, "n/a": 0, "missing": 0} for k in TARGETS}
    for (shape, dim, dtype), verdicts in keys.items():
        cells = []
        for k in TARGETS:
            value, verdict = verdicts.get(k, (None, "missing"))
            counts[k][verdict] += 1
            text = fmt(value, specs[k])
            cells.append({"pass": f"{text} PASS", "fail": f"**{text} FAIL**", "n/a": f"({text})"}.get(verdict, "–"))
        lines.append(f"| {shape_text(shape)} | {dim} | {dtype} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {TARGETS[k][2]}: **{c['pass']} pass, {c['fail']} fail**, {c['n/a']} n/a, "
                     f"{c['missing']} not measured" for k, c in counts.items()]
    return lines


# -- measurement ------------------------------------------------------------------------------
def reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def per_call(fn, sets, device, repeats) -> tuple[float, float]:
    """(median ms per call of ``fn(params)`` over the rotated input sets, spread), graph replay."""
    def run_all():
        for p in sets:
            fn(p)
    ms, spread = time_callable(run_all, device, repeats=repeats, graph=device.type == "cuda")
    return ms / len(sets), spread


def measure_candidates(op, params, repeats: int, budget_s: float) -> tuple[dict, list]:
    """``tunekit.bench.measure_candidates`` with every step guarded and a time cap; also returns the
    input sets, which eager and compile reuse."""
    device, start, out = params.device, time.perf_counter(), {}
    reference = output_tensors(op.default.run(make_trial(params)))
    tol = op.tolerance(params)
    sets = input_sets(params, make_trial(params))
    for c in op.candidates:
        if time.perf_counter() - start > budget_s:
            out[c.name] = {"status": "skipped", "reason": f"shape time cap of {budget_s:.0f} s reached"}
            continue
        try:
            why = c.supports(params)
        except Exception as exc:
            why = f"supports() raised {reason(exc)}"
        if why:
            out[c.name] = {"status": "unsupported", "reason": why}
            continue
        try:
            got = output_tensors(c.run(make_trial(params)))
            problem = next((p for p in (compare(g, r, tol) for g, r in zip(got, reference)) if p), None)
            if problem:
                out[c.name] = {"status": "numerics", "reason": problem}
                continue
            ms, spread = per_call(c.run, sets, device, repeats)
            out[c.name] = {"status": "ok", "time_ms": ms, "spread": spread}
        except Exception as exc:  # a failing candidate is a result, not the end of the run
            out[c.name] = {"status": "error", "reason": reason(exc)}
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out, sets


def lse_backward_composite(dy, x, lse, dims):
    """What autograd runs for torch.logsumexp (torch's ``logsumexp_backward``), keepdim=False."""
    for d in dims:
        dy, lse = dy.unsqueeze(d), lse.unsqueeze(d)
    return dy * torch.exp(x - lse)


def forward_eager(x, dims):
    return torch.logsumexp(x, dims)


DIRECTIONS = {  # op, example maker, eager function, the params' tensors it takes
    "fwd": (logsumexp_op, logsumexp_op.make_example, forward_eager, ("x",)),
    "bwd": (logsumexp_backward_op, logsumexp_backward_op.make_example, lse_backward_composite, ("dy", "x", "lse")),
}


def measure_row(direction, shape, dim, dname, device, args, compiled) -> dict:
    op, make_example, eager_fn, fields = DIRECTIONS[direction]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    params = make_example(shape, DTYPES[dname], device, dim=dim)
    row = {"direction": direction, "shape": list(shape), "dim": dim, "dtype": dname, "signature": params.signature(),
           "input_bytes": params.x.numel() * params.x.element_size(), "bytes": params.bytes_moved(),
           "tuned": None, "tuned_ms": None, "eager_ms": None, "compile_ms": None, "errors": {}}
    cands, sets = measure_candidates(op, params, args.repeats, args.shape_budget)
    row["candidates"], row["input_sets"] = cands, len(sets)
    ok = {n: c["time_ms"] for n, c in cands.items() if c["status"] == "ok"}
    if ok:
        best = min(ok, key=ok.get)
        row["best"] = {"name": best, "time_ms": ok[best]}
    inputs = lambda q: [getattr(q, f) for f in fields] + [q.dims]  # noqa: E731
    try:
        with tunekit.tuning(results=":memory:", max_tuning_ms=args.tuning_ms):
            r = op.resolve(params)
        row["tuned"] = {"name": r.candidate.name, "why": r.why}
        row["tuned_ms"] = ok.get(r.candidate.name) or per_call(r.candidate.run, sets, device, args.repeats)[0]
    except Exception as exc:
        row["errors"]["tuned"] = reason(exc)
    try:
        row["eager_ms"] = per_call(lambda q: eager_fn(*inputs(q)), sets, device, args.repeats)[0]
    except Exception as exc:
        row["errors"]["eager"] = reason(exc)
    if compiled is not None:
        fn = compiled[direction]
        try:
            c0 = time.perf_counter()
            got = fn(*inputs(sets[0]))  # compiles this shape and dtype, once
            row["compile_s"] = time.perf_counter() - c0
            # against the same math in float32 (Inductor computes 16-bit inputs in fp32, rounding once;
            # eager rounds every step, 2-3% off in bf16 backward), with tuning's tolerance
            ref = eager_fn(*[t.float() if isinstance(t, torch.Tensor) else t for t in inputs(sets[0])])
            problem = compare(got, ref.to(got.dtype), op.tolerance(params))
            if problem:
                raise AssertionError(f"torch.compile result: {problem}")
            row["compile_ms"] = per_call(lambda q: fn(*inputs(q)), sets, device, args.repeats)[0]
        except Exception as exc:
            row["errors"]["compile"] = reason(exc)
    row["seconds"] = time.perf_counter() - t0
    return row


# -- report -----------------------------------------------------------------------------------
def detail_lines(rows: list[dict], direction: str, gbps: float) -> list[str]:
    title = {"fwd": "Forward: logsumexp(x, dim)", "bwd": "Backward: dx = dy * exp(x - lse)"}[direction]
    lines = [f"## {title}", "", "Cells: % of the copy bandwidth; µs per call in brackets.", "",
             ("| shape | dim | dtype | tuned choice | tuned | best candidate | best | torch eager | torch.compile | "
              "eager / tuned | compile / tuned |"), "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    cell = lambda r, ms: "–" if not ms else f"{fmt(pct(r['bytes'], ms, gbps))} ({ms * 1e3:.1f})"  # noqa: E731
    for r in rows:
        best, t = r.get("best") or {}, r["tuned_ms"]
        lines.append(f"| {shape_text(r['shape'])} | {r['dim']} | {r['dtype']} | {(r['tuned'] or {}).get('name', 'error')} | "
                     f"{cell(r, t)} | {best.get('name', '–')} | {cell(r, best.get('time_ms'))} | {cell(r, r['eager_ms'])} | "
                     f"{cell(r, r['compile_ms'])} | {fmt(t and r['eager_ms'] and r['eager_ms'] / t, '.2f')} | "
                     f"{fmt(t and r['compile_ms'] and r['compile_ms'] / t, '.2f')} |")
    errors = [f"- {shape_text(r['shape'])} dim {r['dim']} {r['dtype']}, {what}: `{e}`"
              for r in rows for what, e in r["errors"].items()]
    if errors:
        lines += ["", "Errors:", ""] + errors
    for dname in dict.fromkeys(r["dtype"] for r in rows):
        sub = [r for r in rows if r["dtype"] == dname]
        names = [n for n in sub[0]["candidates"] if any(r["candidates"].get(n, {}).get("status") not in
                                                         (None, "unsupported") for r in sub)]
        lines += ["", (f"<details><summary>{direction} {dname}: every candidate, µs per call (* tuned choice); "
                       "unsupported everywhere left out (the JSON has them)</summary>"), "",
                  "| candidate | " + " | ".join(f"{shape_text(r['shape'])}:{r['dim']}" for r in sub) + " |",
                  "|---|" + "---:|" * len(sub)]
        for n in names:
            cells = []
            for r in sub:
                c = r["candidates"].get(n, {"status": "–"})
                mark = "*" if (r["tuned"] or {}).get("name") == n else ""
                cells.append(mark + (f"{c['time_ms'] * 1e3:.1f}" if c["status"] == "ok" else c["status"]))
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines += ["", "</details>"]
    return lines + [""]


def render(meta: dict, rows: list[dict]) -> str:
    gbps = meta["copy_gbps_start"]
    end = meta.get("copy_gbps_end")
    timer = "host timer" if meta["args"].get("device") == "cpu" else "CUDA-graph replay, L2-cold inputs"
    lines = [f"# logsumexp, {meta['device']} ({meta['date'][:10]})", "",
             (f"torch {meta['versions']['torch']}, CUDA {meta['versions']['cuda']}, triton {meta['versions']['triton']}; "
              f"`{meta['command']}`; {timer}, median of {meta['args']['repeats']}; "
              f"{'run took' if end else 'partial: ran'} {meta['elapsed_s']:.0f} s, torch.compile "
              f"{sum(r.get('compile_s', 0) for r in rows):.0f} s of it. Method: the script's docstring."), "",
             (f"1 GiB copy bandwidth (read + write): **{gbps:.0f} GB/s** at the start"
              + (f", {end:.0f} GB/s at the end." if end else ".") + " Every % is of the start figure."), "",
             "## Targets", "",
             ("Bandwidth cells: tuned % of copy; applies where the input is >= 32 MiB. 'x eager': torch eager time / "
              "tuned time; applies to float16 and bfloat16. 'tuned/compile': tuned time / torch.compile time, "
              "passes below 1. (n/a) in brackets, – not measured."), ""]
    lines += summary_lines(rows, gbps) + [""]
    if meta.get("not_measured"):
        lines += ["Not measured (run time limit): " + ", ".join(meta["not_measured"]), ""]
    for d in ("fwd", "bwd"):
        sub = [r for r in rows if r["direction"] == d]
        if sub:
            lines += detail_lines(sub, d, gbps)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Method: see the module docstring (benchmarks/logsumexp.py).")
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
    started = time.perf_counter()
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    directions = [d for d, on in (("fwd", args.forward), ("bwd", args.backward)) if on]
    compiled = None
    if not args.no_compile:
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4096)
        compiled = {d: torch.compile(DIRECTIONS[d][2], dynamic=False) for d in directions}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{args.stem}-{device_name.replace(' ', '_')}.md"
    meta = {"device": device_name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions(),
            "command": " ".join(["python benchmarks/logsumexp.py"] + (argv if argv is not None else sys.argv[1:])),
            "args": {**vars(args), "shapes": [[list(s), d] for s, d in args.shapes]},
            "copy_gbps_start": copy_bandwidth(device), "not_measured": []}
    log(f"{device_name}: copy {meta['copy_gbps_start']:.0f} GB/s (read + write)")
    rows = []

    def write(final: bool) -> str:
        meta["elapsed_s"] = time.perf_counter() - started
        text = render(meta, rows)
        md.write_text(text)
        md.with_suffix(".json").write_text(json.dumps({**meta, "final": final, "rows": rows}, indent=1, default=str) + "\n")
        return text

    for dname in args.dtypes:
        for shape, dim in args.shapes:
            for direction in directions:
                label = f"{direction} {shape_text(shape)} dim {dim} {dname}"
                if time.perf_counter() - started > args.time_limit:
                    meta["not_measured"].append(label)
                    continue
                try:
                    r = measure_row(direction, shape, dim, dname, device, args, compiled)
                except Exception as exc:  # e.g. out of memory making the example: record, go on
                    log(f"{label}: failed: {reason(exc)}")
                    meta["not_measured"].append(f"{label} ({reason(exc)})")
                    continue
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                rows.append(r)
                v = evaluate(r, meta["copy_gbps_start"])
                log(f"{label}: tuned {(r['tuned'] or {}).get('name')} {fmt(pct(r['bytes'], r['tuned_ms'], meta['copy_gbps_start']))}% "
                    f"| eager {fmt(pct(r['bytes'], r['eager_ms'], meta['copy_gbps_start']))}% | compile "
                    f"{fmt(pct(r['bytes'], r['compile_ms'], meta['copy_gbps_start']))}% | "
                    + " ".join(f"{k}={verdict}" for k, (_, verdict) in v.items())
                    + f" [{r['seconds']:.1f} s, compile {r.get('compile_s', 0):.1f} s; total {time.perf_counter() - started:.0f} s]")
                write(final=False)
    meta["copy_gbps_end"] = copy_bandwidth(device)
    text = write(final=True)
    print(text)
    log(f"wrote {md} and {md.with_suffix('.json')}; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
