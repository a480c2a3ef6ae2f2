"""Timing probe, not a candidate: what do the exponentials cost the one-wave row blocks?

16-bit 1024x32768 (64 MiB) takes 18.3-18.7 us with `logsumexp_rowblock128_f16_vec`, where a pure read
with the same mapping takes 16.4-16.9 us and issue 4's 90% of copy allows 17.47 us; float32
4096x4096 (the same bytes, half the elements) is within ~0.5 us of its pure read. Per element the
16-bit fold issues a convert, a max, an FFMA and an add (1 cycle each per warp on a scheduler) and
one MUFU.EX2, which occupies the scheduler's quarter-rate MUFU pipe for 8 cycles (16 lanes per SM):
twice the rest. Hypothesis: the MUFU pipe, not issue or DRAM, sets both how fast a warp gets back
to its next loads and the tail after the last bytes arrive.

The test, on the library's row-block kernel (128 threads a row, 4 packs of 16 B in flight, one wave):
- ``nomufu``: every exponential replaced by its argument (one FADD, no MUFU). Wrong results; it
  bounds what any cheaper exponential could gain;
- ``poly<K>d<D>``: K of every 8 elements take 2^t on the FMA pipe (round to nearest by the
  1.5 * 2^23 trick, a degree-D polynomial on [-0.5, 0.5], the integer part added to the exponent
  bits; D = 5: 2.9e-7 relative, as accurate as MUFU.EX2; D = 3: 2.2e-4), the rest MUFU.EX2. Correct
  for finite inputs (the probe's inputs are randn * 3); special values are not handled here.
Results checked against float64 torch (the nomufu forms report NO by design). Same timer as the
other probes (CUDA-graph replay, 8 rotating 64 MiB buffers, median). Needs cuda.bindings:
``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_exp_cost.py``. Results:
``benchmarks/results/logsumexp_rows_experiments-NVIDIA_H200.md``."""
import torch

from tunekit.bench.measure import copy_bandwidth
from probe_timing import ProbeModule, library_candidate, row_buffers, timed

