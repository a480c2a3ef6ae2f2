"""Offline tuning on every GPU against one: recorded signatures, the wall time of each, entries present.

Targets: on a host with 2 GPUs, ``tune_parallel`` on both tunes the recorded signatures in at most
0.6x the wall time ``tune_recorded`` takes on one GPU (issue 6: 40 activation and logsumexp
signatures, ``--workload ops``), at most 0.55x for the LLaMA-style model step's GEMM signatures
(issue 23, ``--workload llama-gemm``: ``model_gemm_workload.py``; every Triton configuration and
cuBLASLt algorithm warmed and timed per signature), and every recorded signature has its entry.

Method:
1. Record: ``--count`` signatures (silu, gelu erf and tanh, logsumexp and the backward ops; several
   sizes and dtypes, interleaved), or the model step's GEMM signatures, are met on GPU 0 with tuning
   off and ``record_untuned`` on, into a fresh store.
2. Warm-up (unless ``--no-warmup`` or ``--cold``): one all-GPU run, then one one-GPU run, each on a copy,
   discarded. The on-disk compile caches (NVRTC cubins, Triton kernels and launchers) are then warm
   for both measured runs alike, so neither pays a first-ever compile the other does not. ``--cold``
   instead gives every measured run empty caches of its own: both pay every compile, as the first
   ``tunekit tune`` on a fresh machine does. Two runs:
   with Triton 3.6 on an H200, the first process to load kernels from Triton's cache built 8
   launchers (1.1 s of C compiler) that the process which had compiled them had not
   (``offline_start.py``); with one warm-up the first measured run paid them.
3. Measured runs, each on a fresh copy of the recorded store and in a fresh Python process (so each
   pays CUDA initialisation and loading its kernels, as ``tunekit tune`` from a shell does): one GPU
   is ``tune_recorded`` on cuda:0; all GPUs is ``tune_parallel`` on every GPU (this process works on
   the first GPU, one spawned worker per other GPU, work claimed item by item from the shared store).
   "in call" times the call itself (the verdict), "process" the whole process (Python start and
   ``import torch`` included). With ``--repeats`` > 1 the runs alternate and medians are reported.
4. Check: every recorded (op, signature, device) has an entry in every store, and none is left untuned.

Run: ``python benchmarks/suites/multi_gpu_tune.py [--gpus all] [--count 40] [--max-tuning-ms MS] [--out DIR]``;
``--smoke``: the CPU, 6 tiny signatures, 2 CPU worker processes (a check that the script works).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# device_count() (NVML), not is_available() (which initialises the CUDA driver): tune_parallel's
# workers can then start by fork, ~0.5 s instead of ~3 s for a spawned interpreter
if torch.cuda.device_count() == 0:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton candidates run in the interpreter on the CPU

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit import offline  # noqa: E402
from tunekit.offline import parallel  # noqa: E402
from tunekit.tunable import results_store, tuning  # noqa: E402
from tunekit.tunable.registry import get_op  # noqa: E402
from tunekit.tunable.results import ResultsStore  # noqa: E402
from tunekit.tunable.stores import close_all  # noqa: E402

TARGETS = {"ops": 0.6, "llama-gemm": 0.55}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def workload(count: int, smoke: bool) -> list[tuple[str, tuple, torch.dtype, dict]]:
    """(op, shape, dtype, arguments) calls meeting ``count`` distinct signatures, ops interleaved."""
    if smoke:
        sizes, rows, dtypes = [(300,), (500,)], [((4, 32), -1), ((32, 8), 0)], (torch.float32,)
        backward = [(200,)]
    else:
        sizes, dtypes = [(1 << 20,), (1 << 22,), (1 << 24,)], DTYPES
        rows = [((4096, 4096), -1), ((32768, 512), -1), ((4096, 4096), 0), ((64, 65536), -1)]
        backward = [(1 << 22,)]
    groups = [
        [("silu", s, d, {}) for s in sizes for d in dtypes],
        [("gelu", s, d, {"approximate": "none"}) for s in sizes for d in dtypes],
        [("logsumexp", s, d, {"dim": dim}) for s, dim in rows for d in dtypes],
        [("gelu", s, d, {"approximate": "tanh"}) for s in sizes for d in dtypes],
        [("silu_backward", s, d, {}) for s in backward for d in dtypes],
        [("gelu_backward", s, d, {"approximate": "none"}) for s in backward for d in dtypes],
        [("logsumexp_backward", s, d, {"dim": dim}) for s, dim in rows[:1] for d in dtypes],
    ]
    calls = []
    while any(groups) and len(calls) < count:
        for group in groups:
            if group and len(calls) < count:
                calls.append(group.pop(0))
    if len(calls) < count:
        raise SystemExit(f"the workload has only {len(calls)} signatures; ask for --count {len(calls)} or fewer")
    return calls


def record(path: str, calls, device: torch.device) -> list[tuple[str, str, str]]:
    """Meet every call once with tuning off and recording on; the recorded keys."""
    with tuning(results=path, tuning=False, record_untuned=True):
        for name, shape, dtype, arguments in calls:
            op = get_op(name)
            op(op.make_example(shape, dtype, device, **arguments))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    keys = [(r.op, r.signature, r.device) for r in results_store(path).untuned()]
    close_all()
    return keys


def copy_store(source: str, target: str) -> str:
    """A consistent copy of an SQLite store (the backup API also copies what is still in the WAL)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    return target


