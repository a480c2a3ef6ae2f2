"""Does quack's SM90 GEMM (CuTe DSL, ping-pong warp groups: one group's epilogue overlaps the other's
main loop) run linear + bias + gelu tanh within 1% of cuBLAS's linear alone (issue 23's fused goal;
cuBLASLt's best bias + GELU algorithm ran 1.03-1.05x its best plain one on the H100), and does its plain
GEMM beat cuBLAS on aligned shapes (the 1.08x goal)?

Per shape (bfloat16, ``F.linear(x, w, b)`` layouts: x row-major M x K, w N x K, so quack's B = w.T is
K-major): cuBLAS ``F.linear`` without and with bias, addmm + gelu, torch._addmm_activation; quack
``gemm_act`` with each pinned configuration (no activation, and gelu_tanh_approx; bias; the
pre-activation not stored), and quack's own default choice (``tuned=False``). CUDA-graph replay
(probe_timing.timed, 8 rotated inputs), us per call; the first call's wall time (the CuTe DSL JIT
compile); the worst error against float32 gelu_tanh(x @ w.T + b) relative to the output's scale, beside
cuBLAS's own bfloat16 result's.
Needs quack-kernels and nvidia-cutlass-dsl (not tunekit dependencies; the device carries them as wheels).
Run: ``PYTHONPATH=src python benchmarks/experiments/quack_gemm_probe.py [--shapes MxNxK,...]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import timed  # noqa: E402

SHAPES = [(4096, 14336, 4096), (16, 14336, 4096), (8192, 8192, 8192), (4096, 6144, 4096),
          (4096, 4096, 14336), (128, 6144, 4096)]
# (tile_m, tile_n, pingpong, cluster_m, cluster_n): quack's SM90 space is tiles 128 x {128..208}
# ping-pong and 256 x {128..208} cooperative, clusters 2x1 / 1x2
CONFIGS = [(128, 192, True, 2, 1), (128, 192, True, 1, 2), (128, 208, True, 2, 1), (128, 160, True, 2, 1),
           (256, 128, False, 2, 1), (256, 192, False, 2, 1), (128, 256, False, 2, 1)]


def config_of(tile_m, tile_n, pingpong, cluster_m, cluster_n):
    from quack.gemm_config import GemmConfig
    return GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m, cluster_n=cluster_n,
                      swap_ab=False, device_capacity=9, is_dynamic_persistent=False, use_tma_gather=False)


def quack_call(xs, ws, bs, outs, activation, config):
    from quack.gemm_interface import gemm_act

    def call(i):
        i %= 8
        gemm_act(xs[i], ws[i].t(), bias=bs[i], activation=activation, postact_out=outs[i], store_preact=False,
                 tuned=False, config=config)
    return call


def error(outs, call, ref, scale) -> float:
    outs[0].fill_(float("nan"))
    call(0)
    torch.cuda.synchronize()
    return float((outs[0].float() - ref).abs().max()) / scale


def probe_shape(M, N, K) -> None:
    bf = torch.bfloat16
    xs = [torch.randn(M, K, device="cuda", dtype=bf) for _ in range(8)]
    ws = [torch.randn(N, K, device="cuda", dtype=bf) / K ** 0.5 for _ in range(8)]
    bs = [torch.randn(N, device="cuda", dtype=bf) for _ in range(8)]
    outs = [torch.empty(M, N, device="cuda", dtype=bf) for _ in range(8)]
    pre = F.linear(xs[0].float(), ws[0].float(), bs[0].float())
    refs = {None: pre, "gelu_tanh_approx": F.gelu(pre, approximate="tanh")}
    base = timed(lambda i: F.linear(xs[i % 8], ws[i % 8]))
    rows = {"cuBLAS F.linear (no bias)": (base, ""),
            "cuBLAS F.linear + bias": (timed(lambda i: F.linear(xs[i % 8], ws[i % 8], bs[i % 8])), ""),
            "cuBLAS addmm + gelu tanh": (timed(lambda i: F.gelu(F.linear(xs[i % 8], ws[i % 8], bs[i % 8]),
                                                              approximate="tanh")), ""),
            "torch._addmm_activation": (timed(lambda i: torch._addmm_activation(
                bs[i % 8], xs[i % 8], ws[i % 8].t(), use_gelu=True)), "")}
    cublas_err = float((F.gelu(F.linear(xs[0], ws[0], bs[0]), approximate="tanh").float()
                        - refs["gelu_tanh_approx"]).abs().max()) / float(refs["gelu_tanh_approx"].abs().max())
    for activation in (None, "gelu_tanh_approx"):
        ref = refs[activation]
        scale = float(ref.abs().max())
        for spec in [None] + CONFIGS:
            name = f"quack {activation or 'bias'} {'default' if spec is None else spec}"
            call = quack_call(xs, ws, bs, outs, activation, None if spec is None else config_of(*spec))
            try:
                t0 = time.perf_counter()
                call(0)
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                err = error(outs, call, ref, scale)
                rows[name] = (timed(call), f"  first call {first:6.2f} s  err {err:.2e}")
            except Exception as exc:  # noqa: BLE001 - a configuration the shape or the kernel refuses
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}")
    print(f"\n{M}x{N}x{K} bfloat16: cuBLAS F.linear alone {base:.1f} us "
          f"({2 * M * N * K / base / 1e6:.0f} TFLOP/s); cuBLAS bf16 gelu err {cublas_err:.2e}")
    for name, (us, extra) in rows.items():
        print(f"  {name:48s} {us:9.1f} us  {us / base:6.3f}x{extra}")
    best = {a: min((us for n, (us, _) in rows.items() if n.startswith(f"quack {a}")), default=float("nan"))
            for a in ("bias", "gelu_tanh_approx")}
    print(f"  best quack bias {best['bias'] / base:.3f}x, best quack bias+gelu {best['gelu_tanh_approx'] / base:.3f}x "
          f"the cuBLAS linear alone; bias+gelu / bias (quack best) {best['gelu_tanh_approx'] / best['bias']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: SHAPES)")
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    import quack.gemm_interface  # noqa: F401
    print(torch.cuda.get_device_name(), torch.__version__, f"quack import {time.perf_counter() - t0:.2f} s")
    for M, N, K in shapes:
        probe_shape(M, N, K)


if __name__ == "__main__":
    main()
