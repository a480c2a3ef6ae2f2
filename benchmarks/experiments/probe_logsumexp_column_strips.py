"""Timing probe, not a candidate: can a reduction over a non-last dim finish in one pass at 64 MiB?

The library's columns kernels cut R into 8 splits and merge the partials in a second pass: float32
dim 0 of 4096x4096 (and dim 1 of 32x4096x128) takes 20.2-20.5 us, of which the first pass alone is
17.9-18.1 us and the merge ~2.1 us, where issue 4's 90% of copy allows 17.47 us and a pure read of
64 MiB takes ~16.7 us. Thread-block clusters (the merge through distributed shared memory) were
2.5-4 us slower (logsumexp_columns_experiments-NVIDIA_H200.md).

Column strips: one block owns W adjacent columns of one outer slice over all R rows, so nothing is
merged outside the block and there is no second pass. Threads (tx, ty): IX threads along the
columns (16 bytes = VEC columns each; W = IX * VEC), TB / IX along R, UNROLL rows in flight per
thread; at the end lanes of a warp that share columns merge by shuffles, then one warp per column
merges the warps' partials from shared memory. At W = 128 bytes (float32 IX = 8, 16-bit IX = 4)
the two shapes have 128 strips: one wave of one block per SM, each block reading 512 KB. Also timed:
the same walk as a pure read (XOR of every word), and the library's candidates in the same harness.
Results checked against float64 torch. Same timer as the other probes (CUDA-graph replay of 40
calls over 8 rotating buffers, median). Needs cuda.bindings:
``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_column_strips.py``. Results:
``benchmarks/results/logsumexp_columns_experiments-NVIDIA_H200.md``."""
import torch

from tunekit.bench.measure import copy_bandwidth
from probe_timing import ProbeModule, library_candidate, timed

PROBE = r'''
namespace {
template <typename T, int IX, int TB, int UNROLL, bool READ_ONLY>
__device__ __forceinline__ void column_strip(const T* x, T* out, unsigned* sink, long long R, long long inner) {
  constexpr int VEC = 16 / sizeof(T), W = IX * VEC, WARPS = TB / 32, RY = TB / IX;
  const int tx = threadIdx.x % IX, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long strips = inner / W;
  const long long o = blockIdx.x / strips;
  const long long i0 = (blockIdx.x - o * strips) * W;
  const long long step = RY * inner;
  const T* ptr = x + o * R * inner + (threadIdx.x / IX) * inner + i0 + tx * VEC;
  const T* const end = x + (o + 1) * R * inner;
  Partial p[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) p[k] = Partial{-TUNEKIT_INF, 0.0f};
  unsigned acc = 0;
  for (; ptr + (UNROLL - 1) * step < end; ptr += UNROLL * step) {
    Pack<T, VEC> pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(ptr + u * step);
    if constexpr (READ_ONLY) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const uint4 w = *reinterpret_cast<const uint4*>(&pk[u]);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = to_float(pk[u].v[k]);
        fold<true>(p[k], v);
      }
    }
  }
  for (; ptr < end; ptr += step) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(ptr);
    if constexpr (READ_ONLY) {
      const uint4 w = *reinterpret_cast<const uint4*>(&pk);
      acc ^= w.x ^ w.y ^ w.z ^ w.w;
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float v[1] = {to_float(pk.v[k])};
        fold<true>(p[k], v);
      }
    }
  }
  if constexpr (READ_ONLY) {
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(sink + blockIdx.x % 1024, acc);
    return;
  }
  // lanes tx, tx + IX, ... of a warp own the same columns
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
#pragma unroll
    for (int offset = IX; offset < 32; offset *= 2) {
      Partial q;
      q.m = __shfl_xor_sync(0xffffffffu, p[k].m, offset);
      q.s = __shfl_xor_sync(0xffffffffu, p[k].s, offset);
      p[k] = merge(p[k], q);
    }
  }
  __shared__ Partial warp_partials[WARPS][W];
  if (lane < IX) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) warp_partials[warp][tx * VEC + k] = p[k];
  }
  __syncthreads();
  for (int c = warp; c < W; c += WARPS) {
    Partial q = lane < WARPS ? warp_partials[lane][c] : Partial{-TUNEKIT_INF, 0.0f};
    q = group_reduce<32>(q);
    if (lane == 0) out[o * inner + i0 + c] = from_float<T>(finish(q));
  }
}
}  // namespace
#define STRIP(IX, TB, U, MINB, sfx, T) \
  extern "C" __global__ void __launch_bounds__(TB, MINB) cs_i##IX##_t##TB##_u##U##_##sfx( \
      const T* x, T* out, unsigned* sink, long long R, long long inner) { \
    column_strip<T, IX, TB, U, false>(x, out, sink, R, inner); } \
  extern "C" __global__ void __launch_bounds__(TB, MINB) read_i##IX##_t##TB##_u##U##_##sfx( \
      const T* x, T* out, unsigned* sink, long long R, long long inner) { \
    column_strip<T, IX, TB, U, true>(x, out, sink, R, inner); }
// float32: IX = 8 is 128 bytes a row (128 strips at 4096 columns), IX = 4 is 64 bytes (256 strips)
STRIP(8, 1024, 4, 1, f32, float) STRIP(8, 1024, 2, 1, f32, float) STRIP(8, 512, 8, 1, f32, float)
STRIP(8, 512, 4, 2, f32, float) STRIP(4, 512, 4, 2, f32, float) STRIP(4, 512, 8, 1, f32, float)
STRIP(4, 256, 8, 4, f32, float)
// 16-bit: IX = 4 is 64 bytes (32 columns: 128 strips), IX = 2 is 32 bytes (256 strips)
STRIP(4, 1024, 4, 1, f16, __half) STRIP(4, 512, 8, 1, f16, __half) STRIP(2, 512, 4, 2, f16, __half)
STRIP(2, 512, 8, 1, f16, __half) STRIP(2, 256, 4, 4, f16, __half)
'''
FORMS = {"f32": [(8, 1024, 4), (8, 1024, 2), (8, 512, 8), (8, 512, 4), (4, 512, 4), (4, 512, 8), (4, 256, 8)],
         "f16": [(4, 1024, 4), (4, 512, 8), (2, 512, 4), (2, 512, 8), (2, 256, 4)]}
