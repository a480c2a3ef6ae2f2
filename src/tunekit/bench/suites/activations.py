"""Activation ops (silu, gelu, gelu-tanh; forward and backward): every tunekit candidate, the tuned
choice, torch eager and ``torch.compile``, against the copy bandwidth, all in one run.

Used by ``benchmarks/suites/activations.py`` and ``tunekit bench``. ``run`` returns the raw numbers (the
JSON the script writes), ``render`` the Markdown made from them.

Why the method is what it is:

- Device time from CUDA-graph replays (``tunekit.bench.measure``): host launch cost is not the op's cost,
  and the smallest shapes here run in a few microseconds, where launches would dominate.
- Inputs rotated over enough copies to overflow L2 twice (``input_sets`` + ``make_trial``, the
  sets tuning itself uses): every run reads cold inputs, as an activation in a network does. Every
  contender writes each set's own output, so all move the same bytes through the same memory.
- Every candidate is timed by ``tunekit.bench.measure.measure_candidates`` (the candidate table). The tuned
  choice (what ``op.resolve`` picks with a generous budget, in an in-memory store; shapes with one
  element count share a signature, hence a choice), torch eager, torch.compile and a same-size copy
  are then timed head to head (:func:`~tunekit.bench.suites.common.head_to_head`): on the same
  buffers, in rounds that rotate their order, median of the rounds.
- The 1 GiB copy bandwidth (``copy_bandwidth``, eager launches) is measured at the start and at the
  end of the run, so drift shows; it is the headline ceiling (the targets are % of it). The
  same-size ``out.copy_(x)`` is a second ceiling, the faster of eager launches (launch-bound below
  a few MB) and a graph replay (a memcpy node, which may run on a slower copy engine).
- torch.compile (``dynamic=False``) compiles ``out.copy_(f(x))``, which Inductor fuses into one
  kernel writing ``out``. It is given the tensors flattened to 1-D: Inductor collapses contiguous
  pointwise loops to one dimension anyway, and shapes with one element count then share a compile.
  Its result is checked against eager's with tuning's tolerance.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..measure import copy_bandwidth, measure_candidates, versions
from ...tunable import tuning
from ...tunable.params import make_trial
from ...tunable.screen import input_sets
from ...tunable.registry import get_op
from .common import DTYPES, device_name, fmt, head_to_head, pct, raise_compile_limits, shape_text, timing_label
from .progress import LogLines

aten = torch.ops.aten
DEFAULT_SHAPES = [(s, k) for s in (1024, 2048, 4096) for k in (1024, 2048, 4096)] + [(8192, 8192)]
QUICK_SHAPES = [(32, 32), (64, 128), (128, 128)]  # under 32K elements: CPU kernels stay single-threaded
TARGET_SHAPES = [(4096, 4096), (8192, 8192)]
TARGET_PCT = {"fwd": 95.0, "bwd": 90.0}
TARGET_RATIO = 1.02


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    direction: str                 # "fwd" or "bwd"
    fields: tuple[str, ...]        # the params' input tensors, in the order the torch functions take them
    eager_out: Callable            # torch eager, writing into out=
    functional: Callable           # the same op returning a new tensor (what torch.compile compiles)
    op_args: dict = field(default_factory=dict)


def _gelu_cases(approx: str, stem: str) -> list[Case]:
    return [
        Case(stem, "gelu", "fwd", ("x",), lambda x, out: aten.gelu.out(x, approximate=approx, out=out),
             lambda x: F.gelu(x, approximate=approx), {"approximate": approx}),
        Case(stem + "_bwd", "gelu_backward", "bwd", ("dy", "x"),
             lambda dy, x, out: aten.gelu_backward.grad_input(dy, x, approximate=approx, grad_input=out),
             lambda dy, x: aten.gelu_backward(dy, x, approximate=approx), {"approximate": approx}),
    ]


CASES = {c.name: c for c in [
    Case("silu", "silu", "fwd", ("x",), lambda x, out: aten.silu.out(x, out=out), F.silu),
    Case("silu_bwd", "silu_backward", "bwd", ("dy", "x"),
         lambda dy, x, out: aten.silu_backward.grad_input(dy, x, grad_input=out), aten.silu_backward),
    *_gelu_cases("none", "gelu"), *_gelu_cases("tanh", "gelu_tanh"),
]}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    try:
        return [tuple(int(d) for d in s.lower().split("x")) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shapes {text!r}: expected e.g. 4096x4096,8192x8192") from None


def names_in(known):
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; known: {', '.join(known)}")
        return names
    return parse


def make_compiled(case: Case):
    def copy_into(*tensors):
        *inputs, out = tensors
        return out.copy_(case.functional(*inputs))
    return torch.compile(copy_into, dynamic=False)


def measure_shape(case, op, dtype, shape, device, repeats, graph, compiled, compile_error,
                  tuning_ms: float = 3000.0) -> dict:
    torch.manual_seed(0)
    params = op.make_example(shape, dtype=dtype, device=device, **case.op_args)
    nbytes = params.bytes_moved()
    row = {"shape": list(shape), "bytes": nbytes, "signature": params.signature()}
    timings = measure_candidates(op, params, repeats=repeats, graph=graph)
    row["candidates"] = {n: {"status": t.status, "reason": t.reason, "time_ms": t.time_ms, "spread": t.spread}
                         for n, t in timings.items()}
    with tuning(results=":memory:", max_tuning_ms=tuning_ms):
        r = op.resolve(params)
    row["tuned"] = {"name": r.candidate.name, "why": r.why, "candidate_table_ms": timings[r.candidate.name].time_ms}
    ok = {n: t.time_ms for n, t in timings.items() if t.status == "ok"}
    best = min(ok, key=ok.get)
    row["best"] = {"name": best, "time_ms": ok[best]}

    sets = input_sets(params, make_trial(params))
    row["input_sets"] = len(sets)
    tensors = {id(p): ([getattr(p, name) for name in case.fields], getattr(p, p.outputs[0])) for p in sets}
    xi = case.fields.index("x")
    contenders = {
        "tuned": (r.candidate.run, graph),
        "eager": (lambda p: case.eager_out(*tensors[id(p)][0], out=tensors[id(p)][1]), graph),
        # same-size copy, both ways: eager launches are the 1 GiB figure's way but launch-bound at small
        # sizes; a captured copy is a memcpy node (possibly a copy engine). The faster is the ceiling.
        "copy_eager": (lambda p: tensors[id(p)][1].copy_(tensors[id(p)][0][xi]), False),
    }
    if graph:
        contenders["copy_graph"] = (contenders["copy_eager"][0], True)
    row["compile_error"] = compile_error
    if compiled is not None and compile_error is None:
        flat = {k: [t.view(-1) for t in ins] + [out.view(-1)] for k, (ins, out) in tensors.items()}
        try:
            for p in sets:  # compile (once per element count) and warm up every set
                compiled(*flat[id(p)])
            ins, out = tensors[id(sets[0])]  # the compiled result must match eager's (tuning's tolerance)
            rtol, atol = op.tolerance(params)
            torch.testing.assert_close(out, case.eager_out(*ins, out=torch.empty_like(out)), rtol=rtol, atol=atol)
            contenders["compile"] = (lambda p: compiled(*flat[id(p)]), graph)
        except Exception as exc:  # record it and go on: the other columns still count
            text = str(exc).strip()
            row["compile_error"] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]
    times = head_to_head(contenders, sets, device, repeats)
    row["head_to_head"] = {n: {"time_ms": t, "spread": sp} for n, (t, sp) in times.items()}
    row["tuned"]["time_ms"] = times["tuned"][0]
    row["eager_ms"] = times["eager"][0]
    row["compile_ms"] = times["compile"][0] if "compile" in times else None
    row["copy_ms"] = min(times[n][0] for n in ("copy_eager", "copy_graph") if n in times)
    row["copy_bytes"] = 2 * params.x.numel() * params.x.element_size()
    return row


def run(*, cases: list[str], dtypes: list[str], shapes: list[tuple[int, ...]], device: torch.device,
        repeats: int = 15, compile: bool = True, tuning_ms: float = 3000.0, args: dict | None = None,
        command: str = "python benchmarks/suites/activations.py", progress=None) -> dict:
    """Measure every case x dtype x shape; returns the raw numbers (the script's JSON). ``progress``
    (:mod:`~tunekit.bench.suites.progress`) gets a note for the copy bandwidth and a step per row."""
    progress = progress or LogLines()
    started = time.perf_counter()
    graph = device.type == "cuda"
    name = device_name(device)
    if compile:
        raise_compile_limits()
    bw_start = copy_bandwidth(device)
    progress.note(f"{name}: {'1 GiB' if graph else '256 MiB'} copy {bw_start:.0f} GB/s (read + write)")
    results, skipped = {}, {}
    for case in (CASES[c] for c in cases):
        try:
            op = get_op(case.op)
        except KeyError as exc:
            progress.note(f"skipping {case.name}: {exc.args[0]}")
            skipped[case.name] = str(exc.args[0])
            for _ in range(len(dtypes) * len(shapes)):
                progress.step(f"{case.name}: skipped")
            continue
        for dname in dtypes:
            t0 = time.perf_counter()
            compiled, compile_error = None, None
            if compile:
                torch._dynamo.reset()
                try:
                    compiled = make_compiled(case)
                except Exception as exc:
                    compile_error = f"{type(exc).__name__}: {exc}"[:300]
            rows = []
            for shape in shapes:
                r = measure_shape(case, op, DTYPES[dname], shape, device, repeats, graph, compiled, compile_error,
                                  tuning_ms)
                rows.append(r)
                progress.step(f"{case.name} {dname} {shape_text(shape)}: tuned {r['tuned']['name']} "
                              f"{fmt(pct(r['bytes'], r['tuned']['time_ms'], bw_start))}% | eager "
                              f"{fmt(pct(r['bytes'], r['eager_ms'], bw_start))}% | compile "
                              f"{fmt(pct(r['bytes'], r['compile_ms'], bw_start))}% | copy "
                              f"{fmt(pct(r['copy_bytes'], r['copy_ms'], bw_start))}%  "
                              f"[{time.perf_counter() - started:.0f} s]")
                if graph:
                    torch.cuda.empty_cache()
            results[f"{case.name} {case.direction}, {dname}"] = {
                "case": case.name, "op": case.op, "dtype": dname, "rows": rows, "seconds": time.perf_counter() - t0}
    bw_end = copy_bandwidth(device)
    if args is None:
        args = {"cases": list(cases), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes], "repeats": repeats,
                "no_compile": not compile, "device": str(device)}
    return {"device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions(), "args": args,
            "command": command, "timing": timing_label(device.type), "copy_gbps_start": bw_start,
            "copy_gbps_end": bw_end, "elapsed_s": time.perf_counter() - started, "skipped": skipped,
            "results": results}


# -- report -----------------------------------------------------------------------------------
def case_tables(key: str, rows: list[dict], bw: float) -> list[str]:
    lines = [f"## {key}", "", ("| shape | tuned choice | µs | GB/s | % copy | % same-size copy | eager % copy | "
                               "compile % copy | same-size copy % copy | tuned/eager | best candidate (µs) |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        t = r["tuned"]["time_ms"]
        same = 100 * r["copy_ms"] * r["bytes"] / (t * r["copy_bytes"])
        comp = fmt(pct(r["bytes"], r["compile_ms"], bw)) if r["compile_ms"] else ("error" if r["compile_error"] else "–")
        lines.append(f"| {shape_text(r['shape'])} | **{r['tuned']['name']}** | {t * 1e3:.2f} | "
                     f"{r['bytes'] / (t * 1e-3) / 1e9:.0f} | {fmt(pct(r['bytes'], t, bw))} | {same:.1f} | "
                     f"{fmt(pct(r['bytes'], r['eager_ms'], bw))} | {comp} | {fmt(pct(r['copy_bytes'], r['copy_ms'], bw))} | "
                     f"{t / r['eager_ms']:.3f} | {r['best']['name']} ({r['best']['time_ms'] * 1e3:.2f}) |")
    errors = {r["compile_error"] for r in rows if r["compile_error"]}
    lines += [f"\ntorch.compile failed: `{e}`" for e in errors]
    names = [n for n in rows[0]["candidates"] if any(r["candidates"][n]["status"] != "unsupported" for r in rows)]
    hidden = len(rows[0]["candidates"]) - len(names)
    lines += ["", "<details><summary>every candidate, µs per call (* tuned choice)</summary>", "",
              "| candidate | " + " | ".join(shape_text(r["shape"]) for r in rows) + " |",
              "|---|" + "---:|" * len(rows)]
    for n in names:
        cells = [("*" if r["tuned"]["name"] == n else "") + f"{r['candidates'][n]['time_ms'] * 1e3:.2f}"
                 if r["candidates"][n]["status"] == "ok" else r["candidates"][n]["status"] for r in rows]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["| tuned choice, head to head | " + " | ".join(f"{r['tuned']['time_ms'] * 1e3:.2f}" for r in rows) + " |",
              "| torch eager | " + " | ".join(f"{r['eager_ms'] * 1e3:.2f}" for r in rows) + " |",
              "| torch.compile | " + " | ".join(fmt(r["compile_ms"] and r["compile_ms"] * 1e3, ".2f") for r in rows) + " |",
              "| same-size copy | " + " | ".join(f"{r['copy_ms'] * 1e3:.2f}" for r in rows) + " |", "",
              f"{hidden} candidates unsupported at every shape (another dtype, or no GPU) are left out; the JSON has them.",
              "", "</details>", ""]
    return lines


def summary(results: dict, bw: float, big: str = "1 GiB") -> list[str]:
    """Per case and dtype: the tuned choice at the target shapes as % of the 1 GiB copy (the target's
    measure) and, in brackets, as % of a copy of the same bytes (what any kernel moving them can
    reach at that size: below ~100 MB even a copy falls short of the 1 GiB figure)."""
    lines = ["## Summary", "", (f"Targets: tuned choice >= {TARGET_PCT['fwd']:.0f}% (forward) / {TARGET_PCT['bwd']:.0f}% "
                                f"(backward) of the {big} copy bandwidth at 4096x4096 and 8192x8192; tuned/eager "
                                f"device time <= {TARGET_RATIO} at every shape. Cells: % of the {big} copy "
                                "(% of a same-size copy, timed head to head)."), "",
             "| case | dtype | 4096x4096 | 8192x8192 | target | bandwidth | worst tuned/eager (shape) | ratio |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    for entry in results.values():
        rows, case = entry["rows"], CASES[entry["case"]]
        target = TARGET_PCT[case.direction]
        cells, verdicts = [], []
        for shape in TARGET_SHAPES:
            r = next((r for r in rows if tuple(r["shape"]) == shape), None)
            p = pct(r["bytes"], r["tuned"]["time_ms"], bw) if r else None
            same = 100 * r["copy_ms"] * r["bytes"] / (r["tuned"]["time_ms"] * r["copy_bytes"]) if r else None
            cells.append(fmt(p) + ("" if same is None else f" ({same:.1f})"))
            if p is not None:
                verdicts.append(p >= target)
        bw_verdict = "n/a" if not verdicts else "PASS" if all(verdicts) else "MISS"
        worst = max(rows, key=lambda r: r["tuned"]["time_ms"] / r["eager_ms"])
        ratio = worst["tuned"]["time_ms"] / worst["eager_ms"]
        lines.append(f"| {case.name} | {entry['dtype']} | {cells[0]} | {cells[1]} | {target:.0f} | {bw_verdict} | "
                     f"{ratio:.3f} ({shape_text(worst['shape'])}) | {'PASS' if ratio <= TARGET_RATIO else 'MISS'} |")
    return lines + [""]


def is_graph_timed(raw: dict) -> bool:
    """Whether ``raw`` was timed with CUDA-graph replays (files written before "timing" was recorded
    say it through their device argument)."""
    if "timing" in raw:
        return raw["timing"] == timing_label("cuda")
    return torch.device(raw["args"].get("device", "cuda")).type == "cuda"


def render(raw: dict) -> str:
    """The Markdown report of a run: header (versions, command, copy bandwidth), summary, tables."""
    bw_start, bw_end = raw["copy_gbps_start"], raw["copy_gbps_end"]
    graph = is_graph_timed(raw)
    big = "1 GiB" if graph else "256 MiB"
    drift = 100 * (bw_end / bw_start - 1)
    info = raw["versions"]
    command = raw.get("command", "python benchmarks/suites/activations.py")
    head = [f"# Activations: {raw['device']} ({raw['date'][:10]})", "",
            (f"torch {info['torch']}, CUDA {info['cuda']}, triton {info['triton']}; `{command}`; "
             f"{raw['args']['repeats']} repeats, {timing_label('cuda' if graph else 'cpu')}; "
             f"run took {raw['elapsed_s']:.0f} s."), "",
            (f"{big} copy bandwidth (read + write, eager): **{bw_start:.0f} GB/s** at the start, {bw_end:.0f} GB/s at "
             f"the end ({drift:+.1f}%). Every '% copy' is of the start figure. Tuned choice, eager, compile and "
             "'same-size copy' (`out.copy_(x)`, the faster of eager and graph) are timed head to head on the same "
             "buffers; '% same-size copy' is the tuned choice against that copy. The candidate tables are a separate "
             "measurement. The method: `benchmarks/activations.py`'s docstring."), ""]
    if raw.get("skipped"):
        head += [f"Not measured (op not registered): {', '.join(raw['skipped'])}.", ""]
    lines = head + (summary(raw["results"], bw_start, big) if raw["results"] else [])
    for key, entry in raw["results"].items():
        lines += case_tables(key, entry["rows"], bw_start)
    return "\n".join(lines) + "\n"