def run_child(mode: str, store: str, args) -> dict:
    """One measured run in a fresh Python process; its report, with the process's wall time. With
    ``--cold`` the run gets compile caches of its own, empty (tunekit's and Triton's, next to its store)."""
    command = [sys.executable, __file__, "--child", mode, "--store", store, "--gpus", args.gpus,
               "--workers", str(args.workers)]
    if args.max_tuning_ms:
        command += ["--max-tuning-ms", str(args.max_tuning_ms)]
    env = None
    if args.cold:
        caches = Path(store).with_suffix(".caches")
        shutil.rmtree(caches, ignore_errors=True)  # a --work folder used before keeps them
        env = {**os.environ, "TUNEKIT_CACHE": str(caches / "tunekit"), "TRITON_CACHE_DIR": str(caches / "triton")}
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.perf_counter() - t0
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the {mode} run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {**json.loads(lines[-1][len("RESULT "):]), "process_s": wall}


def child(args) -> int:
    """``--child single|parallel``: tune the store, print ``RESULT {json}``."""
    with tuning(**({"max_tuning_ms": args.max_tuning_ms} if args.max_tuning_ms else {})):
        settings = tunekit.settings()
        gpus = parallel.parse_gpus(args.gpus) if args.gpus != "cpu" else None
        t0 = time.perf_counter()
        if args.child == "single":
            device = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
            summary = offline.tune_recorded(ResultsStore(args.store), device=device, settings=settings)
            workers = 1
        else:
            summary = parallel.tune_parallel(args.store, gpus, workers=args.workers, settings=settings)
            workers = len(gpus) if gpus else args.workers
        call = time.perf_counter() - t0
    print("RESULT " + json.dumps({"call_s": call, "workers": workers, "summary": summary.as_dict()}))
    return 0


def present(store: str, keys) -> tuple[int, int]:
    """(entries present for the recorded keys, records still untuned)."""
    s = ResultsStore(store)
    try:
        return sum(s.get(*k) is not None for k in keys), len(s.untuned())
    finally:
        s.close()


def verdict(one: float, many: float, smoke: bool, complete: bool, target: float) -> tuple[float, str]:
    ratio = many / one if one > 0 else float("inf")
    if not complete:
        return ratio, "FAIL (entries missing)"
    if smoke:
        return ratio, "n/a (smoke run on the CPU)"
    return ratio, "PASS" if ratio <= target else "FAIL"


