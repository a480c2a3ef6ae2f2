"""Answers: does tuning's device timing favour one of two candidates that run the *same* kernel (torch's
silu on 1 << 26 floats: a 0.19 ms memory-bound kernel), e.g. the one timed first? A GPU test
(``test_host_time_breaks_no_tie_when_the_device_is_the_bottleneck``) saw them 1.12x apart in 2 of 5
runs. Each trial: a fresh TunableOp with two identical candidates ("a" the default, "b"), a fresh
input, ``find_fastest`` with the default settings; prints both times and which won.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/same_kernel_order_probe.py [--trials N] [--log2 26]``
"""
import argparse

import torch

from tunekit.ops.silu import SiluParams, torch_silu
from tunekit.tunable import find_fastest, tuning
from tunekit.tunable.tunable_op import TunableOp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--log2", type=int, default=26)
    args = ap.parse_args()
    ratios = []
    for trial in range(args.trials):
        op = TunableOp(f"same_kernel_{trial}", SiluParams)
        op.add(lambda p: torch_silu(p), name="a", default=True)
        op.add(lambda p: torch_silu(p), name="b")
        params = SiluParams(torch.randn(1 << args.log2, device="cuda"))
        with tuning(max_tuning_ms=5000) as s:
            report = find_fastest(op, params, s)
        a, b = report.candidates["a"].time_ms, report.candidates["b"].time_ms
        ratios.append(a / b if a and b else float("nan"))
        print(f"trial {trial}: a {a:.4f} ms  b {b:.4f} ms  a/b {ratios[-1]:.3f}  choice {report.choice}", flush=True)
    print(f"a/b median {sorted(ratios)[len(ratios) // 2]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
