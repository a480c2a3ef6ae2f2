"""Where a fresh offline-tuning process spends its time, unprofiled: a timeline for issue 6.

``multi_gpu_tune.py`` gives the verdict (all GPUs against one); this script says why it is what it
is. With W the work that splits between workers and S what every worker pays again (CUDA context,
kernel loads, Triton's launchers and cache key), two GPUs take about S + W/2 against S + W, so the
ratio is bounded by S. This measures S's parts in a fresh process with warm disk caches, without a
profiler's overhead:

1. Record ``--count`` signatures (``multi_gpu_tune.workload``) into a fresh store, then run two
   discarded tuning processes so every disk cache (NVRTC cubins, Triton kernels and launchers) is
   warm.
2. A fresh process tunes a copy on one GPU, timing its phases: ``process_start.prepare`` (the
   CUDA context, with Triton's cache key hashed on a thread), the C++ fast-call extension's load,
   then per signature the warm-up (every candidate's first run: kernel loads) and the tuning
   proper. The first warm-up and the first tuning run under cProfile (their first-use costs,
   named). Triton C-compiler runs are counted (a warm cache should have none).
3. A fresh process runs ``tune_parallel`` on ``--gpus``, every worker's steps traced to a file:
   when each process claimed its first item, the seconds it spent in each step, when it ended.

Run: ``python benchmarks/checks/offline_start.py [--count 40] [--gpus all] [--workload ops|llama-gemm] [--out DIR]``
(``--workload llama-gemm``: the LLaMA-style step's GEMM signatures, issue 23's workload, instead of ``--count``
activation and logsumexp ones; the output files are then named ``offline_start-llama_gemm-<device>``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()  # before import torch: "import" below is the imports' time

from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import multi_gpu_tune  # noqa: E402


def _now() -> float:
    return time.perf_counter() - T0


def _instrument_triton(log: dict) -> None:
    """Count Triton's C-compiler runs and name the cache lookups that missed."""
    try:
        from triton.runtime import build
    except ImportError:
        return
    if hasattr(build, "_build"):
        original = build._build

        def timed_build(name, *args, **kwargs):
            t = time.perf_counter()
            try:
                return original(name, *args, **kwargs)
            finally:
                log["c_builds"].append([name, round(time.perf_counter() - t, 4)])
        build._build = timed_build
    if hasattr(build, "get_cache_manager"):
        original_manager = build.get_cache_manager

        def manager(key):
            m = original_manager(key)
            get_file = m.get_file

            def logged_get_file(filename):
                path = get_file(filename)
                log["launcher_lookups"].append([filename, key[:12], path is not None, getattr(m, "cache_dir", "?")])
                return path
            m.get_file = logged_get_file
            return m
        build.get_cache_manager = manager


def single(args) -> dict:
    """One fresh process: phases, then tune_recorded with per-signature timing."""
    log = collections.defaultdict(list)
    log["import_s"] = _now()
    _instrument_triton(log)
    from tunekit import offline
    from tunekit.tunable.results import ResultsStore

    from tunekit.offline import process_start, tune_one
    from tunekit.backends import fast_call

    phases = {}
    t = time.perf_counter()
    process_start.prepare(torch.device("cuda", 0))
    phases["prepare: CUDA context, Triton's cache key on a thread"] = time.perf_counter() - t
    t = time.perf_counter()
    fast_call.load()
    phases["fast-call extension: flags and load"] = time.perf_counter() - t

    def profiled(what, fn, *a, **k):
        """Run fn under cProfile; keep the 25 entries of largest cumulative time."""
        import cProfile
        import pstats
        prof = cProfile.Profile()
        try:
            return prof.runcall(fn, *a, **k)
        finally:
            stats = pstats.Stats(prof).sort_stats("cumulative")
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:25]
            log["profiles"].append([what, [[f"{Path(f).name}:{line}({name})", round(v[3], 4), v[1]]
                                           for (f, line, name), v in rows]])

    per_signature = []
    warm, tune = tune_one.warm_candidates, tune_one.find_fastest
    current = {}

    def timed_warm(op, params):
        t = time.perf_counter()
        builds = len(log["c_builds"])
        try:
            return profiled("first warm_candidates", warm, op, params) if not per_signature else warm(op, params)
        finally:
            current.update(op=op.name, signature=params.signature(), warm_s=time.perf_counter() - t,
                           c_builds=len(log["c_builds"]) - builds, tune_s=0.0)
            per_signature.append(current.copy())

    def timed_find(op, params, settings, **kwargs):
        t = time.perf_counter()
        try:
            if len(per_signature) == 1 and not per_signature[0]["tune_s"]:
                return profiled("first find_fastest", tune, op, params, settings, **kwargs)
            return tune(op, params, settings, **kwargs)
        finally:
            per_signature[-1]["tune_s"] += time.perf_counter() - t

    tune_one.warm_candidates, tune_one.find_fastest = timed_warm, timed_find
    t = time.perf_counter()
    summary = offline.tune_recorded(ResultsStore(args.store), device=torch.device("cuda", 0))
    phases["tune_recorded"] = time.perf_counter() - t
    return {"phases": phases, "per_signature": per_signature, "summary": summary.as_dict(), **log}


