"""How fast can anything read the input of a reduction at a given size? The ceiling behind
logsumexp's "% of the 1 GiB copy" (issue 4's target: 90% on inputs of 32 MiB and more).

A reduction over a dimension reads its input once and writes almost nothing, so no logsumexp can
beat the best pure read of the same bytes. This times, on L2-cold rotated buffers and CUDA-graph
replay, read-only kernels with 16-byte loads (1/2/4/8 in flight per thread, one block per tile or a
persistent grid; each block folds what it read with XOR into one word it writes, so the loads
cannot be dropped) and torch's own ``sum`` of the same tensor, each as % of the 1 GiB copy
bandwidth measured in the same run (bytes read / time / copy bandwidth, the logsumexp benchmark's
measure).

Run: ``PYTHONPATH=src python benchmarks/ceilings/read_ceiling.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tunekit.bench.suites.common import head_to_head  # noqa: E402
from copy_ceiling import kernels, tiled_contenders  # noqa: E402
from tunekit.bench.measure import copy_bandwidth, versions  # noqa: E402
from tunekit.tunable.timing import l2_cache_bytes  # noqa: E402

SOURCE = r"""
template <int UNROLL>
__device__ __forceinline__ void read_tiles(const uint4* __restrict__ x, unsigned int* __restrict__ y, long long n) {
  const long long tile = static_cast<long long>(blockDim.x) * UNROLL;
  unsigned int acc = 0;
  for (long long b = blockIdx.x; b * tile < n; b += gridDim.x) {
    const long long base = b * tile + threadIdx.x;
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + static_cast<long long>(u) * blockDim.x;
      v[u] = i < n ? x[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0) atomicXor(y + blockIdx.x, acc);
}
#define READ(name, U) \
  extern "C" __global__ void __launch_bounds__(256) name(const uint4* x, unsigned int* y, long long n) { read_tiles<U>(x, y, n); }
READ(read_x1, 1)
READ(read_x2, 2)
READ(read_x4, 4)
READ(read_x8, 8)
"""
KERNELS = ["read_x1", "read_x2", "read_x4", "read_x8"]
#: (shape, dtype, which logsumexp cases read that many bytes)
SIZES = [((4096, 4096), torch.float16, "16-bit 4096x4096 (rows or dim 0), 32x4096x128; float32 16384x512, 8192x1024"),
         ((4096, 4096), torch.float32, "float32 4096x4096, dim 0, 32x4096x128; 16-bit 1024x32768"),
         ((64, 1 << 20), torch.float16, "16-bit 64x1M, 4x16M; float32 1024x32768"),
         ((64, 1 << 20), torch.float32, "float32 64x1M, 4x16M")]


def contenders(ks, sms):
    return {"torch sum (graph)": (lambda p: torch.sum(p[0]), True), **tiled_contenders(ks, sms)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    bw = copy_bandwidth(device)
    cont = contenders(kernels(device, SOURCE, "read_ceiling.cu", KERNELS), sms)
    lines = [f"# Read ceiling: {name} ({time.strftime('%Y-%m-%d')})", "",
             f"torch {versions()['torch']}; 1 GiB copy bandwidth (read + write) **{bw:.0f} GB/s**; L2-cold rotated "
             f"buffers, CUDA-graph replay, median of {args.repeats} rounds. Cells: bytes read as % of the 1 GiB "
             "copy (µs per call).", ""]
    header = "| read | " + " | ".join(f"{math.prod(s) * d.itemsize >> 20} MiB ({s[0]}x{s[1]} {str(d).removeprefix('torch.')})"
                                      for s, d, _ in SIZES) + " |"
    lines += [header, "|---|" + "---:|" * len(SIZES)]
    table = {}
    for shape, dtype, _ in SIZES:
        nbytes = math.prod(shape) * dtype.itemsize
        count = min(16, max(1, math.ceil(2 * l2_cache_bytes(device) / nbytes)))
        sets = [(torch.randn(shape, device=device, dtype=dtype), torch.zeros(1 << 20, dtype=torch.int32, device=device))
                for _ in range(count)]
        res = head_to_head(cont, sets, device, args.repeats)
        for cname, (ms, _) in res.items():
            table.setdefault(cname, []).append((nbytes / (ms * 1e-3) / 1e9 / bw * 100, ms * 1e3))
        del sets
        torch.cuda.empty_cache()
    for cname, cells in table.items():
        lines.append(f"| {cname} | " + " | ".join(f"{p:.1f} ({us:.2f})" for p, us in cells) + " |")
    best = [max(cells[i][0] for cells in table.values()) for i in range(len(SIZES))]
    lines += ["", "Best read per size, and the logsumexp cases reading that many bytes:", ""]
    lines += [f"- {math.prod(s) * d.itemsize >> 20} MiB: **{b:.1f}%** ({cases})" for (s, d, cases), b in zip(SIZES, best)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"read_ceiling-{name.replace(' ', '_')}.md").write_text(text)


if __name__ == "__main__":
    main()
