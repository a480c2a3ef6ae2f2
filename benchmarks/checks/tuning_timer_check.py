"""Do tuning's CUDA timers agree? Per silu candidate, float16 1024x1024 and 4096x4096, the time per
call from (a) plain events around eager launches (``queued=False``: the old default, host-bound for
short kernels), (b) the queued timer (a spin holds the stream while the host enqueues: device time,
the new default), (c) CUDA-graph replay (device time, the reference), and what tuning chooses with
(b) and with (c).

Expected: (b) within a few % of (c) for every candidate; (a) above both where a kernel is shorter
than its launch (the 1024x1024 rows). Measured as tuning measures: inputs rotated over
``input_sets`` (cold in L2), repetitions for ``target_ms`` per measurement, median of rounds that
rotate the order of the candidates. ``wall`` is the host wall time of one queued measurement
(spin, enqueue and device time), ``bad`` the queued measurements the spin did not cover.

Run on a CUDA machine: ``PYTHONPATH=src python benchmarks/checks/tuning_timer_check.py [--rounds 25]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402,F401
from tunekit.ops.silu import silu_op  # noqa: E402
from tunekit.tunable import find_fastest, tuning  # noqa: E402
from tunekit.tunable.screen import input_sets  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402
from tunekit.tunable.timing import CudaEventTimer, CudaGraphTimer, CudaQueuedTimer, sleep_cycles_per_ms  # noqa: E402

SHAPES = [(1024, 1024), (4096, 4096)]


def check_shape(shape, device, rounds):
    params = silu_op.make_example(shape, torch.float16, device)
    sets = input_sets(params, make_trial(params))
    runners = {}
    for c in silu_op.candidates:
        if c.supports(params):
            continue
        try:
            for p in sets:
                c.run(p)  # warm-up: compilation, caches
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  {c.name}: {type(exc).__name__}: {exc}"[:160])
            continue

        def run_all(run=c.run):
            for p in sets:
                run(p)
        runners[c.name] = run_all

    queued = CudaQueuedTimer(device)
    fastest = min(queued.measure(fn, 1) for fn in runners.values())
    reps = max(1, min(1000, math.ceil(queued.target_ms / max(fastest, 1e-6))))  # as find_fastest
    plain, graph = CudaEventTimer(device), CudaGraphTimer(device)
    measures = {}
    for name, fn in runners.items():
        m = {"events": plain.prepare(fn, reps), "queued": queued.prepare(fn, reps)}
        try:
            m["graph"] = graph.prepare(fn, reps)
        except Exception:  # noqa: BLE001 - not capturable
            torch.cuda.synchronize(device)
        measures[name] = m
    samples = {(n, k): [] for n, m in measures.items() for k in m}
    walls = {n: [] for n in measures}
    bad = {n: 0 for n in measures}
    names = list(measures)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for kind, measure in measures[name].items():
                t0 = time.perf_counter()
                samples[(name, kind)].append(measure() / len(sets))
                if kind == "queued":
                    walls[name].append((time.perf_counter() - t0) * 1e3)
                    bad[name] += not queued.last_valid

    def us(name, kind):
        s = samples.get((name, kind))
        return statistics.median(s) * 1e3 if s else math.nan

    print(f"\nsilu float16 {shape[0]}x{shape[1]}: {len(sets)} input sets, {reps} reps per measurement, "
          f"{rounds} rounds; us per call")
    print(f"  {'candidate':28s} {'events':>8s} {'queued':>8s} {'graph':>8s} {'q/g':>6s} {'e/g':>6s} "
          f"{'wall ms':>8s} {'bad':>4s}")
    for name in sorted(names, key=lambda n: us(n, "queued")):
        e, q, g = us(name, "events"), us(name, "queued"), us(name, "graph")
        print(f"  {name:28s} {e:8.2f} {q:8.2f} {g:8.2f} {q / g:6.3f} {e / g:6.3f} "
              f"{statistics.median(walls[name]):8.3f} {bad[name]:4d}")
    for kind in ("events", "queued", "graph"):
        ranked = [n for n in names if not math.isnan(us(n, kind))]
        print(f"  fastest by {kind:6s}: {min(ranked, key=lambda n: us(n, kind))}")
    for graph_flag in (False, True):
        with tuning(results=":memory:", cuda_graph=graph_flag) as s:
            t0 = time.perf_counter()
            report = find_fastest(silu_op, params, s)
            torch.cuda.synchronize(device)
            ms = (time.perf_counter() - t0) * 1e3
        print(f"  find_fastest cuda_graph={graph_flag!s:5s}: {report.choice:28s} in {ms:6.1f} ms "
              f"(complete={report.complete})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    device = torch.device("cuda")
    torch.randn(8, device=device).sum().item()  # CUDA context
    t0 = time.perf_counter()
    rate = sleep_cycles_per_ms(device)
    print(f"{torch.cuda.get_device_name(device)}: torch.cuda._sleep at {rate / 1e6:.3f} GHz "
          f"(calibrated in {(time.perf_counter() - t0) * 1e3:.1f} ms)")
    for shape in SHAPES:
        check_shape(shape, device, args.rounds)


if __name__ == "__main__":
    main()