def _traced(owner, name: str, trace: str, what: str | None = None) -> None:
    """Replace ``owner.name`` by a wrapper that appends (pid, what, start, end) to the file ``trace``
    (wall-clock times: comparable between processes). Forked workers inherit the wrapper."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            signature = getattr(args[1], "signature", None) if len(args) > 1 else None
            label = signature()[:60] if callable(signature) else ""
            with open(trace, "a") as f:
                f.write(json.dumps([os.getpid(), what or name, t, time.time(), label]) + "\n")
    setattr(owner, name, wrapper)


def parallel(args) -> dict:
    """One fresh process: tune_parallel, every worker's steps traced to a file."""
    from tunekit.offline import claims as _claims
    from tunekit.offline import parallel as par
    from tunekit.offline import recorded, tune_one
    from tunekit.tunable.results import ResultsStore

    log = collections.defaultdict(list)
    _instrument_triton(log)
    trace = args.store + ".trace"
    for owner, name in ((tune_one, "warm_candidates"), (tune_one, "find_fastest"), (recorded, "rebuild_params"),
                        (_claims, "claim_next"), (_claims, "release"), (ResultsStore, "put"),
                        (ResultsStore, "remove_untuned"), (torch.cuda, "set_device"), (par, "_worker"),
                        (par, "_local")):
        _traced(owner, name, trace)
    start = time.time()
    t = time.perf_counter()
    summary = par.tune_parallel(args.store, par.parse_gpus(args.gpus))
    call = time.perf_counter() - t
    steps = [json.loads(line) for line in open(trace)]
    return {"call_s": call, "start": start, "end": time.time(), "parent": os.getpid(), "steps": steps,
            "summary": summary.as_dict(), **log}


def timeline(p: dict) -> list[str]:
    """Per process: when its first item was claimed, its time per step, when its last step ended."""
    out = ["| process | first claim at (s) | last step ends (s) | items | " + " | ".join(STEPS) + " |",
           "|---|---:|---:|---:|" + "---:|" * len(STEPS)]
    for pid in sorted({s[0] for s in p["steps"]}, key=lambda q: q != p["parent"]):
        mine = [s for s in p["steps"] if s[0] == pid]
        claims = [s for s in mine if s[1] == "claim_next"]
        total = {k: sum(s[3] - s[2] for s in mine if s[1] == k) for k in STEPS}
        who = "this process" if pid == p["parent"] else f"worker {pid}"
        out.append(f"| {who} | {min(s[2] for s in claims) - p['start']:.2f} | "
                   f"{max(s[3] for s in mine) - p['start']:.2f} | {sum(1 for s in mine if s[1] == 'find_fastest')} | "
                   + " | ".join(f"{total[k]:.2f}" for k in STEPS) + " |")
    return out


STEPS = ("set_device", "claim_next", "rebuild_params", "warm_candidates", "find_fastest", "put",
         "remove_untuned", "release")


def run(mode: str, store: str, args) -> dict:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--store", store, "--gpus", args.gpus],
                          capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - t
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{mode} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1][7:]), "process_s": wall}


