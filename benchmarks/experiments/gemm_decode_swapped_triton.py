"""Timing probe, not a suite: does Triton's pointer GEMM kernel, given a decode GEMM with its operands
swapped (out.t() = w @ a.t(): the weight's rows fill the MMA's 64 or 128 rows, the M <= 16 tokens its 16
columns, and the weight streams through the kernel's cp.async pipeline in shared memory rather than
through registers), read the weight faster than cuBLAS on the suite's decode shapes? Per shape: cuBLAS
(``F.linear``), the committed decode candidates that run it (the tuned choices), and every swapped
configuration, each checked against a float64 reference first; us per call (CUDA-graph replay of 40 calls
over 8 rotating weights: L2-cold) and the weight's TB/s.
``PYTHONPATH=src python benchmarks/experiments/gemm_decode_swapped_triton.py``
"""
import itertools
import sys

import torch
import torch.nn.functional as F

from probe_timing import timed

sys.path.insert(0, "src")
from tunekit.ops.gemm import mm_op  # noqa: E402
from tunekit.ops.gemm.params import GemmParams  # noqa: E402
from tunekit.ops.gemm.triton_candidates import TritonGemm, _config  # noqa: E402
from tunekit.ops.gemm.triton_swapped import SWAPPED_CONFIGS  # noqa: E402

SHAPES = [(16, 4096, 4096), (16, 14336, 4096), (16, 4096, 14336), (1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336)]
ROTATE = 8
COMMITTED = ["cuda_gemv_w2_u8", "cuda_gemv_w8_u4", "cuda_decode_g1_w4_u4", "cuda_decode_g2_w8_u2",
             "triton_matmul_m16_n64_k128_g8_sk4_w4_s4", "triton_matmul_m16_n128_k128_g8_sk8_w4_s4"]


def swapped_configs() -> list[TritonGemm]:
    """Run 1 (``--wide``): BLOCK_M 64 / 128, BLOCK_K 128 / 256, 3-6 stages, split-K 1-4; run 2 (default): around
    run 1's best (BLOCK_M 32 / 64, BLOCK_K 64-256, 4-8 stages, split-K 1 / 2); run 3 (``--narrow``): BLOCK_M 16."""
    out = []
    if "--wide" in sys.argv:
        grid = itertools.product((64, 128), (128, 256), (3, 4, 6), (1, 2, 4))
    elif "--narrow" in sys.argv:  # run 3: BLOCK_M 16 (mma.sync tiles), 2-4 programs resident per SM; the kept five
        grid = [*itertools.product((16,), (128, 256, 512), (3, 4, 6, 8), (1,)),
                *[(bm, bk, stages, 1) for bm, bk, _, stages in SWAPPED_CONFIGS]]
    else:
        grid = itertools.product((32, 64), (64, 128, 256), (4, 5, 6, 8), (1, 2))
    for bm, bk, stages, split in grid:
        out.append(TritonGemm("matmul", _config(bm, 16, bk, 4, stages, split, group=1)))
    return out


def error(out, x, w) -> float:
    ref = x.double() @ w.double().t()
    return float(((out.double() - ref).abs() / (x.double().abs() @ w.double().abs().t())).max())


def main() -> None:
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    swapped = swapped_configs()
    for M, N, K in [s for s in SHAPES if s[0] == 16 or "--narrow" not in sys.argv]:
        xs = [torch.randn(M, K, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        ws = [torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(ROTATE)]
        outs = [torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        plain = [GemmParams(x, w.t(), o) for x, w, o in zip(xs, ws, outs)]
        swap = [GemmParams(w, x.t(), o.t()) for x, w, o in zip(xs, ws, outs)]
        weight_bytes = N * K * 2
        base = timed(lambda i: F.linear(xs[i % ROTATE], ws[i % ROTATE]))
        print(f"## {M}x{N}x{K} bfloat16: weight {weight_bytes / 1e6:.1f} MB", flush=True)
        print(f"{'cublas (F.linear)':44s} {base:8.2f} us  {weight_bytes / base / 1e6:5.2f} TB/s  1.000x")
        rows = [(mm_op.candidate(n), plain, n) for n in COMMITTED]
        rows += [(c, swap, "swapped " + c.name) for c in swapped]
        for c, params, label in rows:
            why = c.cannot_run(params[0]) if isinstance(c, TritonGemm) else c.supports(params[0])
            if why:
                continue
            outs[0].fill_(float("nan"))
            c.run(params[0])
            err = error(outs[0], xs[0], ws[0])
            us = timed(lambda i: c.run(params[i % ROTATE]))
            print(f"{label:44s} {us:8.2f} us  {weight_bytes / us / 1e6:5.2f} TB/s  {base / us:.3f}x  "
                  f"max err / scale {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