PROBE = r'''
namespace {
// 2^t on the FMA pipe for t <= 0 (t = x log2e - shift log2e): t clamped at -125 so that the
// exponent arithmetic cannot wrap; rounded = t + 1.5 * 2^23 holds round(t) in its low mantissa bits.
template <int DEG>
__device__ __forceinline__ float exp2_fma(float t) {
  t = fmaxf(t, -125.0f);
  const float rounded = t + 12582912.0f;
  const float f = t - (rounded - 12582912.0f);
  float p;
  if constexpr (DEG == 5) {
    p = fmaf(fmaf(fmaf(fmaf(fmaf(0.0012915669940412045f, f, 0.009668530896306038f), f, 0.055516887456178665f), f,
                       0.24022264778614044f), f, 0.6931464672088623f), f, 1.0f);
  } else {
    p = fmaf(fmaf(fmaf(0.05286743491888046f, f, 0.2421518862247467f), f, 0.6935867667198181f), f,
             0.9999627470970154f);
  }
  return __int_as_float(__float_as_int(p) + (__float_as_int(rounded) << 23));
}
// The library's fold (FFMA exponent), with POLY of every 8 exponentials on the FMA pipe; POLY < 0:
// no exponential at all (the argument is added).
template <int POLY, int DEG, int N>
__device__ __forceinline__ void fold_mix(Partial& p, const float (&v)[N]) {
  float tile_max = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) tile_max = fmaxf(tile_max, v[k]);
  const float m = fmaxf(p.m, tile_max);
  const float offset = -shift_of(m) * LOG2E;
  float s = p.s * fast_exp2(fmaf(p.m, LOG2E, offset));
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float t = fmaf(v[k], LOG2E, offset);
    if constexpr (POLY < 0) {
      s += t;
    } else {
      s += (k % 8) < POLY ? exp2_fma<DEG>(t) : fast_exp2(t);
    }
  }
  p = Partial{m, s};
}
// One block of TB threads per row, UNROLL packs of 16 B in flight (the row a whole number of tiles).
template <typename T, int TB, int UNROLL, int POLY, int DEG>
__device__ __forceinline__ void row_block_mix(const T* x, T* out, long long cols) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr long long STEP = static_cast<long long>(TB) * VEC;
  __shared__ Partial warp_partials[TB / 32];
  const T* r = x + blockIdx.x * cols;
  Partial p{-TUNEKIT_INF, 0.0f};
  for (long long c = threadIdx.x * VEC; c < cols; c += UNROLL * STEP) {
    Pack<T, VEC> pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(r + c + u * STEP);
    float v[UNROLL * VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[u * VEC + k] = to_float(pk[u].v[k]);
    fold_mix<POLY, DEG>(p, v);
  }
  p = block_reduce(p, warp_partials);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(finish(p));
}
}  // namespace
#define MIX(NAME, POLY, DEG, sfx, T) extern "C" __global__ void __launch_bounds__(128, 8) \
  NAME##_##sfx(const T* x, T* out, long long cols) { row_block_mix<T, 128, 4, POLY, DEG>(x, out, cols); }
#define MIXES(sfx, T) MIX(base, 0, 5, sfx, T) MIX(nomufu, -1, 5, sfx, T) MIX(poly1d5, 1, 5, sfx, T) \
  MIX(poly2d5, 2, 5, sfx, T) MIX(poly3d5, 3, 5, sfx, T) MIX(poly4d5, 4, 5, sfx, T) MIX(poly2d3, 2, 3, sfx, T) \
  MIX(poly3d3, 3, 3, sfx, T)
MIXES(f16, __half) MIXES(bf16, __nv_bfloat16) MIXES(f32, float)
'''
FORMS = ["base", "nomufu", "poly1d5", "poly2d5", "poly3d5", "poly4d5", "poly2d3", "poly3d3"]
CASES = ((torch.float16, 1024, "f16"), (torch.bfloat16, 1024, "bf16"), (torch.float32, 4096, "f32"))


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"# {torch.cuda.get_device_name()}; copy (1 GiB, read + write): {bw:.0f} GB/s")
    probe = ProbeModule("logsumexp.cu", PROBE, "probe_exp_cost.cu")
    nbytes = 64 << 20
    print(f"90% of copy at 64 MiB: {nbytes / (0.9 * bw * 1e9) * 1e6:.2f} us\n")
    print("| shape | kernel | registers | blocks per SM | us | % of copy | max abs error vs float64 | matches |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for dtype, rows, sfx in CASES:
        cols, bufs, ref = row_buffers(dtype, rows, nbytes)
        out = torch.empty(rows, device="cuda", dtype=dtype)

        def report(kernel, regs, blocks, us):
            err = (out.double() - ref).abs().max().item()
            ok = "yes" if torch.allclose(out.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
            pct = nbytes / (us * 1e-6) / 1e9 / bw * 100
            print(f"| {rows}x{cols} {sfx} | {kernel} | {regs} | {blocks} | {us:.2f} | {pct:.1f} | {err:.2e} | {ok} |")

        for form in FORMS:
            name = f"{form}_{sfx}"
            regs, blocks = probe.registers(name, 128)
            out.fill_(float("nan"))
            probe.launch(name, rows, 128, bufs[0], out, cols)
            torch.cuda.synchronize()
            err_out = out.clone()
            us = timed(lambda i: probe.launch(name, rows, 128, bufs[i % 8], out, cols))
            out.copy_(err_out)
            report(name, regs, blocks, us)
        name = f"logsumexp_rowblock128_{sfx}_vec"
        us, got = library_candidate(name, bufs, (1,))
        out.copy_(got)
        report(f"library: {name}", "-", "-", us)


if __name__ == "__main__":
    main()
