"""GEMM: tunekit (after first use, and tuned) vs cuBLAS vs PyTorch TunableOp vs torch.compile max-autotune.

Run: ``PYTHONPATH=src python benchmarks/suites/gemm.py [--shapes default|all|NAME,...] [--out DIR]``
(GPU). ``--smoke`` runs two tiny shapes on the CPU in seconds (Triton's interpreter; TunableOp and
max-autotune left out, a plain ``torch.compile`` in their place): a check of this script, its times
mean nothing. Writes ``gemm-<device>.md`` (tables) and ``.json`` (every raw number) into ``--out``.

Shapes (``--shapes all`` is the issue's list; ``default`` a subset that runs in about 8 minutes):
LLaMA-3-8B / 70B projections (q/o, k/v, gate/up, down as ``x @ W.T``) for M in 1, 16, 128, 4096, 8192,
square 8192^3, and odd shapes: 4097x4095x4096 and 777x1555x333 as ``F.linear(x, w)`` (the issue's form;
``.mm``: as ``a @ b``, both row-major), N or K not a multiple of 8, the GPT-2 vocabulary head (N = 50257).

Method, per shape (bfloat16 unless ``--dtype``):

- Contenders read the same rotated input copies (overflowing L2 twice: tuning's ``input_sets``); CUDA-graph
  replays timed head to head in rotated rounds (``head_to_head``), medians. cuBLAS: ``torch.mm(a, b, out=)``.
- tunekit after first use: a fresh results store, default settings; the public function is called
  until the signature is decided (tuning is spread over first calls): those calls' wall time is the
  first-use tuning time. Compile caches start empty (``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``
  in a fresh directory) unless ``--keep-caches``.
- tunekit tuned: a fresh store, ``--tuning-ms`` budget, tuned in one call (its wall time; kernels compiled by then);
  again in a third store with every kernel compiled (warm compile cache).
- PyTorch TunableOp (``torch.cuda.tunable``): tuning on for the first call (its wall time), then replayed.
- ``torch.compile(mode="max-autotune-no-cudagraphs")`` on the shapes marked for it (``--autotune``):
  the first call's wall time is its compile (autotuning) time.
- The tuned choice's result is checked against cuBLAS's with tunekit's GEMM bound; on the shapes marked
  for it, ``linear_act(x, W, b, "gelu_tanh")`` against ``linear(x, W, b)`` (both tuned), head to head.
- TFLOP/s = 2 M N K / time; % of the GPU's dense peak (989 TFLOP/s bf16 / fp16 on H100 SXM and H200).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.bench.measure import versions  # noqa: E402
from tunekit.bench.suites.common import device_name, head_to_head, log, raise_compile_limits  # noqa: E402
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op  # noqa: E402
from tunekit.ops.gemm.numerics import check_gemm  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402
from tunekit.tunable.screen import input_sets  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
MODELS = {"llama3-8b": {"qo": (4096, 4096), "kv": (1024, 4096), "up": (14336, 4096), "down": (4096, 14336)},
          "llama3-70b": {"qo": (8192, 8192), "kv": (1024, 8192), "up": (28672, 8192), "down": (8192, 28672)}}
MS = (1, 16, 128, 4096, 8192)


@dataclass(frozen=True)
class Shape:
    name: str
    M: int
    N: int
    K: int
    form: str = "linear"      # "linear": x [M, K] @ W[N, K].T; "mm": a [M, K] @ b [K, N], both row-major
    autotune: bool = False    # max-autotune in the default selection
    fused: bool = False       # the fused-epilogue comparison


def all_shapes() -> list[Shape]:
    shapes = [Shape(f"{model}.{proj}.M{M}", M, N, K) for model, projs in MODELS.items()
              for proj, (N, K) in projs.items() for M in MS]
    return shapes + [Shape("square8192", 8192, 8192, 8192, "mm", autotune=True),
                     Shape("odd4097x4095x4096", 4097, 4095, 4096, autotune=True),
                     Shape("odd777x1555x333", 777, 1555, 333),
                     Shape("odd4097x4095x4096.mm", 4097, 4095, 4096, "mm"),
                     Shape("odd777x1555x333.mm", 777, 1555, 333, "mm"),
                     Shape("oddN2048x4095x4096", 2048, 4095, 4096, "mm"),
                     Shape("oddK2048x4096x4095", 2048, 4096, 4095, "mm"),
                     Shape("gpt2head.M4096", 4096, 50257, 768)]


#: the default subset, the issue's goals first (a --time-limit run keeps them): odd shapes, then aligned, then decode
_DEFAULT = ["odd4097x4095x4096", "odd777x1555x333", "odd4097x4095x4096.mm", "odd777x1555x333.mm",
            "llama3-8b.qo.M4096", "square8192", "llama3-8b.up.M16", "llama3-8b.up.M4096", "llama3-8b.down.M1",
            "gpt2head.M4096", "oddN2048x4095x4096", "oddK2048x4096x4095",
            "llama3-8b.kv.M4096", "llama3-8b.down.M4096", "llama3-70b.qo.M8192", "llama3-70b.down.M8192",
            "llama3-8b.qo.M1", "llama3-8b.up.M1", "llama3-8b.qo.M16", "llama3-8b.down.M16"]
_AUTOTUNE = {"llama3-8b.up.M16", "llama3-8b.qo.M4096", "square8192", "odd4097x4095x4096"}
_FUSED = {"llama3-8b.up.M16", "llama3-8b.up.M4096"}
SMOKE = [Shape("smoke.linear", 12, 24, 40, "linear", autotune=True, fused=True), Shape("smoke.odd", 17, 9, 33, "mm")]


def select(text: str) -> list[Shape]:
    """``default``, ``all``, or comma-separated names / ``MxNxK`` (an mm of row-major operands)."""
    known = {s.name: s for s in all_shapes()}
    if text in ("default", "all"):
        names = _DEFAULT if text == "default" else list(known)
        return [Shape(**{**known[n].__dict__, "autotune": n in _AUTOTUNE or known[n].autotune,
                         "fused": n in _FUSED}) for n in names]
    out = []
    for name in filter(None, text.split(",")):
        if name in known:
            out.append(Shape(**{**known[name].__dict__, "autotune": True, "fused": name in _FUSED}))
            continue
        try:
            M, N, K = (int(v) for v in name.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"unknown shape {name!r}; known: {', '.join(known)}") from None
        out.append(Shape(name, M, N, K, "mm", autotune=True))
    return out


def peak_tflops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The GPU's dense peak for ``dtype`` (None where this script does not know the GPU)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    if "H100" not in name and "H200" not in name:
        return None
    bf16 = 756.0 if "PCIe" in name else 835.0 if "NVL" in name else 989.4  # SXM
    if dtype in (torch.bfloat16, torch.float16):
        return bf16
    return bf16 / 2 if torch._C._get_cublas_allow_tf32() else bf16 / 14.8


def example(shape: Shape, dtype, device) -> GemmParams:
    torch.manual_seed(0)
    a = torch.randn(shape.M, shape.K, dtype=dtype, device=device)
    b = (torch.randn(shape.N, shape.K, dtype=dtype, device=device).t() if shape.form == "linear"
         else torch.randn(shape.K, shape.N, dtype=dtype, device=device))
    return GemmParams(a, b)


def public(p: GemmParams):  # the public call a user makes for these operands
    return tunekit.linear(p.a, p.b.t()) if p.b.stride(-2) == 1 and p.b.stride(-1) != 1 else tunekit.mm(p.a, p.b)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_use(p, device, store: str, limit_s: float) -> dict:
    """Call the public function with the default settings until the signature is decided."""
    calls, start = 0, time.perf_counter()
    with tunekit.tuning(results=store) as s:
        while True:
            public(p)
            calls += 1
            r = mm_op.decision(p, s)
            if r is not None or time.perf_counter() - start > limit_s:
                break
        sync(device)
    out = {"calls": calls, "seconds": time.perf_counter() - start, "choice": None, "why": f"undecided after {limit_s:g} s"}
    return out if r is None else {**out, **_decided(r)}


def tuned(op, p, device, store: str, budget_ms: float) -> dict:
    start = time.perf_counter()
    with tunekit.tuning(results=store, max_tuning_ms=budget_ms, tuning_step_ms=float("inf")) as s:
        r = op.resolve(p, s, finish=True)
    sync(device)
    return {"seconds": time.perf_counter() - start, **_decided(r)}


def _decided(r) -> dict:
    return {"choice": r.candidate.name, "why": r.why, "complete": None if r.entry is None else r.entry.complete,
            "candidate": r.candidate}


def tunableop(p, device, directory: str, budget_ms: float):
    """(contender, tuning seconds) of PyTorch's TunableOp, or (None, why) where it cannot run."""
    if device.type != "cuda":
        return None, "needs CUDA"
    T = torch.cuda.tunable
    T.set_filename(os.path.join(directory, "tunableop.csv"))
    T.set_max_tuning_duration(int(budget_ms))
    T.set_max_tuning_iterations(100)
    start = time.perf_counter()
    T.enable(True), T.tuning_enable(True)
    try:
        torch.mm(p.a, p.b)
        sync(device)
    finally:
        T.tuning_enable(False), T.enable(False)
    seconds = time.perf_counter() - start

    def run(q):
        T.enable(True)
        try:
            return torch.mm(q.a, q.b, out=q.out)
        finally:
            T.enable(False)
    return run, seconds


