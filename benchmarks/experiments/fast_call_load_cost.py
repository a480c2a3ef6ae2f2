"""Answers: where does loading the (already built) fast-call extension spend its time in a fresh process that
imported torch and made its CUDA context, and how much of it stalls a main thread that keeps releasing and
taking back the interpreter lock (as torch ops and CUDA synchronizations do)? fast_call_overlap_probe.py measured
the load at 9-13 ms on the calling thread of an H100 host (2.6 ms on a 2-core CPU machine).

Each child (fresh process, warm cache) reports the steps: the build's key and cache check (``build()``), a
verify, the ``dlopen`` (through ctypes, which releases the lock, or through the import, which holds it) and the
module's init; then, in other children, the stalls of a main thread looping ``time.sleep(1e-4)`` while a worker
loads it one way or the other; ``whole``: ``fast_call.load()`` as a first use calls it. ``LD_DEBUG=statistics`` gives
the dynamic loader's own count.

    PYTHONPATH=src python benchmarks/experiments/fast_call_load_cost.py [--runs 3] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import ctypes, importlib.machinery, importlib.util, os, sys, threading, time
mode, device = sys.argv[1], sys.argv[2]
import torch
import tunekit
from tunekit.backends import extension, fast_call
torch.empty(1, device=device)
T = time.perf_counter

def import_it(path):
    loader = importlib.machinery.ExtensionFileLoader("tunekit_fast_call", path)
    spec = importlib.util.spec_from_file_location("tunekit_fast_call", path, loader=loader)
    module = importlib.util.module_from_spec(spec)  # dlopen and PyInit
    loader.exec_module(module)
    return module

if mode == "whole":
    t = T(); fast_call.load(); w = T() - t
    print(f"{mode:13s} fast_call.load() {w*1e3:6.2f} ms (build, verify, import, as a first use does)")
elif mode in ("steps", "steps_ctypes"):
    t = T(); path = fast_call.build(); b = T() - t
    t = T(); extension.verify(path); v = T() - t
    c = 0.0
    if mode == "steps_ctypes":
        t = T(); ctypes.CDLL(path, mode=os.RTLD_NOW); c = T() - t
    t = T(); import_it(path); i = T() - t
    print(f"{mode:13s} build() {b*1e3:6.2f}  verify {v*1e3:6.2f}  ctypes dlopen {c*1e3:6.2f}  import {i*1e3:6.2f} ms")
else:  # stall: a worker loads while the main thread keeps handing the lock over
    path = fast_call.build()
    done, took = [], []
    def work():
        t = T()
        if mode == "stall_ctypes":
            ctypes.CDLL(path, mode=os.RTLD_NOW)
        import_it(path)
        took.append(T() - t); done.append(1)
    walls = []
    th = threading.Thread(target=work); th.start()
    while not done or not walls:
        t = T(); time.sleep(1e-4); walls.append(T() - t)
    th.join()
    stalls = [w - 1e-4 for w in walls if w > 6e-4]
    print(f"{mode:13s} worker {took[0]*1e3:6.2f} ms; main: {len(walls)} turns, {len(stalls)} over 0.6 ms, "
          f"stalled {sum(stalls)*1e3:6.2f} ms, longest {max(walls, default=0)*1e3:6.2f} ms")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEKIT_")}
    env["TUNEKIT_CACHE"] = tempfile.mkdtemp(prefix="tunekit-load-cost-")
    subprocess.run([sys.executable, "-c", "from tunekit.backends import fast_call; fast_call.build()"], env=env, check=True)
    for _ in range(args.runs):
        for mode in ("whole", "steps", "steps_ctypes", "stall_import", "stall_ctypes"):
            out = subprocess.run([sys.executable, "-c", CHILD, mode, args.device], env=env, capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr[-2000:], flush=True)
    out = subprocess.run([sys.executable, "-c", CHILD, "steps", args.device], env={**env, "LD_DEBUG": "statistics"},
                         capture_output=True, text=True)
    print("LD_DEBUG=statistics, the last block (the extension's dlopen):")
    print("\n".join(out.stderr.strip().splitlines()[-12:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
