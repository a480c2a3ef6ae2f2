"""Answers: what does an op's first signature pay for its candidates' source hashes, computed (before
``backends/stored_hashes.py``), with nothing kept yet, and kept by an earlier process? Each run: a fresh
``TUNEKIT_CACHE``; one fresh process computing every op's hashes (``validators.candidate_hashes``, the code
before), one asking the kept ones with the folder absent ('empty'), then one more with what that one kept
('kept'). Per process and op: the wall of the call on the calling thread (ms), in registry order, after
``import tunekit`` (not timed). CPU only; prints medians over the runs.

    PYTHONPATH=src python benchmarks/experiments/stored_hashes_cost.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = """
import json, sys, threading, time
import tunekit
from tunekit.tunable import validators
from tunekit.tunable.registry import all_ops
compute = sys.argv[1] == "computed"
walls = {}
for op in all_ops():
    t = time.perf_counter()
    if compute:
        validators.candidate_hashes(op.candidates)
    else:
        validators.op_candidate_hashes(op.name, op.candidates)
    walls[op.name] = (time.perf_counter() - t) * 1e3
for thread in threading.enumerate():
    if thread.name == "tunekit-keep-hashes":
        thread.join()
print(json.dumps(walls))
"""


def _child(mode: str, cache: str) -> dict[str, float]:
    env = {**os.environ, "TUNEKIT_CACHE": cache}
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    walls: dict[str, list[dict[str, float]]] = {"computed": [], "empty": [], "kept": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            for mode in walls:  # empty, then kept: the same folder
                walls[mode].append(_child(mode, cache))
    ops = list(walls["computed"][0])
    print(f"{'op':22s}" + "".join(f"{mode:>12s}" for mode in walls) + "   (ms on the calling thread, median of "
          f"{args.runs} runs)")
    for op in ops + ["total"]:
        cells = []
        for mode, runs in walls.items():
            values = [sum(r.values()) if op == "total" else r[op] for r in runs]
            cells.append(f"{statistics.median(values):12.2f}")
        print(f"{op:22s}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
