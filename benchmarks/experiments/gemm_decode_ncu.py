"""Profiling probe (run under ncu), not a suite: why do the MMA decode kernels stream a 117 MB weight at
3.0-3.3 TB/s where the one-row gemv kernel reaches 4.0 on an H200? Runs each named decode candidate three
times at one shape (bfloat16, L2-cold weights), for
``ncu --kernel-name regex:'gemv|gemm_decode' --launch-skip 1 --launch-count 1 ...`` per candidate.
``PYTHONPATH=src python benchmarks/experiments/gemm_decode_ncu.py M N K NAME...``
"""
import sys

import torch

from tunekit.ops.gemm import GemmParams, mm_op


def main() -> None:
    M, N, K = (int(v) for v in sys.argv[1:4])
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    ws = [torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(3)]
    for name in sys.argv[4:]:
        c = mm_op.candidate(name)
        for w in ws:
            c.run(GemmParams(x, w.t()))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
