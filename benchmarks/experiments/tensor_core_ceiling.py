"""Answers: what bf16 tensor-core rate does this GPU sustain, at what SM clock, beside cuBLAS's 8192^3? Issue 23 asks
1.08x over cuBLAS on aligned shapes with M >= 1024; on the H100 cuBLAS already runs at ~80% of the 989 TFLOP/s
datasheet peak, a peak that assumes the 1830 MHz boost clock for 132 SMs x 4096 dense bf16 FLOP per clock.
(1) cuBLAS bf16 8192^3 and (2) a Triton kernel doing only tensor-core MMAs on operands loaded once (no memory
traffic in its loop: integer patterns, or random bf16 tiles, whose toggling bits draw a real GEMM's power) each
run ~4 s of CUDA-graph replays while nvidia-smi samples the SM clock and the power.
The clock-scaled peak (132 x 4096 x clock) and the MMA-only rate bound what any GEMM kernel can reach here.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/tensor_core_ceiling.py``
"""

from __future__ import annotations

import statistics
import subprocess
import time

import torch
import triton
import triton.language as tl

FLOP_PER_CLOCK_PER_SM = 4096  # dense bf16 on an H100 / H200 SM (989.4 TFLOP/s = 132 x 4096 x 1.83 GHz)


@triton.jit
def _mma_only(out_ptr, a_ptr, b_ptr, ITERS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              RANDOM: tl.constexpr):
    pid = tl.program_id(0)
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    if RANDOM:  # random bf16 operands, loaded once: the bits a real GEMM toggles, and its power
        a = tl.load(a_ptr + pid * BM * BK + rm[:, None] * BK + rk[None, :])
        b = tl.load(b_ptr + pid * BK * BN + rk[:, None] * BN + rn[None, :])
    else:  # small integer patterns: few bits toggle
        a = ((rm[:, None] * 3 + rk[None, :] + pid) % 7).to(tl.bfloat16) * 0.01
        b = ((rk[:, None] + rn[None, :] * 5 + pid) % 5).to(tl.bfloat16) * 0.01
    acc0 = tl.zeros((BM, BN), tl.float32)
    acc1 = tl.zeros((BM, BN), tl.float32)
    for _ in range(ITERS):  # two independent chains keep the MMA pipe full between waits
        acc0 = tl.dot(a, b, acc0)
        acc1 = tl.dot(a, b, acc1)
    offs = pid * BM * BN + rm[:, None] * BN + rn[None, :]
    tl.store(out_ptr + offs, acc0 + acc1)


def _sampled(fn, seconds: float) -> tuple[float, list[float], list[float]]:
    """fn's median ms per replay over ``seconds`` of replays, with the SM clocks (MHz) and power (W) sampled."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].splitlines() if "," in line]
    clocks = [float(r[0]) for r in rows[len(rows) // 4:]]  # the first quarter: ramping up
    power = [float(r[1]) for r in rows[len(rows) // 4:]]
    return statistics.median(times[len(times) // 4:]), clocks, power


def _graph(fn, reps: int):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g.replay


def _report(name, flops, ms, clocks, power, sms):
    tf = flops / ms / 1e9
    clock = statistics.median(clocks)
    scaled = sms * FLOP_PER_CLOCK_PER_SM * clock * 1e6 / 1e12
    print(f"{name:34s} {tf:7.1f} TFLOP/s  SM clock median {clock:6.0f} MHz (min {min(clocks):.0f}, max {max(clocks):.0f})"
          f"  power median {statistics.median(power):5.0f} W  clock-scaled peak {scaled:6.1f}: {tf / scaled:6.1%}")
    return tf


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"{props.name}: {sms} SMs; torch {torch.__version__}, triton {triton.__version__}")
    n, reps = 8192, 20
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    cublas = _graph(lambda: torch.mm(a, b, out=c), reps)
    ms, clocks, power = _sampled(cublas, 4.0)
    best = {"cuBLAS 8192^3": _report("cuBLAS bf16 8192^3", 2 * n ** 3 * reps, ms, clocks, power, sms)}
    for bm, bn, warps, random in ((128, 128, 8, False), (128, 128, 8, True), (128, 128, 4, True)):
        programs, iters = sms * 2, 2048
        out = torch.empty(programs * bm * bn, device="cuda", dtype=torch.float32)
        a_tiles = torch.randn(programs * bm * 64, device="cuda", dtype=torch.bfloat16)
        b_tiles = torch.randn(programs * 64 * bn, device="cuda", dtype=torch.bfloat16)
        launch = lambda: _mma_only[(programs,)](out, a_tiles, b_tiles, ITERS=iters, BM=bm, BN=bn, BK=64,  # noqa: E731
                                                RANDOM=random, num_warps=warps)
        try:
            replay = _graph(launch, 4)
            ms, clocks, power = _sampled(replay, 4.0)
        except Exception as e:  # a tile the compiler or the registers refuse
            print(f"MMA only {bm}x{bn}x64 w{warps}: {type(e).__name__}: {str(e)[:200]}")
            continue
        flops = 2 * bm * bn * 64 * 2 * iters * programs * 4
        name = f"MMA only {bm}x{bn}x64 w{warps} {'random' if random else 'pattern'}"
        best[name] = _report(name, flops, ms, clocks, power, sms)
    mma = max([v for k, v in best.items() if k.endswith("random")] or [float("nan")])
    print(f"cuBLAS / best MMA-only rate on random operands: {best['cuBLAS 8192^3'] / mma:.1%}; 1.08x cuBLAS would "
          f"need {1.08 * best['cuBLAS 8192^3']:.0f} TFLOP/s, {1.08 * best['cuBLAS 8192^3'] / mma:.1%} of it")


if __name__ == "__main__":
    main()
