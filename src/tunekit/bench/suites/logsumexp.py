"""logsumexp forward and backward over the benchmark's shapes (``SHAPES``): every candidate, the
tuned choice, torch eager and torch.compile, checked against the targets (``TARGETS``), all in one run.

Used by ``benchmarks/suites/logsumexp.py`` and ``tunekit bench``: ``run`` returns the raw numbers (the JSON
the script writes), ``render`` the Markdown made from them.

Method, as :mod:`tunekit.bench.suites.activations` (whose docstring has the longer reasons):

- Device time from CUDA-graph replays (``tunekit.bench.measure.time_callable``, ``graph=True``): host launch
  cost is not the op's, and the small shapes run in microseconds.
- Inputs rotated over the copies ``input_sets`` makes (enough to overflow L2 twice, the sets tuning
  uses): every run reads cold inputs. The median of ``repeats`` measurements, per call.
- Every candidate that supports the params is first checked against the default's output (tuning's
  tolerance), then timed; one that raises, disagrees or fails to time is recorded, not fatal.
  Candidates not reached within ``shape_budget`` seconds of a shape are recorded as skipped.
- The tuned choice is what ``op.resolve`` picks (tuning on the first call, in an in-memory store,
  ``tuning_ms`` budget): the runtime's own decision, not the benchmark's best.
- Torch eager is ``torch.logsumexp`` and, backward, what autograd runs for it: the composite
  ``dy.unsqueeze(d) * exp(x - lse.unsqueeze(d))`` (torch's ``logsumexp_backward``). torch.compile
  (``dynamic=False``) compiles the same functions as ``out.copy_(f(...))`` (:func:`written`), once per
  shape and dtype; its result is checked against the same math in float32. Every contender writes
  each set's own output (eager through ``out=``; Inductor fuses the copy into its kernel), as the
  candidates do: a result allocated per call lands in the caching allocator's recycled block, hot in
  L2 at the small shapes, while the sets' outputs rotate (timed allocating, Inductor's backward ran
  10.05 us at 16384x512 float16 on an H100, faster than a 12.99 us copy of its bytes into rotating
  buffers: ``benchmarks/experiments/logsumexp_backward_vs_inductor.py``).
- Bytes moved: forward x read + lse written; backward x read + dx written + dy and lse read. The
  1 GiB copy bandwidth (``copy_bandwidth``, read + write) is measured at the start and the end of
  the run; the start figure is the ceiling the targets are percentages of.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..measure import copy_bandwidth, measure_candidates, time_callable, versions
from ...ops.logsumexp import logsumexp_backward_op, logsumexp_op
from ...tunable import tuning
from ...tunable.numerics import compare
from ...tunable.params import make_trial
from ...tunable.screen import input_sets
from .common import DTYPES, device_name, fmt, pct, raise_compile_limits, reason, shape_text, timing_label
from .progress import LogLines

SHAPES = [((32768, 64), -1), ((16384, 512), -1), ((8192, 1024), -1), ((4096, 4096), -1), ((1024, 32768), -1),
          ((64, 1048576), -1), ((4, 16777216), -1), ((4096, 4096), 0), ((32, 4096, 128), 1)]
QUICK_SHAPES = [((64, 64), -1), ((16, 1024), -1), ((64, 64), 0)]
BIG_INPUT = 32 * 2**20            # bandwidth targets apply to inputs of at least this many bytes
COPY_PCT = {"fwd": 90.0, "bwd": 85.0}
EAGER_SPEEDUP, EAGER_DTYPES = 5.0, ("float16", "bfloat16")
# key: (direction, column title, description); "extra" targets are shown but not counted as targets
TARGETS = {
    "fwd_copy": ("fwd", "fwd % copy", f"forward tuned >= {COPY_PCT['fwd']:.0f}% of the copy bandwidth (input >= 32 MiB)"),
    "fwd_eager": ("fwd", "fwd x eager", f"forward tuned >= {EAGER_SPEEDUP:.0f}x torch eager (float16, bfloat16)"),
    "fwd_compile": ("fwd", "fwd tuned/compile", "forward tuned faster than torch.compile"),
    "bwd_copy": ("bwd", "bwd % copy", f"backward tuned >= {COPY_PCT['bwd']:.0f}% of the copy bandwidth (input >= 32 MiB)"),
    "bwd_compile": ("bwd", "bwd tuned/compile", "extra, not an issue target: backward tuned faster than torch.compile"),
}


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
def per_call(fn, sets, device, repeats) -> tuple[float, float]:
    """(median ms per call of ``fn(params)`` over the rotated input sets, spread), graph replay."""
    def run_all():
        for p in sets:
            fn(p)
    ms, spread = time_callable(run_all, device, repeats=repeats, graph=device.type == "cuda")
    return ms / len(sets), spread


def measure_all(op, params, repeats: int, budget_s: float) -> dict:
    """Every candidate screened and timed (:func:`tunekit.bench.measure.measure_candidates`, with a
    time cap), as the JSON rows of this suite."""
    out = {}
    for name, t in measure_candidates(op, params, repeats=repeats, graph=params.device.type == "cuda",
                                      budget_s=budget_s).items():
        out[name] = ({"status": "ok", "time_ms": t.time_ms, "spread": t.spread} if t.status == "ok"
                     else {"status": t.status, "reason": t.reason})
    return out


def lse_backward_composite(dy, x, lse, dims, out=None):
    """What autograd runs for torch.logsumexp (torch's ``logsumexp_backward``), keepdim=False; ``out``:
    the last op writes it."""
    for d in dims:
        dy, lse = dy.unsqueeze(d), lse.unsqueeze(d)
    return dy * torch.exp(x - lse) if out is None else torch.mul(dy, torch.exp(x - lse), out=out)


def forward_eager(x, dims, out=None):
    return torch.logsumexp(x, dims) if out is None else torch.logsumexp(x, dims, out=out)


def written(fn):
    """``fn(*inputs, out)`` as ``out.copy_(fn(*inputs))``: what torch.compile is given (Inductor fuses the
    copy into its kernel, which then writes ``out``)."""
    def write(*args):
        *inputs, out = args
        return out.copy_(fn(*inputs))
    return write


DIRECTIONS = {  # op, example maker, eager function, the params' tensors it takes
    "fwd": (logsumexp_op, logsumexp_op.make_example, forward_eager, ("x",)),
    "bwd": (logsumexp_backward_op, logsumexp_backward_op.make_example, lse_backward_composite, ("dy", "x", "lse")),
}


def measure_row(direction, shape, dim, dname, device, compiled, *, repeats: int = 10, tuning_ms: float = 2000.0,
                shape_budget: float = 40.0) -> dict:
    op, make_example, eager_fn, fields = DIRECTIONS[direction]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    params = make_example(shape, DTYPES[dname], device, dim=dim)
    row = {"direction": direction, "shape": list(shape), "dim": dim, "dtype": dname, "signature": params.signature(),
           "input_bytes": params.x.numel() * params.x.element_size(), "bytes": params.bytes_moved(),
           "tuned": None, "tuned_ms": None, "eager_ms": None, "compile_ms": None, "errors": {}}
    cands = measure_all(op, params, repeats, shape_budget)
    sets = input_sets(params, make_trial(params))
    row["candidates"], row["input_sets"] = cands, len(sets)
    ok = {n: c["time_ms"] for n, c in cands.items() if c["status"] == "ok"}
    if ok:
        best = min(ok, key=ok.get)
        row["best"] = {"name": best, "time_ms": ok[best]}
    inputs = lambda q: [getattr(q, f) for f in fields] + [q.dims]
    inputs_out = lambda q: inputs(q) + [q.out]  # noqa: E731 - every contender writes the set's own output
    try:
        with tuning(results=":memory:", max_tuning_ms=tuning_ms):
            r = op.resolve(params)
        row["tuned"] = {"name": r.candidate.name, "why": r.why}
        row["tuned_ms"] = ok.get(r.candidate.name) or per_call(r.candidate.run, sets, device, repeats)[0]
    except Exception as exc:
        row["errors"]["tuned"] = reason(exc)
    try:
        row["eager_ms"] = per_call(lambda q: eager_fn(*inputs_out(q)), sets, device, repeats)[0]
    except Exception as exc:
        row["errors"]["eager"] = reason(exc)
    if compiled is not None:
        fn = compiled[direction]
        try:
            c0 = time.perf_counter()
            got = fn(*inputs_out(sets[0])).clone()  # compiles this shape and dtype, once
            row["compile_s"] = time.perf_counter() - c0
            # against the same math in float32 (Inductor computes 16-bit inputs in fp32, rounding once;
            # eager rounds every step, 2-3% off in bf16 backward), with tuning's tolerance
            ref = eager_fn(*[t.float() if isinstance(t, torch.Tensor) else t for t in inputs(sets[0])])
            problem = compare(got, ref.to(got.dtype), op.tolerance(params))
            if problem:
                raise AssertionError(f"torch.compile result: {problem}")
            row["compile_ms"] = per_call(lambda q: fn(*inputs_out(q)), sets, device, repeats)[0]
        except Exception as exc:
            row["errors"]["compile"] = reason(exc)
    row["seconds"] = time.perf_counter() - t0
    return row


def run(*, dtypes: list[str], shapes: list[tuple[tuple[int, ...], int]], device: torch.device,
        directions: tuple[str, ...] = ("fwd", "bwd"), repeats: int = 10, compile: bool = True,
        tuning_ms: float = 2000.0, shape_budget: float = 40.0, time_limit: float | None = 420.0, args: dict | None = None,
        command: str = "python benchmarks/suites/logsumexp.py", progress=None, on_row=None) -> dict:
    """Measure every dtype x shape x direction; returns the raw numbers (the script's JSON: the run's
    facts, ``final`` and ``rows``). No new row starts after ``time_limit`` seconds (None: no limit);
    rows not reached are listed in ``not_measured``. ``on_row(raw)`` gets the partial result after
    every row (the script writes its files then, so a run cut short keeps what it measured)."""
    progress = progress or LogLines()
    started = time.perf_counter()
    name = device_name(device)
    compiled = None
    if compile:
        raise_compile_limits()
        compiled = {d: torch.compile(written(DIRECTIONS[d][2]), dynamic=False) for d in directions}
    if args is None:
        args = {"dtypes": list(dtypes), "shapes": [[list(s), d] for s, d in shapes], "backward": "bwd" in directions,
                "forward": "fwd" in directions, "no_compile": not compile, "repeats": repeats, "tuning_ms": tuning_ms,
                "shape_budget": shape_budget, "time_limit": time_limit, "device": str(device)}
    meta = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions(), "command": command,
            "args": args, "copy_gbps_start": copy_bandwidth(device), "not_measured": []}
    gbps = meta["copy_gbps_start"]
    progress.note(f"{name}: copy {gbps:.0f} GB/s (read + write)")
    rows = []
    for dname in dtypes:
        for shape, dim in shapes:
            for direction in directions:
                label = f"{direction} {shape_text(shape)} dim {dim} {dname}"
                if time_limit is not None and time.perf_counter() - started > time_limit:
                    meta["not_measured"].append(label)
                    progress.step(f"{label}: not measured (time limit)")
                    continue
                try:
                    r = measure_row(direction, shape, dim, dname, device, compiled, repeats=repeats,
                                    tuning_ms=tuning_ms, shape_budget=shape_budget)
                except Exception as exc:  # e.g. out of memory making the example: record, go on
                    meta["not_measured"].append(f"{label} ({reason(exc)})")
                    progress.step(f"{label}: failed: {reason(exc)}")
                    continue
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                rows.append(r)
                v = evaluate(r, gbps)
                progress.step(f"{label}: tuned {(r['tuned'] or {}).get('name')} {fmt(pct(r['bytes'], r['tuned_ms'], gbps))}% "
                              f"| eager {fmt(pct(r['bytes'], r['eager_ms'], gbps))}% | compile "
                              f"{fmt(pct(r['bytes'], r['compile_ms'], gbps))}% | "
                              + " ".join(f"{k}={verdict}" for k, (_, verdict) in v.items())
                              + f" [{r['seconds']:.1f} s, compile {r.get('compile_s', 0):.1f} s; "
                              f"total {time.perf_counter() - started:.0f} s]")
                if on_row is not None:
                    meta["elapsed_s"] = time.perf_counter() - started
                    on_row({**meta, "final": False, "rows": rows})
    meta["copy_gbps_end"] = copy_bandwidth(device)
    meta["elapsed_s"] = time.perf_counter() - started
    return {**meta, "final": True, "rows": rows}


# -- report -----------------------------------------------------------------------------------
def detail_lines(rows: list[dict], direction: str, gbps: float) -> list[str]:
    title = {"fwd": "Forward: logsumexp(x, dim)", "bwd": "Backward: dx = dy * exp(x - lse)"}[direction]
    lines = [f"## {title}", "", "Cells: % of the copy bandwidth; µs per call in brackets.", "",
             ("| shape | dim | dtype | tuned choice | tuned | best candidate | best | torch eager | torch.compile | "
              "eager / tuned | compile / tuned |"), "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    cell = lambda r, ms: "–" if not ms else f"{fmt(pct(r['bytes'], ms, gbps))} ({ms * 1e3:.1f})"
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
    """The Markdown report: header (versions, command, copy bandwidth), the targets, the tables."""
    gbps = meta["copy_gbps_start"]
    end = meta.get("copy_gbps_end")
    on_cpu = meta["args"].get("device") == "cpu"
    timer = timing_label("cpu" if on_cpu else "cuda")
    lines = [f"# logsumexp, {meta['device']} ({meta['date'][:10]})", "",
             (f"torch {meta['versions']['torch']}, CUDA {meta['versions']['cuda']}, triton {meta['versions']['triton']}; "
              f"`{meta['command']}`; {timer}, median of {meta['args']['repeats']}; "
              f"{'run took' if end else 'partial: ran'} {meta['elapsed_s']:.0f} s, torch.compile "
              f"{sum(r.get('compile_s', 0) for r in rows):.0f} s of it. Method: the script's docstring."), "",
             (f"{'256 MiB' if on_cpu else '1 GiB'} copy bandwidth (read + write): **{gbps:.0f} GB/s** at the start"
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
