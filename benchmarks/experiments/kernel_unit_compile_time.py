"""Answers: how long does NVRTC take to compile one candidate's kernel alone (its unit from
backends/kernel_units.py) against the whole .cu file it lives in? No GPU needed (sm_90 cubins).

    PYTHONPATH=src python benchmarks/experiments/kernel_unit_compile_time.py [--out FILE]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from tunekit.backends import kernel_units, nvrtc

#: (file, a kernel a candidate of that file runs)
SAMPLES = [("silu.cu", "silu_f16x8_pack"), ("gelu.cu", "gelu_f16x8_pack"),
           ("logsumexp.cu", "logsumexp_rowblock128_f16_vec"), ("logsumexp_backward.cu", "logsumexp_backward_flat_f16")]


def _seconds(code: str, name: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        nvrtc.compile_cubin(code, name, "sm_90", use_cache=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", help="write the table here too")
    args = parser.parse_args()
    lines = [f"NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))}, sm_90, {platform.processor() or platform.machine()}, "
             f"median of {args.reps}", "", "| file | kernels | whole file (s) | kernel | alone (s) |", "|---|---|---|---|---|"]
    for filename, kernel in SAMPLES:
        names = kernel_units.kernel_names(filename)
        whole = _seconds(nvrtc.source(filename), filename, args.reps)
        alone = _seconds(kernel_units.kernel_source(filename, kernel), kernel, args.reps)
        lines.append(f"| {filename} | {len(names)} | {whole:.2f} | {kernel} | {alone:.3f} |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
