"""Host time of an activation's forward + backward through autograd at 4096 elements (host-bound):
torch's F.silu / F.gelu against tunekit's call with torch's grad_fn recorded in C++ (ops/_shared/grad_call.py)
and through its Python autograd Function (the path before it). Issue 22 asks for <= torch eager.

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
        for name, us in per_call_us(fns, device).items():
            print(f"{str(dtype):15s} {name:24s} {us:7.2f} us")


if __name__ == "__main__":
    main()
