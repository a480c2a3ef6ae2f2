"""Host time of an op's forward + backward through autograd at 4096 elements (host-bound): torch's
F.silu / F.gelu / torch.logsumexp against tunekit's call with torch's grad_fn recorded in C++
(ops/_shared/grad_call.py) and through its Python autograd Function (the path before it). Issue 22 asks
for <= torch eager. On a GPU it also times (CUDA events, L2-warm: an upper bound on what the node
choice costs) logsumexp's two gradients at the size limit of torch's node (TORCH_NODE_MAX_NUMEL).

Run: ``PYTHONPATH=src python benchmarks/experiments/activation_grad_host_probe.py [--device cuda]``.
Medians of interleaved repeats of (wall time of N fwd+bwd calls) / N, after warm-up (tuned, cached).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import tunekit  # noqa: E402
from tunekit.bench.measure import host_us_per_call  # noqa: E402
from tunekit.backends import fast_grad  # noqa: E402

gelu_op = importlib.import_module("tunekit.ops.gelu.op")
silu_mod = importlib.import_module("tunekit.ops.silu")
lse_mod = importlib.import_module("tunekit.ops.logsumexp.op")


def per_call_us(fns: dict, device) -> dict:
    for fn in fns.values():
        for _ in range(300):  # tuned and cached before timing
            fn()
    return host_us_per_call(fns, device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    print("C++ autograd extension:", fast_grad.load() is not None, "|", device,
          torch.cuda.get_device_name(device) if device.type == "cuda" else "")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4096, device=device, dtype=dtype, requires_grad=True)
        g = torch.randn(4096, device=device, dtype=dtype)
        fns = {
            "F.silu": lambda: F.silu(x).backward(g),
            "tunekit.silu": lambda: tunekit.silu(x).backward(g),
            "SiluFunction (Python)": lambda: silu_mod.SiluFunction.apply(x).backward(g),
            "F.gelu tanh": lambda: F.gelu(x, approximate="tanh").backward(g),
            "tunekit.gelu tanh": lambda: tunekit.gelu(x, approximate="tanh").backward(g),
            "GeluFunction (Python)": lambda: gelu_op.GeluFunction.apply(x, "tanh").backward(g),
        }
        x2 = x.detach().view(64, 64).requires_grad_()
        g2 = torch.randn(64, device=device, dtype=dtype)
        fns.update({
            "torch.logsumexp": lambda: torch.logsumexp(x2, -1).backward(g2),
            "tunekit.logsumexp": lambda: tunekit.logsumexp(x2, -1).backward(g2),
            "LogsumexpFunction (Python)": lambda: lse_mod.LogsumexpFunction.apply(x2, (1,), False).backward(g2),
        })
        for name, us in per_call_us(fns, device).items():
            print(f"{str(dtype):15s} {name:26s} {us:7.2f} us")
        if device.type == "cuda":
            gradient_device_time(dtype, device)


def gradient_device_time(dtype, device) -> None:
    """Device time of torch's logsumexp gradient (torch's node) and tunekit's tuned one, at the limit."""
    n = lse_mod.TORCH_NODE_MAX_NUMEL
    x = torch.randn(n // 1024, 1024, device=device, dtype=dtype)
    lse, dy = torch.logsumexp(x, -1), torch.randn(n // 1024, device=device, dtype=dtype)
    fns = {"torch's LogsumexpBackward0 formula": lambda: dy.unsqueeze(-1) * (x - lse.unsqueeze(-1)).exp(),
           "tunekit.logsumexp_backward": lambda: tunekit.logsumexp_backward(dy, x, lse, -1)}
    for name, fn in fns.items():
        for _ in range(50):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 100)  # us per call
        times.sort()
        print(f"{str(dtype):15s} {name} at {n} elements: {times[len(times) // 2]:.2f} us per call "
              "(launches back to back: device-bound only if above the host time)")


if __name__ == "__main__":
    main()
