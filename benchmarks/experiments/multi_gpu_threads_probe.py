"""Would one process with a thread per GPU tune the LLaMA-style step's recorded GEMM signatures on 2
GPUs in <= 0.55x the time on one (issue 23), where a process per GPU reached 0.63-0.71x?

Three configurations, each in a fresh Python process on a copy of one recorded store (warm compile
caches: every configuration runs once, discarded, first): ``single`` (tune_recorded on cuda:0),
``processes`` (tune_parallel: this process on cuda:0, a forked worker on cuda:1), ``threads`` (this
process, a thread per GPU, each running the offline worker loop ``recorded.work`` with the tuning
lock made per thread: a prototype, not the library's code). Per run: the call's wall time, the
process's CPU time, and when each item started and ended on which GPU (the GIL's cost shows as
items that take longer on two threads than alone).
Run: ``python benchmarks/experiments/multi_gpu_threads_probe.py [--repeats 2] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "suites"))
sys.path.insert(0, str(HERE.parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.offline import claims, parallel, process_start, recorded, tune_one  # noqa: E402
from tunekit.tunable import validators  # noqa: E402

MODES = ("single", "processes", "threads")


class _PerThreadLock:
    """The prototype's tuning lock: an RLock per thread (two GPUs' tunings never wait on each other)."""

    def __init__(self):
        self.local = threading.local()

    def _lock(self):
        if not hasattr(self.local, "lock"):
            self.local.lock = threading.RLock()
        return self.local.lock

    def __enter__(self):
        return self._lock().__enter__()

    def __exit__(self, *exc):
        return self._lock().__exit__(*exc)


def run_threads(store_path: str, gpus: list[int], settings, t0: float, items: list) -> dict:
    store = recorded.as_store(store_path)
    settings = tune_one.offline_settings(settings, store)
    tune_one.TUNING_LOCK = _PerThreadLock()
    run, out, started = uuid.uuid4().hex, {}, {}

    def worker(g):
        device = torch.device("cuda", g)
        try:
            process_start.prepare(device)
            with tune_one.on_device(device):
                def event(kind, label):
                    now = time.perf_counter() - t0
                    if kind == "start":
                        started[g] = (label, now)
                    else:
                        items.append((f"cuda:{g}", label, started[g][1], now, kind))
                s = recorded.work(store, device, settings, run=run, event=event)
            out[g] = {"tuned": s.tuned, "incomplete": s.incomplete, "failed": len(s.failed),
                      "cpu_s": time.thread_time()}
        except BaseException:  # noqa: BLE001 - reported
            out[g] = {"error": traceback.format_exc()}

    threads = [threading.Thread(target=worker, args=(g,), name=f"gpu{g}") for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    name = validators.device_name(torch.device("cuda", gpus[0]))
    left, _ = claims.pending(store, name)
    return {"workers": out, "remaining": len(left)}


def child(mode: str, store: str, gpus: list[int]) -> None:
    settings = tunekit.settings()
    items, last = [], {}
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    def progress(done, total, label):  # single / processes: an item's start is the previous one's end
        now = time.perf_counter() - t0
        if label == "done":
            for where, (name, start) in last.items():
                items.append((where, name, start, now, "?"))
            return
        where = label[1:label.index("]")] if label.startswith("[") else "cuda:0"
        if where in last:
            items.append((where, *last[where], now, "?"))
        last[where] = (label, now)

    if mode == "single":
        s = tunekit.offline.tune_recorded(store, device=torch.device("cuda", gpus[0]), settings=settings,
                                          progress=progress)
        report = {"summary": s.as_dict()}
    elif mode == "processes":
        s = parallel.tune_parallel(store, gpus, settings=settings, progress=progress)
        report = {"summary": s.as_dict()}
    else:
        report = run_threads(store, gpus, settings, t0, items)
    report.update(call_s=time.perf_counter() - t0, cpu_s=time.process_time() - cpu0, items=items)
    print("RESULT " + json.dumps(report))


def run_child(mode: str, source: str, work: Path, tag: str) -> dict:
    import multi_gpu_tune
    store = multi_gpu_tune.copy_store(source, str(work / f"{mode}-{tag}.sqlite"))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE), "--child", mode, "--store", store], capture_output=True,
                          text=True, timeout=1200)
    wall = time.perf_counter() - t0
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {**json.loads(lines[-1][7:]), "process_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--modes", default=",".join(MODES), help="which configurations (default all)")
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--store")
    args = ap.parse_args()
    gpus = list(range(torch.cuda.device_count()))[:2]
    if args.child:
        child(args.child, args.store, gpus)
        return 0
    import model_gemm_workload
    work = Path(tempfile.mkdtemp(prefix="threads-probe-"))
    source = str(work / "recorded.sqlite")
    keys = model_gemm_workload.record(source, torch.device("cuda", 0))
    lines = [f"# {' + '.join(torch.cuda.get_device_name(g) for g in gpus)}, torch {torch.__version__}, "
             f"{len(keys)} recorded GEMM signatures; {time.strftime('%Y-%m-%d %H:%M')}"]
    modes = [m for m in MODES if m in args.modes.split(",")]
    for mode in modes:
        run_child(mode, source, work, "warm")
    results = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:
            res = run_child(mode, source, work, str(r))
            results[mode].append(res)
            lines.append(f"\n## {mode} #{r}: call {res['call_s']:.2f} s, process {res['process_s']:.2f} s, "
                         f"process CPU {res['cpu_s']:.2f} s; {json.dumps(res.get('workers', ''))[:300]}")
            for where, label, start, end, kind in sorted(res["items"], key=lambda i: i[2]):
                lines.append(f"  {where}  {start:6.2f} -> {end:6.2f} s  ({end - start:5.2f})  {kind:10s} {label[:90]}")
    one = statistics.median(r["call_s"] for r in results["single"])
    lines.append("")
    for mode in modes:
        med = statistics.median(r["call_s"] for r in results[mode])
        lines.append(f"{mode}: median call {med:.2f} s = {med / one:.3f}x single "
                     f"(runs {', '.join('%.2f' % r['call_s'] for r in results[mode])})")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "multi_gpu_threads_probe.txt").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