def autotuned(p, shape: Shape, device, smoke: bool):
    """(contender, compile seconds) of torch.compile max-autotune (the default mode on the CPU smoke run)."""
    torch._dynamo.reset()
    if shape.form == "linear":
        fn, args = (lambda x, w: torch.nn.functional.linear(x, w)), (lambda q: (q.a, q.b.t()))
    else:
        fn, args = (lambda a, b: torch.mm(a, b)), (lambda q: (q.a, q.b))
    mode = None if smoke else "max-autotune-no-cudagraphs"
    compiled = torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)
    start = time.perf_counter()
    compiled(*args(p))
    sync(device)
    return (lambda q: compiled(*args(q))), time.perf_counter() - start


def fused_ratio(p, device, store, budget_ms, repeats) -> dict:
    """linear_act(x, W, b, "gelu_tanh") against linear(x, W, b), both tuned, head to head."""
    x, w = p.a, p.b.t()
    bias = torch.randn(w.shape[0], dtype=x.dtype, device=device)
    plain, fused = AddmmParams(bias, x, p.b), AddmmParams(bias, x, p.b, activation="gelu_tanh")
    a = tuned(addmm_op, plain, device, store, budget_ms)
    f = tuned(addmm_op, fused, device, store, budget_ms)
    sets = input_sets(plain, make_trial(plain))
    fused_sets = {id(q): q.replace(activation="gelu_tanh") for q in sets}
    contenders = {"linear": (a["candidate"].run, device.type == "cuda"),
                  "linear_act": (lambda q: f["candidate"].run(fused_sets[id(q)]), device.type == "cuda")}
    times = head_to_head(contenders, sets, device, repeats)
    return {"linear_choice": a["choice"], "fused_choice": f["choice"], "linear_ms": times["linear"][0],
            "fused_ms": times["linear_act"][0], "ratio": times["linear_act"][0] / times["linear"][0]}


