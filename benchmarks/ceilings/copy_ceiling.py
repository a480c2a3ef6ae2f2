"""How fast can anything move the bytes of an elementwise op at a given size? The ceiling behind
the activations' "% of the 1 GiB copy" at 4096x4096.

An elementwise forward reads n elements and writes n. No kernel doing that can beat the best pure
copy of the same bytes, so this times, on L2-cold rotated buffers and CUDA-graph replay (eager for
torch's copy too), every copy we can write: torch's ``copy_`` (a cudaMemcpyAsync), and CUDA C copy
kernels with 16-byte accesses, 1/2/4/8 packs in flight per thread, one block per tile or a
persistent grid, plain or streaming (``__ldcs``/``__stcs``, evict-first) loads and stores. Each is
reported as % of the 1 GiB copy bandwidth measured in the same run (the issue's yardstick).

Run: ``PYTHONPATH=src python benchmarks/ceilings/copy_ceiling.py [--out DIR]``.
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
from tunekit.backends import cuda, nvrtc  # noqa: E402
from tunekit.backends import driver as driver_module  # noqa: E402
from tunekit.bench.measure import copy_bandwidth, versions  # noqa: E402
from tunekit.tunable.timing import l2_cache_bytes  # noqa: E402

SOURCE = r"""
template <int UNROLL, bool STREAM>
__device__ __forceinline__ void copy_tiles(const uint4* __restrict__ x, uint4* __restrict__ y, long long n) {
  const long long tile = static_cast<long long>(blockDim.x) * UNROLL;
  for (long long b = blockIdx.x; b * tile < n; b += gridDim.x) {
    const long long base = b * tile + threadIdx.x;
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + static_cast<long long>(u) * blockDim.x;
      if (i < n) v[u] = STREAM ? __ldcs(x + i) : x[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + static_cast<long long>(u) * blockDim.x;
      if (i < n) {
        if (STREAM) __stcs(y + i, v[u]); else y[i] = v[u];
      }
    }
  }
}
#define COPY(name, U, S) \
  extern "C" __global__ void __launch_bounds__(256) name(const uint4* x, uint4* y, long long n) { copy_tiles<U, S>(x, y, n); }
COPY(copy_x1, 1, false)
COPY(copy_x2, 2, false)
COPY(copy_x4, 4, false)
COPY(copy_x8, 8, false)
COPY(copy_x1_cs, 1, true)
COPY(copy_x4_cs, 4, true)
"""
KERNELS = ["copy_x1", "copy_x2", "copy_x4", "copy_x8", "copy_x1_cs", "copy_x4_cs"]
BLOCK = 256


class InlineKernel(cuda.CudaKernel):
    """A kernel of this script's own source (not a packaged .cu), launched by tunekit's launcher."""

    def __init__(self, module, name):
        super().__init__("copy_ceiling.cu", name)
        self.module = module

    def _load(self, index):
        driver, _ = driver_module.bindings()
        err, fn = driver.cuModuleGetFunction(self.module, self.name.encode())
        driver_module.check(err, f"cuModuleGetFunction({self.name})")
        return fn


def kernels(device, source=SOURCE, filename="copy_ceiling.cu", names=KERNELS):
    """The kernels ``names`` of ``source`` (a script's own CUDA C), compiled for ``device``."""
    driver, _ = driver_module.bindings()
    cubin = nvrtc.compile_cubin(source, filename, nvrtc.arch_of(device))
    err, module = driver.cuModuleLoadData(cubin)
    driver_module.check(err, "cuModuleLoadData")
    return {name: InlineKernel(module, name) for name in names}


def contenders(ks, sms):
    out = {"torch copy_ (eager)": (lambda p: p[1].copy_(p[0]), False),
           "torch copy_ (graph)": (lambda p: p[1].copy_(p[0]), True)}
    return {**out, **tiled_contenders(ks, sms)}


def tiled_contenders(ks, sms):
    """Each kernel ``<name>_x<U>[...]`` (U 16-byte packs per thread per tile, arguments (in, out,
    packs)) launched one block per tile and as a persistent grid, on CUDA-graph replay."""
    out = {}
    for name, k in ks.items():
        unroll = int(name.split("_x")[1].split("_")[0])
        for persistent in (False, True):
            def run(p, k=k, unroll=unroll, persistent=persistent):
                n = p[0].numel() * p[0].element_size() // 16
                grid = -(-n // (BLOCK * unroll))
                if persistent:
                    grid = min(grid, sms * (2048 // BLOCK))
                k.launch(p[0].get_device(), grid, BLOCK, p[0], p[1], n)
            out[name + ("_persistent" if persistent else "")] = (run, True)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    bw = copy_bandwidth(device)
    ks = kernels(device)
    cont = contenders(ks, sms)
    lines = [f"# Copy ceiling: {name} ({time.strftime('%Y-%m-%d')})", "",
             f"torch {versions()['torch']}; 1 GiB copy bandwidth (read + write) **{bw:.0f} GB/s**; L2-cold rotated "
             f"buffers, median of {args.repeats} rounds. Cells: % of the 1 GiB copy (µs per call).", ""]
    sizes = [((4096, 4096), torch.float16), ((4096, 4096), torch.float32), ((8192, 8192), torch.float16),
             ((8192, 8192), torch.float32)]
    header = "| copy | " + " | ".join(f"{s[0]}x{s[1]} {str(d).removeprefix('torch.')} ({2 * math.prod(s) * d.itemsize >> 20} MiB moved)"
                                      for s, d in sizes) + " |"
    lines += [header, "|---|" + "---:|" * len(sizes)]
    table = {}
    for shape, dtype in sizes:
        nbytes = 2 * math.prod(shape) * dtype.itemsize
        count = min(16, max(1, math.ceil(2 * l2_cache_bytes(device) / nbytes)))
        sets = []
        for _ in range(count):
            x = torch.randn(shape, device=device, dtype=dtype)
            sets.append((x, torch.empty_like(x)))
        for cname, (fn, _) in cont.items():  # every copy is exact
            y = sets[0][1]
            y.fill_(float("nan"))
            fn(sets[0])
            torch.cuda.synchronize()
            assert torch.equal(y, sets[0][0]), cname
        res = head_to_head(cont, sets, device, args.repeats)
        for cname, (ms, _) in res.items():
            table.setdefault(cname, []).append((nbytes / (ms * 1e-3) / 1e9 / bw * 100, ms * 1e3))
        del sets
        torch.cuda.empty_cache()
    for cname, cells in table.items():
        lines.append(f"| {cname} | " + " | ".join(f"{p:.1f} ({us:.2f})" for p, us in cells) + " |")
    best = [max(cells[i][0] for cells in table.values()) for i in range(len(sizes))]
    lines += ["", "Best copy per size: " + ", ".join(f"{s[0]}x{s[1]} {str(d).removeprefix('torch.')}: **{b:.1f}%**"
                                                    for (s, d), b in zip(sizes, best))]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"copy_ceiling-{name.replace(' ', '_')}.md").write_text(text)


if __name__ == "__main__":
    main()
