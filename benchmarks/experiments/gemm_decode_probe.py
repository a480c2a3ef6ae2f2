"""Timing probe, not a suite: does the CUDA C decode GEMM (``ops/gemm/cuda_decode.py``) stream a weight
faster than cuBLAS at the GEMM suite's decode shapes (M = 1 and 16 against LLaMA-3-8B projections), and
which configuration wins where? Per shape: cuBLAS (``F.linear(x, w)``), every decode configuration and
the Triton skinny kernel the H100 entries chose at 1 x 4096 x 4096 (at M = 1 also the one-row kernels
of gemv.cu), each checked against a float64
reference first; us per call (CUDA-graph replay of 40 calls over 8 rotating weights: L2-cold), the
weight's TB/s, and a 1 GiB copy's bandwidth (read + write; the suites' own measure) in the same run.
``PYTHONPATH=src python benchmarks/experiments/gemm_decode_probe.py``
"""
import sys

import torch
import torch.nn.functional as F

from probe_timing import timed

sys.path.insert(0, "src")
from tunekit.bench.measure import copy_bandwidth  # noqa: E402
from tunekit.ops.gemm.cuda_decode import decode_candidates  # noqa: E402
from tunekit.ops.gemm.params import GemmParams  # noqa: E402
from tunekit.ops.gemm.triton_candidates import triton_candidates  # noqa: E402

SHAPES = [(1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336), (16, 4096, 4096), (16, 14336, 4096),
          (16, 4096, 14336)]
ROTATE = 8


def error(out, x, w) -> float:
    ref = x.double() @ w.double().t()
    return float(((out.double() - ref).abs() / (x.double().abs() @ w.double().abs().t())).max())


def main() -> None:
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; 1 GiB copy {copy_bandwidth(torch.device('cuda')):.0f} GB/s (read + write, the suites' measure)")
    skinny = next(c for c in triton_candidates() if c.name == "triton_skinny_m1_n16_k512_g1_sk2_w4_s1")
    for M, N, K in SHAPES:
        xs = [torch.randn(M, K, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        ws = [torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(ROTATE)]
        outs = [torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        params = [GemmParams(x, w.t(), o) for x, w, o in zip(xs, ws, outs)]
        weight_bytes = N * K * 2
        base = timed(lambda i: F.linear(xs[i % ROTATE], ws[i % ROTATE]))
        print(f"## {M}x{N}x{K} bfloat16: weight {weight_bytes / 1e6:.1f} MB")
        print(f"{'cublas (F.linear)':28s} {base:8.2f} us  {weight_bytes / base / 1e6:5.2f} TB/s  1.000x")
        contenders = decode_candidates() + ([skinny] if M == 1 else [])
        for c in contenders:
            if c.supports(params[0]):
                continue
            err = error(c.run(params[0]), xs[0], ws[0])
            us = timed(lambda i: c.run(params[i % ROTATE]))
            print(f"{c.name:28s} {us:8.2f} us  {weight_bytes / us / 1e6:5.2f} TB/s  {base / us:.3f}x  "
                  f"max err / scale {err:.2e}")


if __name__ == "__main__":
    main()