def render(result: dict, args) -> str:
    s = result["single"]
    sig = s["per_signature"]
    warm_s, tune_s = sum(r["warm_s"] for r in sig), sum(r["tune_s"] for r in sig)
    out = [f"# Offline tuning: a fresh process's time, unprofiled ({result['device']})", "",
           f"{result['date']}; {args.count} signatures; torch {torch.__version__}; "
           f"triton {result['triton']}; `python benchmarks/checks/offline_start.py {' '.join(result['argv'])}`", "",
           "## One GPU, one fresh process (warm disk caches)", "",
           f"- `import torch`, tunekit and the benchmark helpers: {s['import_s']:.2f} s; whole process {s['process_s']:.2f} s",
           "", "| phase | s |", "|---|---:|"]
    out += [f"| {k} | {v:.3f} |" for k, v in s["phases"].items()]
    out += [f"| of tune_recorded: warm-up (first runs) | {warm_s:.3f} |",
            f"| of tune_recorded: find_fastest | {tune_s:.3f} |",
            f"| of tune_recorded: the rest (store, claims, rebuilding inputs) | "
            f"{s['phases']['tune_recorded'] - warm_s - tune_s:.3f} |", "",
            f"Triton C-compiler runs: {len(s.get('c_builds', []))} ({sum(b[1] for b in s.get('c_builds', [])):.2f} s); "
            f"launcher cache lookups {len(s.get('launcher_lookups', []))}, misses "
            f"{sum(1 for x in s.get('launcher_lookups', []) if not x[2])}.", "",
            "| # | op | signature | warm-up ms | tuning ms | C builds |", "|---:|---|---|---:|---:|---:|"]
    out += [f"| {i} | {r['op']} | `{r['signature'][:60]}` | {r['warm_s'] * 1e3:.1f} | {r['tune_s'] * 1e3:.1f} | {r['c_builds']} |"
            for i, r in enumerate(sig)]
    for what, rows in s.get("profiles", []):
        out += ["", f"{what}, under cProfile (cumulative s, calls):", "",
                "| function | s | calls |", "|---|---:|---:|"]
        out += [f"| `{name}` | {t:.3f} | {n} |" for name, t, n in rows]
    p = result["parallel"]
    out += ["", f"## All GPUs ({args.gpus}), one fresh process", "",
            f"- call {p['call_s']:.2f} s, whole process {p['process_s']:.2f} s; the call returned "
            f"{p['end'] - max(s[3] for s in p['steps']):.2f} s after the last traced step (worker exits, sweep)",
            f"- Triton C-compiler runs in this process: {len(p.get('c_builds', []))}",
            "- seconds from the call's start; step columns: total seconds in that step", ""]
    out += timeline(p)
    out += ["", "Items (seconds from the call's start; warm-up and tuning of each signature):", "",
            "| process | signature | warm-up from | tuning from | to |", "|---|---|---:|---:|---:|"]
    warms = {(s[0], s[4]): s for s in p["steps"] if s[1] == "warm_candidates"}
    for s in sorted((s for s in p["steps"] if s[1] == "find_fastest"), key=lambda s: s[2]):
        w = warms.get((s[0], s[4]))
        who = "this process" if s[0] == p["parent"] else f"worker {s[0]}"
        out.append(f"| {who} | `{s[4]}` | {(w[2] if w else s[2]) - p['start']:.2f} | {s[2] - p['start']:.2f} | "
                   f"{s[3] - p['start']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--workload", choices=sorted(multi_gpu_tune.TARGETS), default="ops")
    ap.add_argument("--gpus", default="all")
    ap.add_argument("--out")
    ap.add_argument("--child", choices=["single", "parallel"])
    ap.add_argument("--store")
    args = ap.parse_args(argv)
    if args.child:
        result = single(args) if args.child == "single" else parallel(args)
        print("RESULT " + json.dumps(result))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    work = Path(tempfile.mkdtemp(prefix="tunekit-offline-start-"))
    recorded = str(work / "recorded.sqlite")
    if args.workload == "llama-gemm":
        import model_gemm_workload
        args.count = len(model_gemm_workload.record(recorded, torch.device("cuda", 0)))
    else:
        multi_gpu_tune.record(recorded, multi_gpu_tune.workload(args.count, False), torch.device("cuda", 0))
    # Warm the disk caches twice: on an H200 with Triton 3.6, the processes that load kernels from
    # the cache built launchers that the process which compiled them had not (8 C-compiler runs, 1.1 s)
    for i, mode in enumerate(("parallel", "single")):
        run(mode, multi_gpu_tune.copy_store(recorded, str(work / f"warm{i}.sqlite")), args)
    import triton
    result = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "triton": triton.__version__, "argv": list(argv if argv is not None else sys.argv[1:]),
              "single": run("single", multi_gpu_tune.copy_store(recorded, str(work / "one.sqlite")), args),
              "parallel": run("parallel", multi_gpu_tune.copy_store(recorded, str(work / "all.sqlite")), args)}
    text = render(result, args)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "offline_start-" + ("" if args.workload == "ops" else args.workload.replace("-", "_") + "-") \
            + result["device"].replace(" ", "_")
        (out / f"{stem}.md").write_text(text)
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