def render(meta: dict, rows: list[dict]) -> str:
    """The Markdown report: a row per configuration, then the ratios and the verdict."""
    out = [f"# Offline tuning: all GPUs against one ({meta['device']})", "",
           f"{meta['date']}; {meta['count']} recorded signatures ({meta['workload']}); compile caches {meta.get('caches', 'warm')}; budget {meta['budget_ms']:g} ms per signature; "
           f"torch {meta['torch']}; `{meta['command']}`", "",
           "| run | devices | workers | in call (s) | process (s) | tuned | incomplete | failed | entries present |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        left = f" ({r['untuned']} left untuned)" if r["untuned"] else ""
        out.append(f"| {r['run']} | {r['devices']} | {r['workers']} | {r['call_s']:.2f} | {r['process_s']:.2f} | "
                   f"{r['tuned']} | {r['incomplete']} | {r['failed']} | {r['present']}/{meta['count']}{left} |")
    one, many = rows
    complete = all(r["present"] == meta["count"] and not r["untuned"] for r in rows)
    target = TARGETS[meta["workload"]]
    ratio, word = verdict(one["call_s"], many["call_s"], meta["smoke"], complete, target)
    process_ratio = many["process_s"] / one["process_s"] if one["process_s"] else float("inf")
    out += ["", f"- all GPUs / one GPU, in call: **{ratio:.2f}x** (target <= {target}x): **{word}**",
            f"- all GPUs / one GPU, whole process: {process_ratio:.2f}x",
            f"- work per worker (all GPUs): {many['split']}"]
    return "\n".join(out) + "\n"


def summarize(runs: dict, gpus: list, names: list, workers: int) -> list[dict]:
    """A report row per configuration (medians over its runs); a failed worker's error printed."""
    rows = []
    for mode, label in (("single", "one GPU" if gpus else "one CPU process"),
                        ("parallel", "all GPUs" if gpus else f"{workers} CPU processes")):
        results = runs[mode]
        last = results[-1]
        devices = (f"cuda:{gpus[0]} {names[0]}" if mode == "single" else
                   f"cuda:{','.join(map(str, gpus))} {' + '.join(names)}") if gpus else "cpu"
        rows.append({"run": label, "devices": devices, "workers": last["workers"],
                     "call_s": statistics.median(r["call_s"] for r in results),
                     "process_s": statistics.median(r["process_s"] for r in results),
                     "tuned": last["summary"]["tuned"], "incomplete": last["summary"]["incomplete"],
                     "failed": len(last["summary"]["failed"]), "present": min(r["present"] for r in results),
                     "untuned": max(r["untuned"] for r in results),
                     "split": ", ".join(f"{w['device']} ({w.get('where', 'spawned')}) "
                                        + (str(w['tuned'] + w['incomplete'] + w['already']) if "tuned" in w
                                           else w.get("stopped", f"exit code {w.get('exitcode')}"))
                                        for w in last["summary"]["workers"]) or "one process"})
        for w in last["summary"]["workers"]:
            if w.get("error"):  # a worker that failed: say why (the others and the sweep did its work)
                print(f"worker {w['worker']} on {w['device']} failed:\n{w['error']}", file=sys.stderr)
    return rows


def measure(args) -> int:
    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.smoke else torch.device("cpu")
    if device.type == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke for the CPU check")
    gpus = parallel.parse_gpus(args.gpus) if device.type == "cuda" else []
    names = [torch.cuda.get_device_name(g) for g in gpus] or ["cpu"]
    work = Path(args.work or tempfile.mkdtemp(prefix="tunekit-multi-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    recorded = str(work / "recorded.sqlite")
    if args.workload == "llama-gemm":
        import model_gemm_workload
        keys = model_gemm_workload.record(recorded, device, args.smoke)
        args.count = len(keys)
    else:
        keys = record(recorded, workload(args.count, args.smoke), device)
    if len(keys) != args.count or not keys:
        raise SystemExit(f"recorded {len(keys)} signatures, expected {args.count}")
    if not (args.no_warmup or args.cold):
        for i, mode in enumerate(("parallel", "single")):
            run_child(mode, copy_store(recorded, str(work / f"warmup{i}.sqlite")), args)
    runs = {"single": [], "parallel": []}
    for i in range(args.repeats):
        for mode in ("single", "parallel"):
            store = copy_store(recorded, str(work / f"{mode}{i}.sqlite"))
            result = run_child(mode, store, args)
            result["present"], result["untuned"] = present(store, keys)
            runs[mode].append(result)
    rows = summarize(runs, gpus, names, args.workers)
    meta = {"device": " + ".join(names), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "count": args.count,
            "budget_ms": args.max_tuning_ms or tunekit.settings().max_tuning_ms, "torch": torch.__version__,
            "command": " ".join(["python", "benchmarks/suites/multi_gpu_tune.py"] + (args.argv or [])), "smoke": args.smoke,
            "workload": args.workload, "caches": "empty per run" if args.cold else "warm"}
    text = render(meta, rows)
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "multi_gpu_tune-" + ("" if args.workload == "ops" else args.workload.replace("-", "_") + "-") + (
            "cold-" if args.cold else "") + (
            "smoke-cpu" if args.smoke else names[0].replace(" ", "_"))
        (out / f"{stem}.md").write_text(text)
        (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=2))
    complete = all(r["present"] == args.count and not r["untuned"] for r in rows)
    return 0 if complete else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="all", help="all (default), a count, or indices like 0,1")
    ap.add_argument("--workload", choices=sorted(TARGETS), default="ops",
                    help="ops: activations and logsumexp (default); llama-gemm: the model step's GEMM signatures")
    ap.add_argument("--count", type=int, default=None, help="recorded signatures (ops: default 40; --smoke: 6)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-tuning-ms", type=float, default=None, help="tuning budget (default: the settings')")
    ap.add_argument("--workers", type=int, default=2, help="CPU worker processes (--smoke)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the discarded run that warms the compile caches")
    ap.add_argument("--cold", action="store_true",
                    help="every measured run with empty compile caches of its own (a fresh machine's first "
                         "`tunekit tune`); no warm-up")
    ap.add_argument("--out", help="also write multi_gpu_tune-<device>.md / .json here")
    ap.add_argument("--work", help="directory for the stores (default: a fresh temporary one)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny signatures, 2 CPU workers")
    ap.add_argument("--child", choices=["single", "parallel"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.child:
        return child(args)
    if args.workload == "llama-gemm" and args.count is not None:
        ap.error("--count applies to --workload ops: llama-gemm records the step's own signatures")
    if args.count is None:
        args.count = 6 if args.smoke else 40
    if args.smoke:
        args.no_warmup, args.gpus = True, "cpu"  # CPU workers even where there are GPUs
        args.max_tuning_ms = args.max_tuning_ms or 2000.0
    return measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