def measure(shape: Shape, dtype, device, args, tmp: str) -> dict:
    """One row: every contender of this shape, timed head to head."""
    p = example(shape, dtype, device)
    row = {"shape": shape.name, "M": shape.M, "N": shape.N, "K": shape.K, "form": shape.form,
           "signature": p.signature(), "flops": 2 * shape.M * shape.N * shape.K}
    graph = device.type == "cuda"
    first = first_use(p, device, os.path.join(tmp, f"{shape.name}-first.sqlite"), args.first_use_limit)
    best = tuned(mm_op, p, device, os.path.join(tmp, f"{shape.name}-tuned.sqlite"), args.tuning_ms)
    warm = tuned(mm_op, p, device, os.path.join(tmp, f"{shape.name}-warm.sqlite"), args.tuning_ms)
    sets = input_sets(p, make_trial(p))
    default = mm_op.default
    contenders = {"cublas": (default.run, graph), "tunekit": (best["candidate"].run, graph)}
    if first.get("candidate") is not None:
        contenders["first_use"] = (first["candidate"].run, graph)
    row["check"] = check_gemm(p, (best["candidate"].run(make_trial(p)),), (default.run(make_trial(p)),)) or "ok"
    extra = {}
    if not args.no_tunableop:
        run, seconds = tunableop(p, device, tmp, args.tunableop_ms)
        if run is None:
            extra["tunableop_error"] = seconds
        else:
            extra["tunableop_s"], contenders["tunableop"] = seconds, (run, graph)
    if (args.autotune == "all" or (args.autotune == "default" and shape.autotune)) and (graph or args.smoke):
        try:
            run, extra["autotune_s"] = autotuned(p, shape, device, args.smoke)
            contenders["autotune"] = (run, graph)
        except Exception as exc:  # noqa: BLE001 - a failed compile is a result, not the end of the run
            extra["autotune_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    times = head_to_head(contenders, sets, device, args.repeats)
    drop = lambda d: {k: v for k, v in d.items() if k != "candidate"}  # noqa: E731
    row.update(extra, input_sets=len(sets), times_ms={n: t for n, (t, _) in times.items()}, first_use=drop(first),
               spread={n: s for n, (_, s) in times.items()}, tuned=drop(best), tune_warm_s=warm["seconds"])
    if shape.fused:
        row["fused"] = fused_ratio(p, device, os.path.join(tmp, f"{shape.name}-f.sqlite"), args.tuning_ms, args.repeats)
    return row


# -- report -----------------------------------------------------------------------------------------
def _us(ms):
    return "–" if ms is None else f"{ms * 1e3:.1f}"


def _ratio(base, t):
    return "–" if not base or not t else f"{base / t:.2f}x"


def goals(rows) -> list[str]:
    """The issue's goals, each with its measured value and PASS / MISS."""
    def speedup(r, who="tunekit"):
        t = r["times_ms"]
        return t["cublas"] / t[who] if t.get(who) else None

    by = {r["shape"]: r for r in rows}
    worst = max(rows, key=lambda r: r["times_ms"]["tunekit"] / r["times_ms"]["cublas"])
    aligned = [speedup(r) for r in rows if r["M"] >= 1024 and r["N"] % 8 == 0 and r["K"] % 8 == 0 and speedup(r)]
    decode = [speedup(r) for r in rows if r["M"] <= 16 and speedup(r)]
    items = [("never slower than cuBLAS by > 2%", f"worst {worst['times_ms']['tunekit'] / worst['times_ms']['cublas']:.3f}x "
              f"the time ({worst['shape']})", worst["times_ms"]["tunekit"] <= 1.02 * worst["times_ms"]["cublas"])]
    for name, target in (("odd4097x4095x4096", 5.0), ("odd777x1555x333", 1.4)):
        if name in by:
            items.append((f"{name} >= {target}x cuBLAS", f"{speedup(by[name]):.2f}x", speedup(by[name]) >= target))
    for label, values, target in (("aligned M >= 1024 geomean >= 1.08x", aligned, 1.08),
                                  ("decode M <= 16 geomean >= 1.10x", decode, 1.10)):
        g = statistics.geometric_mean(values) if values else None
        if g is not None:
            items.append((label, f"{g:.3f}x over {len(values)} shapes", g >= target))
    fused = [r["fused"]["ratio"] for r in rows if "fused" in r]
    if fused:
        items.append(("fused linear+bias+act <= 1.01x linear", f"worst {max(fused):.3f}x", max(fused) <= 1.01))
    cold, warm = max(r["first_use"]["seconds"] for r in rows), max(r["tune_warm_s"] for r in rows)
    items += [("first use decided <= 3 s per signature (caches empty at the run's start)", f"worst {cold:.2f} s",
               cold <= 3.0), ("tuning <= 0.5 s (kernels compiled)", f"worst {warm:.2f} s", warm <= 0.5)]
    auto = [(r["first_use"]["seconds"], r["autotune_s"]) for r in rows if "autotune_s" in r]
    if auto:
        items.append(("tuning below max-autotune's compile time", f"{sum(a < b for a, b in auto)} of {len(auto)} shapes",
                      all(a < b for a, b in auto)))
    return ["| goal | measured | |", "|---|---|---|"] + [f"| {g} | {m} | {'PASS' if ok else 'MISS'} |" for g, m, ok in items]


def render(raw: dict) -> str:
    rows, peak = raw["rows"], raw["peak_tflops"]
    info = raw["versions"]
    lines = [f"# GEMM: {raw['device']} ({raw['date'][:10]})", "",
             f"torch {info['torch']}, CUDA {info['cuda']}, triton {info['triton']}; `{raw['command']}`; {raw['dtype']}; "
             f"{raw['timing']}; run took {raw['elapsed_s']:.0f} s. Dense peak: {peak or 'unknown'} TFLOP/s.", "",
             *([f"Left out at the time limit: {', '.join(raw['left_out'])}.", ""] if raw.get("left_out") else []),
             "## Goals", ""] + goals(rows) + ["", "## Shapes", "",
             "| shape | M x N x K | cuBLAS µs | TF/s | % peak | tunekit µs | vs cuBLAS | TF/s | % peak | choice | "
             "first use µs (vs cuBLAS) | TunableOp µs (vs) | max-autotune µs (vs) | tune s: first use / budget / warm | "
             "TunableOp s | autotune s | check |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        t = r["times_ms"]
        tf = lambda ms: r["flops"] / (ms * 1e-3) / 1e12 if ms else None  # noqa: E731
        pk = lambda ms: f"{100 * tf(ms) / peak:.0f}" if peak and ms else "–"  # noqa: E731
        lines.append(
            f"| {r['shape']} | {r['M']}x{r['N']}x{r['K']} | {_us(t['cublas'])} | {tf(t['cublas']):.0f} | {pk(t['cublas'])} | "
            f"{_us(t['tunekit'])} | {_ratio(t['cublas'], t['tunekit'])} | {tf(t['tunekit']):.0f} | {pk(t['tunekit'])} | "
            f"{r['tuned']['choice']} | {_us(t.get('first_use'))} ({_ratio(t['cublas'], t.get('first_use'))}) | "
            f"{_us(t.get('tunableop'))} ({_ratio(t['cublas'], t.get('tunableop'))}) | "
            f"{_us(t.get('autotune'))} ({_ratio(t['cublas'], t.get('autotune'))}) | "
            f"{r['first_use']['seconds']:.2f} / {r['tuned']['seconds']:.2f} / {r['tune_warm_s']:.2f} | "
            f"{format(r['tunableop_s'], '.2f') if 'tunableop_s' in r else r.get('tunableop_error', '–')} | "
            f"{format(r['autotune_s'], '.1f') if 'autotune_s' in r else r.get('autotune_error', '–')[:40]} | {r['check']} |")
    fused = [r for r in rows if "fused" in r]
    if fused:
        lines += ["", "## Fused epilogue (bias + gelu tanh) against the linear alone, both tunekit tuned", "",
                  "| shape | linear µs | linear+bias+gelu µs | ratio | choices |", "|---|---:|---:|---:|---|"]
        lines += [f"| {r['shape']} | {_us(r['fused']['linear_ms'])} | {_us(r['fused']['fused_ms'])} | "
                  f"{r['fused']['ratio']:.3f} | {r['fused']['linear_choice']} / {r['fused']['fused_choice']} |" for r in fused]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="default", help="default, all, or names / MxNxK, comma-separated")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tuning-ms", type=float, default=20000.0, help="tunekit's budget for the tuned column")
    ap.add_argument("--tunableop-ms", type=float, default=100.0, help="TunableOp's max tuning duration per GEMM")
    ap.add_argument("--first-use-limit", type=float, default=60.0, help="seconds of first-use calls at most")
    ap.add_argument("--autotune", choices=("default", "all", "none"), default="default")
    ap.add_argument("--no-tunableop", action="store_true")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds: no new shape (after the first) starts after them")
    ap.add_argument("--keep-caches", action="store_true", help="keep the Triton / Inductor compile caches")
    ap.add_argument("--smoke", action="store_true", help="two tiny shapes on the CPU: a check of this script")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = ap.parse_args(argv)
    if args.smoke:
        device, shapes, args.dtype, args.no_tunableop = torch.device("cpu"), SMOKE, "float32", True
        args.tuning_ms, args.repeats = min(args.tuning_ms, 2000.0), min(args.repeats, 3)
    elif not torch.cuda.is_available():
        log("gemm: no CUDA device here; this benchmark times GPU kernels (use --smoke for a CPU check)")
        return 2
    else:
        device, shapes = torch.device("cuda"), select(args.shapes)
    tmp = tempfile.mkdtemp(prefix="tunekit-gemm-bench-")
    if not (args.keep_caches or args.smoke):  # the compile caches start empty: tuning and autotuning times are cold
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    raise_compile_limits()
    dtype, started, rows = DTYPES[args.dtype], time.perf_counter(), []
    for i, shape in enumerate(shapes):
        if i and args.time_limit is not None and time.perf_counter() - started > args.time_limit:
            log(f"time limit: {len(shapes) - i} shape(s) left out: {', '.join(s.name for s in shapes[i:])}")
            break
        rows.append(measure(shape, dtype, device, args, tmp))
        t = rows[-1]["times_ms"]
        log(f"[{i + 1}/{len(shapes)}] {shape.name}: cuBLAS {_us(t['cublas'])} us, tunekit {_us(t['tunekit'])} us "
            f"({rows[-1]['tuned']['choice']}, tuned in {rows[-1]['tuned']['seconds']:.2f} s) "
            f"[{time.perf_counter() - started:.0f} s]")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    name = device_name(device)
    raw = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions(), "dtype": args.dtype,
           "command": " ".join(["python benchmarks/suites/gemm.py"] + (argv if argv is not None else sys.argv[1:])),
           "timing": "CUDA-graph replay, L2-cold inputs" if device.type == "cuda" else "host timer (smoke: meaningless)",
           "peak_tflops": peak_tflops(device, dtype), "elapsed_s": time.perf_counter() - started,
           "args": vars(args), "rows": rows, "left_out": [s.name for s in shapes[len(rows):]]}
    out, text, stem = Path(args.out), render(raw), f"gemm{'-smoke' if args.smoke else ''}-{name.replace(' ', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print(text)
    log(f"wrote {out / stem}.md and .json; elapsed {raw['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
