"""What does a call of a Triton GEMM candidate cost the host now that Triton kernels launch from kept
cubins (backends/triton_static.py), against torch's routed call? The challenger floor
(``ops/gemm/op.py``, ``CHALLENGER_HOST_MS``) was set when Triton's Python launcher ran every call.

777x1555x333 bfloat16 as ``F.linear(x, w)`` (issue 23's small odd shape). Host us per call (wall of
back-to-back calls, interleaved repeats, medians): ``F.linear``; ``tunekit.linear`` once decided
(routed to torch's function from C++ when torch's kernel is the choice); each candidate's own
``run(params)`` on prebuilt params (the kernel call alone: no checks, no params, no cache key); and
``TunableOp.call`` on fresh params (the general path a decided challenger takes). GPU only.

    PYTHONPATH=src python benchmarks/experiments/gemm_triton_host_probe.py [--profile]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import triton_static
from tunekit.bench.measure import host_us_per_call
from tunekit.ops.gemm import GemmParams, mm_op

NAMES = ["torch_mm", "cublaslt_h0", "triton_matmul_m128_n128_k64_g8_sk1_w8_s3", "triton_matmul_m64_n64_k32_g8_sk1_w4_s2",
         "triton_padded_m128_n128_k64_g8_sk1_w8_s4"]


def main() -> int:
    dev = torch.device("cuda")
    x = torch.randn(777, 333, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1555, 333, device=dev, dtype=torch.bfloat16)
    p = GemmParams(x, w.t())
    fns = {"F.linear": lambda: F.linear(x, w)}
    for _ in range(50):
        tunekit.linear(x, w)  # decided (shipped or tuned) and routed where torch's kernel is the choice
    torch.cuda.synchronize()
    fns["tunekit.linear (decided)"] = lambda: tunekit.linear(x, w)
    for name in NAMES:
        c = mm_op.candidate(name)
        why = c.supports(p)
        if why:
            print(f"{name}: unsupported here ({why})")
            continue
        getattr(c, "prepare", lambda p: None)(p)
        for _ in range(5):
            c.run(p)
        torch.cuda.synchronize()
        fns[f"{name}.run(params)"] = lambda c=c: c.run(p)
    fns["GemmParams(x, w.t()) alone"] = lambda: GemmParams(x, w.t())
    res = host_us_per_call(fns, dev, calls=1000, repeats=9)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; 777x1555x333 bf16 linear; host us per call")
    for name, us in res.items():
        print(f"{name:55s} {us:8.2f} us")
    if "--profile" in sys.argv:  # where a Triton candidate's host time goes (cProfile of 2000 runs)
        import cProfile
        import pstats

        c = mm_op.candidate(NAMES[2])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            c.run(p)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    kept = sum(type(v).__name__ == "_Loaded" for v in triton_static._table.values())
    print(f"kept Triton launches loaded: {kept} of {len(triton_static._table)} keys; "
          f"Triton imported: {'triton' in sys.modules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
