"""Does the C++ route (ops/rms_norm/route.py) bring tunekit.rms_norm's host time to F.rms_norm's once torch's
kernel is the choice? us per call, forward and forward + backward, interleaved rounds, median.
``PYTHONPATH=src python benchmarks/experiments/rms_norm_route_host_probe.py [cpu|cuda]``"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tunekit
from tunekit.ops.rms_norm import route

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
shape, n = ((4096, 1024), 200) if device.type == "cuda" else ((4, 64), 1000)
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
w = (torch.rand(shape[-1], device=device, dtype=dtype) + 0.5).requires_grad_()
g = torch.ones_like(x)
print(f"route built: {route.ready()}; {device} {dtype} {list(shape)}; torch {torch.__version__}")
with tunekit.tuning(tuning=False):  # torch's kernel, the default, decided at the first call; learned at the second
    for _ in range(3):
        tunekit.rms_norm(x, (shape[-1],), w, 1e-6).backward(g)
    print(f"routed layouts: {len(route.routed_keys())}")
routed_call = route.call


def python_path():
    route.call = route._unrouted
    try:
        return tunekit.rms_norm(x, (shape[-1],), w, 1e-6)
    finally:
        route.call = routed_call


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


contenders = {"F.rms_norm fwd": lambda: F.rms_norm(x, (shape[-1],), w, 1e-6),
              "tunekit routed fwd": lambda: tunekit.rms_norm(x, (shape[-1],), w, 1e-6),
              "tunekit Python path fwd": python_path,
              "F.rms_norm fwd+bwd": lambda: F.rms_norm(x, (shape[-1],), w, 1e-6).backward(g),
              "tunekit routed fwd+bwd": lambda: tunekit.rms_norm(x, (shape[-1],), w, 1e-6).backward(g),
              "tunekit Python path fwd+bwd": lambda: python_path().backward(g)}
samples = {k: [] for k in contenders}
with tunekit.tuning(tuning=False):
    for _ in range(11):
        for name, fn in contenders.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
for name, v in samples.items():
    print(f"{name:32s} {statistics.median(v):8.2f} us/call")
