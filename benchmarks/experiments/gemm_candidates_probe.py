"""Every GEMM candidate that screens in, timed (CUDA-graph replay, rotated L2-cold inputs), on the shapes
where issue 23's goals are missed: which kernel is closest, and how far is it?

Run: ``PYTHONPATH=src python benchmarks/experiments/gemm_candidates_probe.py [--shapes NAME,...]``; prints
one table per shape (candidate, µs, TFLOP/s, time against torch's). Shapes: ``777`` (mm, row-major),
``777lin`` (the same as F.linear), ``4097`` (mm), ``gelu4096`` / ``gelu128`` (addmm + bias + gelu tanh as
a linear, 4096 / 128 x 14336 x 4096, beside the plain addmm).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunekit.bench.measure import measure_candidates  # noqa: E402
from tunekit.ops.gemm.op import addmm_op, mm_op  # noqa: E402
from tunekit.ops.gemm.params import AddmmParams, GemmParams  # noqa: E402


def _linear(M, N, K, dev, dt):
    return torch.randn(M, K, device=dev, dtype=dt), torch.randn(N, K, device=dev, dtype=dt).t()


def _mm(M, N, K, dev, dt):
    return torch.randn(M, K, device=dev, dtype=dt), torch.randn(K, N, device=dev, dtype=dt)


def shapes(dev, dt):
    def addmm(M, N, K, act):
        x, w = _linear(M, N, K, dev, dt)
        return addmm_op, AddmmParams(torch.randn(N, device=dev, dtype=dt), x, w, activation=act), (M, N, K)

    return {
        "777": lambda: (mm_op, GemmParams(*_mm(777, 1555, 333, dev, dt)), (777, 1555, 333)),
        "777lin": lambda: (mm_op, GemmParams(*_linear(777, 1555, 333, dev, dt)), (777, 1555, 333)),
        "4097": lambda: (mm_op, GemmParams(*_mm(4097, 4095, 4096, dev, dt)), (4097, 4095, 4096)),
        "plain4096": lambda: addmm(4096, 14336, 4096, "none"),
        "gelu4096": lambda: addmm(4096, 14336, 4096, "gelu_tanh"),
        "plain128": lambda: addmm(128, 14336, 4096, "none"),
        "gelu128": lambda: addmm(128, 14336, 4096, "gelu_tanh"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="777,777lin,4097,plain4096,gelu4096,plain128,gelu128")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, bfloat16")
    table = shapes(dev, dt)
    for name in args.shapes.split(","):
        torch.manual_seed(0)
        op, p, (M, N, K) = table[name]()
        timings = measure_candidates(op, p, repeats=args.repeats)
        base = timings[op.default.name].time_ms
        print(f"\n## {name}: {op.name} {M}x{N}x{K} ({p.signature()})\n")
        rows = sorted((t.time_ms, n) for n, t in timings.items() if t.time_ms)
        for ms, n in rows:
            print(f"{n:48s} {ms * 1e3:9.1f} us {2 * M * N * K / ms / 1e9:7.0f} TF/s  {base / ms:5.2f}x")
        for n, t in timings.items():
            if not t.time_ms and t.status not in ("unsupported",):
                print(f"{n:48s} {t.status}: {t.reason[:90]}")


if __name__ == "__main__":
    main()
