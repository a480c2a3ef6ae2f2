"""Timing probe, not a suite: does offline tuning rank logsumexp's gradient candidates as the first-use suite's
head-to-head does? The H100's shipped entries chose ``triton_rows_b1024_w4`` at 8192x1024 16-bit (tuning: 13.49 us,
the static kernel 13.90) and kept the default at 4096x4096:0 / 32x4096x128:1 bfloat16 (the static kernel 2.3% faster,
within the 3% margin), where the suite's head-to-head put those choices 2-4.7% behind torch.compile and the static
kernel level with it. Per signature: three offline tunings as ``benchmarks/pretune.py`` runs them (1000 ms budget,
fresh store), each one's choice and its four fastest records; then one head-to-head (the suite's
``device_times``: 15 rounds, L2-cold sets, each set's own output) of those candidates, torch eager and torch.compile.
``--target MS``: tuning's graph measurements last about MS each (``CudaGraphTimer.target_ms``) instead of the
default (0.5 ms; 0.05 ms, one pass over the input sets, when this probe first ran).
``--h2h NAMES``: no tuning, the head-to-head of these comma-separated candidates only (with
``TUNEKIT_TRITON_STATIC=0``: launched by Triton, not from kept builds).
``--isolate``: at 16384x512 float16, one tuning, then the head-to-head of its three fastest alone (no torch eager,
torch.compile or copy beside them), then with them.
``PYTHONPATH=src python benchmarks/experiments/logsumexp_backward_rank_probe.py [--target MS] [--cases N] [--h2h NAMES]
[--isolate]``
"""
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "src")
from tunekit.bench.suites.first_use import directions  # noqa: E402
from tunekit.bench.suites.common import head_to_head  # noqa: E402
from tunekit.bench.suites.first_use_timing import device_times  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402
from tunekit.tunable.screen import input_sets  # noqa: E402
from tunekit.offline.tune_one import tune_params  # noqa: E402
from tunekit.tunable import context, registry, timing  # noqa: E402
from tunekit.tunable.results import ResultsStore  # noqa: E402

CASES = [((8192, 1024), -1, torch.bfloat16), ((8192, 1024), -1, torch.float16), ((4096, 4096), 0, torch.bfloat16),
         ((32, 4096, 128), 1, torch.bfloat16), ((16384, 512), -1, torch.float16)]


def main() -> None:
    if "--target" in sys.argv:
        timing.CudaGraphTimer.target_ms = float(sys.argv[sys.argv.index("--target") + 1])
    cases = CASES[:int(sys.argv[sys.argv.index("--cases") + 1])] if "--cases" in sys.argv else CASES
    only = sys.argv[sys.argv.index("--h2h") + 1].split(",") if "--h2h" in sys.argv else None
    if only:
        cases = [CASES[1], CASES[4]]
    isolate = "--isolate" in sys.argv
    if isolate:
        cases = [CASES[4]]
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; graph measurements of "
          f"{timing.CudaGraphTimer.target_ms} ms")
    d = next(x for x in directions("logsumexp") if x.direction == "bwd")
    op = registry.get_op(d.op)
    for shape, dim, dtype in cases:
        params = d.example(shape, dtype, device, dim)
        print(f"## {'x'.join(map(str, shape))}:{dim} {dtype}", flush=True)
        seen = list(only or [])
        for attempt in range(0 if only else 1 if isolate else 3):
            store = ResultsStore(Path(tempfile.mkdtemp(prefix="rank-")) / "r.sqlite")
            settings = dataclasses.replace(context.current(), max_tuning_ms=1000.0, results=store.path,
                                           use_shipped=False)
            entry = tune_params(op, params, settings)
            timed = sorted((r.time_ms, n) for n, r in entry.candidates.items() if r.time_ms is not None and
                           r.status in ("chosen", "slower"))
            print(f"tuning {attempt + 1}: chose {entry.choice}; " +
                  ", ".join(f"{n} {t * 1e3:.2f}" for t, n in timed[:4]), flush=True)
            seen += [n for _, n in timed[:4]] + [entry.choice]
        names = list(dict.fromkeys(seen))
        if isolate:
            sets = input_sets(params, make_trial(params))
            alone = head_to_head({n: (op.candidate(n).run, True) for n in names[:3]}, sets, device, 15)
            print(f"alone ({len(sets)} sets, us): " + ", ".join(f"{n} {t * 1e3:.2f}" for n, (t, _) in alone.items()))
            outs = {id(q): torch.empty_like(q.x) for q in sets}
            scrub = [torch.empty(64 << 20, dtype=torch.uint8, device=device) for _ in range(2)]
            neighbours = {"eager": (d.eager, True), "copy": (lambda q: outs[id(q)].copy_(q.x), True),
                          "exp": (lambda q: torch.exp(q.x, out=outs[id(q)]), True),
                          "copy into the set's output": (lambda q: q.out.copy_(q.x), True),
                          "a 64 MiB copy elsewhere": (lambda q: scrub[1].copy_(scrub[0]), True)}
            for label, fn in neighbours.items():
                pair = head_to_head({**{n: (op.candidate(n).run, True) for n in names[:2]}, label: fn}, sets,
                                    device, 15)
                print(f"beside {label} (us): " + ", ".join(f"{n} {t * 1e3:.2f}" for n, (t, _) in pair.items()))
        row = device_times(d, op, params, names, device, repeats=15, graph=True, compile=True)
        ms = row["device_ms"]
        line = ", ".join(f"{n} {t * 1e3:.2f}" for n, t in sorted(ms["tunekit"].items(), key=lambda kv: kv[1]))
        print(f"head-to-head (us): {line}; eager {ms['eager'] * 1e3:.2f}; compile "
              f"{(ms['compile'] or float('nan')) * 1e3:.2f}; copy {ms['copy'] * 1e3:.2f}", flush=True)


if __name__ == "__main__":
    main()