LIBRARY = {"f32": ["logsumexp_columns_f32", "logsumexp_columns_narrow_f32_vec"],
           "f16": ["logsumexp_columns_f16_vec", "logsumexp_columns_narrow_f16_vec"]}
CASES = ((torch.float32, "f32", 64 << 20), (torch.float16, "f16", 32 << 20))


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"# {torch.cuda.get_device_name()}; copy (1 GiB, read + write): {bw:.0f} GB/s")
    probe = ProbeModule("logsumexp.cu", PROBE, "probe_column_strips.cu")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1024, dtype=torch.int32, device="cuda")
    print("| shape | dim | kernel | registers | blocks per SM | blocks | us | % of copy | 90% of copy (us) | matches float64 torch |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for dtype, sfx, nbytes in CASES:
        n = nbytes // dtype.itemsize
        for shape, dim in (((4096, n // 4096), 0), ((32, 4096, n // (32 * 4096)), 1)):
            bufs = [torch.randn(shape, device="cuda", dtype=dtype) * 3 for _ in range(8)]
            ref = torch.logsumexp(bufs[0].double(), dim)
            outer = 1 if dim == 0 else shape[0]
            R, inner = shape[dim], bufs[0].numel() // (outer * shape[dim])
            out = torch.empty(ref.shape, device="cuda", dtype=dtype)
            line = nbytes / (0.9 * bw * 1e9) * 1e6
            text = "x".join(map(str, shape))

            def row(kernel, regs, blocks, grid, us, ok):
                pct = nbytes / (us * 1e-6) / 1e9 / bw * 100
                print(f"| {text} {sfx} | {dim} | {kernel} | {regs} | {blocks} | {grid} | {us:.2f} | {pct:.1f} | {line:.2f} | {ok} |")

            for ix, tb, u in FORMS[sfx]:
                w = ix * 16 // dtype.itemsize
                grid = outer * inner // w
                for kind in ("read", "cs"):
                    name = f"{kind}_i{ix}_t{tb}_u{u}_{sfx}"
                    regs, blocks = probe.registers(name, tb)
                    ok = "-"
                    if kind == "cs":
                        out.fill_(float("nan"))
                        probe.launch(name, grid, tb, bufs[0], out, sink, R, inner)
                        torch.cuda.synchronize()
                        ok = "yes" if torch.allclose(out.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
                    us = timed(lambda i: probe.launch(name, grid, tb, bufs[i % 8], out, sink, R, inner))
                    row(name, regs, blocks, grid, us, ok)
            for name in LIBRARY[sfx]:
                timing = library_candidate(name, bufs, (dim,))
                if timing is not None:
                    us, got = timing
                    ok = "yes" if torch.allclose(got.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
                    row(f"library: {name}", "-", "-", "-", us, ok)
    print(f"\n({sms} SMs)")


if __name__ == "__main__":
    main()
