"""Where does 777x1555x333 (bf16) spend its time, per candidate: copies or the GEMM kernel? Kernel
durations from torch.profiler (CUDA activity, mean of 20 calls) for cuBLAS and the Triton candidates
that run it, as F.linear(x, w) and as a @ b. ``PYTHONPATH=src python benchmarks/experiments/gemm_small_odd_profile.py``"""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from tunekit.ops.gemm import GemmParams, mm_op
from tunekit.tunable.params import make_trial


def kernels(run, p, calls=20) -> list[tuple[str, float]]:
    for _ in range(3):
        run(p)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run(p)
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:60]] += e.device_time / calls
    return sorted(total.items(), key=lambda kv: -kv[1])


def main() -> None:
    M, N, K = 777, 1555, 333
    for form in ("linear", "mm"):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t() if form == "linear" else \
            torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        p = make_trial(GemmParams(a, b))
        print(f"## {form}: {p.signature()}")
        for c in mm_op.candidates:
            if c.supports(p) is not None:
                continue
            ks = kernels(c.run, p)
            print(f"{c.name:52s} total {sum(t for _, t in ks):7.2f} us: " + ", ".join(f"{n} {t:.2f}" for n, t in ks))


if __name__ == "__main__":
    main()
