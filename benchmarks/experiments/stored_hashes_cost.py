"""Answers: what does an op's first signature pay for its candidates' source hashes, computed (before
``backends/stored_hashes.py``), with nothing kept yet, and kept by an earlier process? And a process's first
CUDA C choice for the fp16/bf16 headers' digest in its cubin names (``nvrtc.headers_digest``)? Each run: a fresh
``TUNEKIT_CACHE``; one fresh process computing every op's hashes (``validators.candidate_hashes``, the code
before), one asking the kept ones with the folder absent ('empty'), then one more with what that one kept
('kept'). Per process and op: the wall of the call on the calling thread (ms), in registry order, after
``import tunekit`` (not timed), then the headers' digest. CPU only; prints medians over the runs.

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
import json, sys, time
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
from tunekit.backends import nvrtc
folder = (nvrtc.include_dirs() or ("",))[0]  # found before the clock starts, as an earlier step of a first call does
t = time.perf_counter()
nvrtc._headers_digest(folder) if compute else nvrtc.headers_digest()
walls["headers digest"] = (time.perf_counter() - t) * 1e3
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
    ops = [name for name in walls["computed"][0] if name != "headers digest"]
    print(f"{'op':22s}" + "".join(f"{mode:>12s}" for mode in walls) + "   (ms on the calling thread, median of "
          f"{args.runs} runs)")
    for op in ops + ["total", "headers digest"]:
        cells = []
        for mode, runs in walls.items():
            values = [sum(r[o] for o in ops) if op == "total" else r[op] for r in runs]
            cells.append(f"{statistics.median(values):12.2f}")
        print(f"{op:22s}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
