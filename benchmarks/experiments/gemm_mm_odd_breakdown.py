"""Answers: where does `a @ b` at 4097x4095x4096 (b row-major, rows of 8190 bytes: no TMA) lose its time against
the F.linear form's TMA kernel (K-major w)? Times, in one run: cuBLAS on both forms, the padded candidate whole,
its copy of b alone, the TMA kernel on a pre-padded b (N-major), a transposed copy of b and the TMA kernel on it
(K-major, as F.linear's weight), a same-size device copy, and the padded-rows candidate (``triton_padded_rows.py``:
the same TMA kernel after a Triton copy kernel) whole and its copy alone (CUDA-graph replay, medians; operands not
rotated).

Run: ``PYTHONPATH=src python benchmarks/experiments/gemm_mm_odd_breakdown.py``.
"""

from __future__ import annotations

import torch

from tunekit.bench.measure import time_callable
from tunekit.ops.gemm import triton_launch
from tunekit.ops.gemm.params import GemmParams
from tunekit.ops.gemm.triton_candidates import TritonGemm, _config
from tunekit.ops.gemm.triton_padded_rows import TritonPaddedRows, padded_rows_copy

M, N, K = 4097, 4095, 4096
CFG = _config(128, 256, 64, 8, 3)


def main() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    a, b = torch.randn(M, K, device=dev, dtype=dt), torch.randn(K, N, device=dev, dtype=dt)
    w = b.t().contiguous()  # N x K, K-contiguous: the F.linear form's weight
    ref = (a.float() @ b.float())
    padded_b = triton_launch.aligned_copy(b)
    out = torch.empty(M, N, device=dev, dtype=dt)
    tma, padded, padrows = TritonGemm("tma", CFG, True), TritonGemm("padded", CFG, True), TritonPaddedRows(CFG)
    p_mm, p_pad, p_lin = GemmParams(a, b, out), GemmParams(a, padded_b, out), GemmParams(a, w.t(), out)
    src, dst = torch.randn(K * N, device=dev, dtype=dt), torch.empty(K * N, device=dev, dtype=dt)
    rows = {
        "cuBLAS a @ b": lambda: torch.mm(a, b, out=out),
        "cuBLAS F.linear(a, w)": lambda: torch.mm(a, w.t(), out=out),
        "padded candidate (copy b + TMA, N-major b)": lambda: padded.run(p_mm),
        "  its copy of b alone (aligned_copy)": lambda: triton_launch.aligned_copy(b),
        "  TMA kernel on pre-padded b (N-major)": lambda: tma.run(p_pad),
        "transposed copy b.t().contiguous()": lambda: b.t().contiguous(),
        "TMA kernel on w (K-major, F.linear form)": lambda: tma.run(p_lin),
        "contiguous copy of b's size": lambda: dst.copy_(src),
        "padded-rows candidate (Triton copy + TMA)": lambda: padrows.run(p_mm),
        "  its copy of b alone (padded_rows_copy)": lambda: padded_rows_copy(b),
    }
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, bf16 {M}x{N}x{K}")
    for name, fn in rows.items():
        med, spread = time_callable(fn, dev, repeats=15)
        print(f"{name:48s} {med * 1e3:8.1f} us  (spread {spread:.1%})")
    for name, p, cand in (("padded", p_mm, padded), ("tma on padded", p_pad, tma), ("tma K-major", p_lin, tma),
                          ("padded rows", p_mm, padrows)):
        out.fill_(float("nan"))
        cand.run(p)
        err = (out.float() - ref).abs().max().item()
        print(f"max abs error {name}: {err:.3g} (|ref| max {ref.abs().max().item():.3g})")


if __name__ == "__main__":
    main()
