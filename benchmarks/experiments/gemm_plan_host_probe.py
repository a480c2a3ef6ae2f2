"""What does a call decided for a Triton (or CUDA C decode) GEMM candidate cost the host once it is planned (replayed from
C++: ``ops/gemm/launch_plans.py``), against torch's own call and a call routed to it? This sets
``PLANNED_HOST_MS`` (``ops/gemm/op.py``), the floor a planned challenger's device saving must pass.

Host us per call, measured as the wall time of 300 back-to-back calls queued behind a 20 ms spin kernel
(the GPU busy: calls only enqueue, so the time is the host's, whatever the kernels' device time),
interleaved repeats, medians. Per shape (``F.linear(x, w)``, bfloat16): ``F.linear``; ``tunekit.linear``
decided for torch's kernel (routed); decided for a Triton candidate, planned; the same with its plan
taken away (the general path: what every such call cost before plans); the candidate's own
``run(params)``. The planned result is checked equal to the candidate's own. GPU only.

    PYTHONPATH=src python benchmarks/experiments/gemm_plan_host_probe.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tunekit
from tunekit.ops.gemm import GemmParams, mm_op, routes
from tunekit.tunable import context
from tunekit.tunable.tunable_op import Resolution

SHAPES = [  # (M, N, K, a plannable candidate that runs it)
    (777, 1555, 333, "triton_matmul_m128_n128_k32_g8_sk1_w4_s4"),
    (1, 4096, 4096, "triton_matmul_m16_n64_k128_g8_sk4_w4_s4"),
    (64, 64, 64, "triton_matmul_m64_n64_k32_g8_sk1_w4_s2"),
    (512, 1024, 512, "triton_tma_m128_n128_k64_g8_sk1_w8_s4"),
    (1, 4096, 4096, "cuda_gemv_w2_u8"),  # the CUDA C decode kernels (ops/gemm/cuda_decode.py): planned too
    (16, 4096, 4096, "cuda_decode_g2_w8_u2"),
]
CALLS, REPEATS, SPIN_CYCLES = 300, 9, 40_000_000


def host_us(fns: dict) -> dict:
    """{name: median host us per call} with the GPU kept busy by a spin kernel while the calls enqueue."""
    samples = {n: [] for n in fns}
    for _ in range(REPEATS):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            torch.cuda._sleep(SPIN_CYCLES)
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            samples[name].append((time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return {n: statistics.median(s) for n, s in samples.items()}


def decide(candidate, p, settings) -> None:
    """Make ``candidate`` this process's decision for ``p``'s signature under ``settings``."""
    sig = p.signature()
    mm_op._decided.setdefault(settings.cache_id, {})[sig] = Resolution(candidate, "probe", sig, str(p.device))


def main() -> int:
    assert routes.ready(), "the C++ routes did not build"
    dev = torch.device("cuda")
    tmp = Path(tempfile.mkdtemp())
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; host us per call (GPU busy), bf16 F.linear form")
    for i, (M, N, K, name) in enumerate(SHAPES):  # results files per row: a shape met twice starts afresh
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        p = GemmParams(x, w.t())
        c = mm_op.candidate(name)
        why = getattr(c, "cannot_run", c.supports)(p)
        if why:
            print(f"{M}x{N}x{K}: {name} cannot run ({why})")
            continue
        c.prepare(p)
        linear = lambda: tunekit.linear(x, w)  # noqa: E731
        context.configure(results=str(tmp / f"torch{i}.sqlite"), use_shipped=False)
        decide(mm_op.candidate("torch_mm"), p, context.current())
        for _ in range(3):
            linear()
        routed = list(routes.routed_keys().values())
        res = host_us({"F.linear": lambda: F.linear(x, w), "tunekit.linear routed (torch_mm)": linear})
        context.configure(results=str(tmp / f"triton{i}.sqlite"))
        decide(c, p, context.current())
        for _ in range(200):  # the plans' extension builds on its worker at the first ask
            linear()
            if any(v not in (True, False) for v in routes.routed_keys().values()):
                break
            time.sleep(0.05)
        table = routes.routed_keys()
        planned, own = linear(), c.run(GemmParams(x, w.t()))
        torch.cuda.synchronize()
        same = torch.equal(planned, own)
        res.update(host_us({"F.linear (again)": lambda: F.linear(x, w), f"tunekit.linear planned ({name})": linear,
                            f"{name}.run(params)": lambda: c.run(p)}))
        key = next(iter(table))
        routes._routes[context.current().cache_id][key] = False  # the plan taken away: the general path
        res.update(host_us({"tunekit.linear general path (no plan)": linear}))
        print(f"## {M}x{N}x{K}: routed table {routed}, planned table {sorted({type(v).__name__ for v in table.values()})}, "
              f"planned == candidate's own: {same}")
        for n, us in res.items():
            print(f"{n:62s} {us:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
