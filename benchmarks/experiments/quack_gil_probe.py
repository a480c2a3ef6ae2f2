"""Answers: where do a quack plan's first-use stalls come from, and which design removes them? A main
thread launching small GPU work (as a training loop does: no sync per step) is timed per step while
a worker thread imports quack, or compiles a plan in-process, or while a child process compiles it
into quack's disk cache; each with Python's default GIL switch interval (5 ms) and with 0.5 ms. Also
``-X importtime``'s heaviest imports and the in-process load of a plan whose kernel is on disk.

GPU only, quack-kernels installed. ``PYTHONPATH=src python benchmarks/experiments/quack_gil_probe.py``
(each scenario runs in a fresh process: an import happens once per process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

SHAPE = (4096, 14336, 4096)
CONFIG = (128, 208, True, 2, 1)


def _tensors():
    import torch

    m, n, k = SHAPE
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return x, w.t(), b, out


def _plan(tensors):
    from tunekit.backends import quack

    x, wt, b, out = tensors
    return quack.plan_for(x, wt, b, out, "gelu_tanh", CONFIG)


def _import_quack():
    from tunekit.backends import quack

    quack._epilogue("gelu_tanh", True)
    quack._config(CONFIG)


def _steps(done: threading.Event, tail_s: float, limit_s: float) -> list[float]:
    """Per-step wall times (ms) of a loop of small GPU launches, until ``done`` + ``tail_s``."""
    import torch

    a = torch.randn(64, 64, device="cuda")
    steps, start, end = [], time.perf_counter(), None
    while time.perf_counter() - start < limit_s:
        t0 = time.perf_counter()
        for _ in range(4):
            a = torch.mm(a, a).clamp_(-1, 1)
        if len(steps) % 100 == 0:
            torch.cuda.synchronize()
        steps.append((time.perf_counter() - t0) * 1e3)
        if done.is_set():
            end = end or time.perf_counter()
            if time.perf_counter() - end > tail_s:
                break
    return steps


def _report(name: str, steps: list[float], work_s: float | None) -> None:
    s = sorted(steps)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    slow = sum(1 for t in steps if t > 2.0)
    work = "-" if work_s is None else f"{work_s:.2f}"
    print(f"{name:34s} work {work:>6s} s  steps {len(s):6d}  median {q(0.5):6.3f}  p99 {q(0.99):7.2f}  "
          f"max {s[-1]:8.2f} ms  steps > 2 ms: {slow}  time in them {sum(t for t in steps if t > 2.0) / 1e3:.2f} s")


def scenario(kind: str, switch: float) -> None:
    import torch

    sys.setswitchinterval(switch)
    tensors = _tensors()
    torch.cuda.synchronize()
    if kind in ("compile", "load"):
        _import_quack()
    done, took = threading.Event(), [None]

    def work():
        t0 = time.perf_counter()
        if kind == "import":
            _import_quack()
        elif kind in ("compile", "load"):
            _plan(tensors)
        elif kind == "child":
            env = dict(os.environ)
            subprocess.run([sys.executable, __file__, "--scenario", "plan-only"], env=env, check=True)
        elif kind == "baseline":
            time.sleep(2.0)
        took[0] = time.perf_counter() - t0
        done.set()

    _steps(threading.Event(), 0.0, 0.3)  # warm the loop
    th = threading.Thread(target=work)
    th.start()
    steps = _steps(done, 0.5, 60.0)
    th.join()
    _report(f"{kind} (switch {switch * 1e3:g} ms)", steps, took[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario")
    ap.add_argument("--switch", type=float, default=0.005)
    args = ap.parse_args()
    if args.scenario == "plan-only":
        _plan(_tensors())
        return
    if args.scenario:
        scenario(args.scenario, args.switch)
        return
    import torch

    print(torch.cuda.get_device_name(), "shape", SHAPE, "config", CONFIG, flush=True)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import quack.epilogue.library, quack.gemm_config"],
                       env=env, capture_output=True, text=True)
    rows = [ln.split("|") for ln in r.stderr.splitlines() if ln.startswith("import time:") and "|" in ln]
    rows = [(int(c.strip()), int(s.split(":")[1].strip()), n.rstrip()) for s, c, n in rows if c.strip().isdigit()]
    print("import quack.epilogue.library: heaviest by cumulative us (self us)")
    for cum, own, name in sorted(rows, reverse=True)[:14]:
        print(f"  {cum / 1e6:6.3f} s  ({own / 1e6:6.3f} s self)  {name}")
    for kind, cache in (("baseline", None), ("import", None), ("compile", "cold"), ("child", "cold2"), ("load", "cold2")):
        for switch in (0.005, 0.0005):
            if kind in ("child", "load") and switch != 0.005:
                continue
            if cache:
                env["QUACK_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"quack_probe_{cache}_{switch}")
                if kind == "load":
                    env["QUACK_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "quack_probe_cold2_0.005")
            out = subprocess.run([sys.executable, __file__, "--scenario", kind, "--switch", str(switch)], env=env,
                                 capture_output=True, text=True, timeout=120)
            print(out.stdout.strip() or out.stderr[-600:], flush=True)


if __name__ == "__main__":
    main()
