"""Answers: what made a fresh process's first GEMM check (cublaslt_h0: 196 ms of CPU time, H100) spend the
first signature's whole tuning budget? Times, in one fresh process, the first and second call of each
step a check takes: torch.mm, cuBLASLt's plan and algorithms, the float64 reference, check_gemm.
GPU only. ``PYTHONPATH=src python benchmarks/experiments/gemm_check_first_cost.py``"""
import time, torch
from tunekit.backends import cublaslt
from tunekit.ops.gemm import GemmParams
from tunekit.ops.gemm.numerics import check_gemm
from tunekit.tunable.params import make_trial

def t(label, fn):
    torch.cuda.synchronize(); s = time.perf_counter(); r = fn(); torch.cuda.synchronize()
    print(f"{label:40s} {1e3 * (time.perf_counter() - s):8.2f} ms"); return r

for M, N, K in ((4096, 6144, 4096), (777, 1555, 333), (4097, 4095, 4096)):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    a, b = x, w.t(); out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    print(f"## {M}x{N}x{K}")
    t("torch.mm first", lambda: torch.mm(a, b))
    t("torch.mm second", lambda: torch.mm(a, b))
    plan = t("plan_for", lambda: cublaslt.plan_for(a, b, False))
    for rank in range(min(2, plan.algorithms)):
        t(f"h{rank} first", lambda: cublaslt.matmul(plan, rank, a, b, out))
        t(f"h{rank} second", lambda: cublaslt.matmul(plan, rank, a, b, out))
    from tunekit.ops.gemm import numerics
    p = make_trial(GemmParams(a, b))
    got = (torch.mm(a, b),)
    t("reference (float64) first", lambda: numerics.reference(p))
    t("reference (float64) again", lambda: numerics.reference(p))
    t("a.float() @ b.float() (tf32 off)", lambda: a.float() @ b.float())
    t("a.float() @ b.float() again", lambda: a.float() @ b.float())
    t("check_gemm first (reference + default error)", lambda: check_gemm(p, got, got))
    t("check_gemm second", lambda: check_gemm(p, got, got))
