"""Host time per call of the GEMM family on small operands (64x64: the call is host-bound), tunekit
against torch's own function, forward alone and forward + backward through autograd, with the
routes to torch's functions (``tunekit/ops/gemm/routes.py``) and without them (tunekit's general
path: its checks, params and autograd Function; measured in a child process with
``TUNEKIT_FAST_CALL=0``, which leaves the routes unbuilt).

Each figure is the median over 15 repeats of (wall time of N back-to-back calls) / N after warm-up
until no tunekit op is tuning (so every signature is decided and routed where it will be; on a GPU the
float32 Triton candidates compile for seconds first), torch's and tunekit's repeats
interleaved; on CUDA one synchronisation ends each repeat. Run: ``PYTHONPATH=src python benchmarks/suites/gemm_host_time.py [--device cuda] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.bench.measure import host_us_per_call  # noqa: E402
from tunekit.ops.gemm import routes  # noqa: E402
from tunekit.tunable.registry import all_ops  # noqa: E402


def settle(fn, limit_s: float = 120.0) -> int:
    """Call ``fn`` until no tunekit op is tuning (its compiles run on worker threads, which a busy
    caller slows: a short pause every 50 calls lets them on), at most ``limit_s``; the calls made."""
    calls, start = 0, time.perf_counter()
    while calls < 300 or (any(op.session_calls() for op in all_ops()) and time.perf_counter() - start < limit_s):
        fn()
        calls += 1
        if calls % 50 == 0:
            time.sleep(0.002)
    for _ in range(3):  # one more call each way: keys decided by the last tuning are routed
        fn()
    return calls


def per_call_us(fns, device, calls=3000, repeats=15) -> list[float]:
    """Median host µs per call of each of ``fns`` once nothing is tuning, their repeats interleaved."""
    for fn in fns:
        settle(fn)
    times = host_us_per_call(dict(enumerate(fns)), device, calls=calls, repeats=repeats)
    return [times[i] for i in range(len(fns))]


def cases(device, dtype):
    """(name, torch's call, tunekit's call): the same work each."""
    def t(*shape, grad=False):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)
    x, w, b, c = t(64, 64), t(64, 64), t(64), t(64, 64)
    x3, a3, b3 = t(4, 16, 64), t(4, 64, 64), t(4, 64, 64)
    xg, wg, bg = t(64, 64, grad=True), t(64, 64, grad=True), t(64, grad=True)
    dy = torch.randn(64, 64, device=device, dtype=dtype)
    layer = torch.nn.Linear(64, 64, device=device, dtype=dtype)
    ours = tunekit.nn.Linear(64, 64, device=device, dtype=dtype)
    ours.load_state_dict(layer.state_dict())
    yield from [  # measured under no_grad, the rest with grad
        ("linear", lambda: F.linear(x, w), lambda: tunekit.linear(x, w)),
        ("linear + bias", lambda: F.linear(x, w, b), lambda: tunekit.linear(x, w, b)),
        ("mm", lambda: torch.mm(x, w), lambda: tunekit.mm(x, w)),
        ("addmm", lambda: torch.addmm(c, x, w), lambda: tunekit.addmm(c, x, w)),
        ("bmm", lambda: torch.bmm(a3, b3), lambda: tunekit.bmm(a3, b3)),
        ("matmul 3-D @ 2-D", lambda: torch.matmul(x3, w), lambda: tunekit.matmul(x3, w)),
        ("nn.Linear (no grad)", lambda: layer(x), lambda: ours(x)),
    ]
    yield ("linear + bias, forward + backward", lambda: F.linear(xg, wg, bg).backward(dy),
           lambda: tunekit.linear(xg, wg, bg).backward(dy))
    yield ("nn.Linear, forward + backward", lambda: layer(xg).backward(dy), lambda: ours(xg).backward(dy))


def measure(device, dtype) -> dict:
    out = {}
    for name, theirs, ours in cases(device, dtype):
        grad = "backward" in name
        with torch.set_grad_enabled(grad):
            torch_us, tunekit_us = per_call_us((theirs, ours), device)
            out[name] = {"torch": torch_us, "tunekit": tunekit_us}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None, help="folder for gemm_host_time-<device>.md/.json")
    ap.add_argument("--json", action="store_true", help="print this process's figures as JSON only")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.json:
        print(json.dumps(measure(device, dtype)))
        return
    in_place = routes.ready()
    routed = measure(device, dtype)
    env = dict(os.environ, TUNEKIT_FAST_CALL="0")
    child = subprocess.run([sys.executable, __file__, "--device", args.device, "--dtype", args.dtype, "--json"],
                           env=env, capture_output=True, text=True, check=True)
    general = json.loads(child.stdout.strip().splitlines()[-1])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.processor() or 'host'}"
    lines = [f"# GEMM host time per call: {name}", "",
             f"torch {torch.__version__}, {args.dtype}, 64x64 operands; routes in place: {in_place}; "
             f"`{' '.join(sys.argv)}`", "",
             "Each ratio is against torch measured in the same process, interleaved with it (the general "
             "path's in the child process).", "",
             "| call | torch µs | tunekit µs (routes) | ratio | torch µs (child) | tunekit µs (general path) | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for case, r in routed.items():
        g = general[case]
        lines.append(f"| {case} | {r['torch']:.2f} | {r['tunekit']:.2f} | {r['tunekit'] / r['torch']:.2f}x | "
                     f"{g['torch']:.2f} | {g['tunekit']:.2f} | {g['tunekit'] / g['torch']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        stem = Path(args.out) / f"gemm_host_time-{name.replace(' ', '_')}"
        stem.with_suffix(".md").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps({"routed": routed, "general": general}, indent=1))


if __name__ == "__main__":
    main()
