"""Does any of cuBLASLt's ranked algorithms with the bias + GELU epilogue run linear + bias + gelu tanh
within 1% of the linear alone (issue 23's fused goal; torch._addmm_activation, the heuristic's first
choice, measured 1.035x at 4096x14336x4096 on the H200)?

Per shape (bfloat16, ``F.linear(x, w, b)`` layouts: x row-major M x K, w N x K): F.linear without bias
(cuBLAS), cuBLASLt ranks 0-7 with no epilogue, with BIAS, with GELU_BIAS; torch._addmm_activation;
addmm + F.gelu. CUDA-graph replay (probe_timing.timed, 8 rotated inputs), us per call. The worst
error of each GELU_BIAS rank against float32 gelu_tanh(x @ w.T + b), relative to the output's scale.
Run: ``PYTHONPATH=src python benchmarks/experiments/cublaslt_epilogue_probe.py [--ranks N] [--shapes MxNxK,...]``
(``--ranks``: how many algorithms the heuristic is asked for, 8 as the candidates do by default; a later
question: do ranks past 8 hold a bias + GELU algorithm as fast as the best plain one?).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import timed  # noqa: E402

from tunekit.backends import cublaslt  # noqa: E402

EPILOGUE, BIAS_POINTER = 7, 8
EPILOGUES = {"none": 1, "bias": 4, "gelu_bias": 36}
SHAPES = [(16, 14336, 4096), (128, 14336, 4096), (4096, 14336, 4096), (8192, 14336, 4096), (4096, 4096, 4096)]


def plan_with(a, b, epilogue: int):
    """A fresh plan (not the module's cache) whose descriptor carries ``epilogue``; heuristic re-run."""
    plan = cublaslt.Plan(a, b, False)
    lib = cublaslt._library()[0]
    v = ctypes.c_int32(epilogue)
    assert lib.cublasLtMatmulDescSetAttribute(plan.desc, EPILOGUE, ctypes.byref(v), 4) == 0
    plan.algorithms = plan._heuristic(lib, {"a": cublaslt._alignment(b), "b": cublaslt._alignment(a), "c": 16, "d": 16},
                                      cublaslt._REDUCE_IN_COMPUTE_TYPE)
    return plan


def set_bias(plan, bias) -> None:
    lib = cublaslt._library()[0]
    p = ctypes.c_void_p(bias.data_ptr())
    assert lib.cublasLtMatmulDescSetAttribute(plan.desc, BIAS_POINTER, ctypes.byref(p), 8) == 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=cublaslt.MAX_ALGORITHMS)
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: SHAPES)")
    args = ap.parse_args()
    cublaslt.MAX_ALGORITHMS = args.ranks  # read when a plan is made and its heuristic asked
    shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, f"heuristic asked for {args.ranks} algorithms")
    bf = torch.bfloat16
    for M, N, K in shapes:
        xs = [torch.randn(M, K, device="cuda", dtype=bf) for _ in range(8)]
        ws = [torch.randn(N, K, device="cuda", dtype=bf) / K ** 0.5 for _ in range(8)]
        bs = [torch.randn(N, device="cuda", dtype=bf) for _ in range(8)]
        outs = [torch.empty(M, N, device="cuda", dtype=bf) for _ in range(8)]
        rows = {"F.linear (no bias)": timed(lambda i: F.linear(xs[i % 8], ws[i % 8])),
                "F.linear + bias": timed(lambda i: F.linear(xs[i % 8], ws[i % 8], bs[i % 8])),
                "addmm + gelu tanh": timed(lambda i: F.gelu(F.linear(xs[i % 8], ws[i % 8], bs[i % 8]),
                                                            approximate="tanh")),
                "_addmm_activation": timed(lambda i: torch._addmm_activation(bs[i % 8], xs[i % 8], ws[i % 8].t(),
                                                                             use_gelu=True))}
        ref = F.gelu(F.linear(xs[0].float(), ws[0].float(), bs[0].float()), approximate="tanh")
        scale = float(ref.abs().max())
        for kind, code in EPILOGUES.items():
            plan = plan_with(xs[0], ws[0].t(), code)
            for rank in range(plan.algorithms):
                def call(i, plan=plan, rank=rank, kind=kind):
                    i %= 8
                    if kind != "none":
                        set_bias(plan, bs[i])  # captured per call: the descriptor's bias at capture time
                    cublaslt.matmul(plan, rank, xs[i], ws[i].t(), outs[i])
                try:
                    us = timed(call)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{M}x{N}x{K} {kind} h{rank}: {type(exc).__name__}: {exc}")
                    continue
                err = ""
                if kind == "gelu_bias":
                    outs[0].fill_(float("nan"))
                    call(0)
                    torch.cuda.synchronize()
                    err = f"  max err / max|ref| {float((outs[0].float() - ref).abs().max()) / scale:.2e}"
                rows[f"cublaslt {kind} h{rank}"] = us
                if err:
                    rows[f"cublaslt {kind} h{rank}"] = (us, err)
        base = rows["F.linear (no bias)"]
        print(f"\n{M}x{N}x{K} bfloat16: F.linear alone {base:.1f} us")
        for name, value in rows.items():
            us, err = value if isinstance(value, tuple) else (value, "")
            print(f"  {name:28s} {us:9.1f} us  {us / base:6.3f}x{err}")


if __name__ == "__main__":
    main()
