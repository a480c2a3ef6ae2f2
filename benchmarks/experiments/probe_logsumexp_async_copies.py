"""Timing probe, not a candidate: do loads that no longer wait for the math close the 64 MiB row gap?

16-bit 1024x32768 takes 18.2-18.7 us with `logsumexp_rowblock128_f16_vec`, against 16.4-16.9 us for a
pure read with the same mapping and 17.47-17.58 us allowed by issue 4's 90% of copy. With no
exponential at all (`probe_logsumexp_exp_cost.py`, nomufu) it still takes 17.1 us (bfloat16 17.6):
each warp issues its next loads only after the math on the last ones, so while MUFU-heavy math
runs, fewer bytes are in flight. Software pipelining in registers (the next tile's loads first)
did not help (62 registers, `probe_logsumexp_one_wave.py`).

Here the loads are `cp.async` copies into shared memory: each thread copies its own packs STAGES - 1
tiles ahead, waits only for the oldest tile (`cp.async.wait_group`), reads it back (LDS.128) and
folds it. No barrier (a thread reads only what it copied), and the bytes in flight cost shared
memory, not registers: 128 threads x (STAGES - 1) x UNROLL x 16 B per block, 8 blocks per SM.
Same fold and block reduction as the library (logsumexp.cu). Results checked against float64 torch;
same timer as the other probes. ``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_async_copies.py``.
Results: ``benchmarks/results/logsumexp_rows_experiments-NVIDIA_H200.md``."""
import torch

from tunekit.bench.measure import copy_bandwidth
from probe_timing import ProbeModule, library_candidate, row_buffers, timed

PROBE = r'''
namespace {
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory"); }

// One block of TB threads per row; the row a whole number of tiles of UNROLL packs per thread.
template <typename T, int TB, int UNROLL, int STAGES>
__device__ __forceinline__ void row_block_async(const T* x, T* out, long long cols) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr long long STEP = static_cast<long long>(TB) * VEC, TILE = UNROLL * STEP;
  __shared__ uint4 stage[STAGES][UNROLL][TB];
  __shared__ Partial warp_partials[TB / 32];
  const T* r = x + blockIdx.x * cols + threadIdx.x * VEC;
  const int tiles = static_cast<int>(cols / TILE);
  auto issue = [&](int tile) {
    if (tile < tiles) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) copy_async_16(&stage[tile % STAGES][u][threadIdx.x], r + tile * TILE + u * STEP);
    }
    commit_copies();  // an empty group past the end keeps the count of pending groups fixed
  };
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) issue(t);
  Partial p{-TUNEKIT_INF, 0.0f};
  for (int t = 0; t < tiles; ++t) {
    issue(t + STAGES - 1);
    wait_copies<STAGES - 1>();
    float v[UNROLL * VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const uint4 w = stage[t % STAGES][u][threadIdx.x];
      const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(&w);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[u * VEC + k] = to_float(pk.v[k]);
    }
    fold<true>(p, v);
  }
  p = block_reduce(p, warp_partials);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(finish(p));
}
}  // namespace
#define ASYNC(TB, U, S, MINB, sfx, T) extern "C" __global__ void __launch_bounds__(TB, MINB) \
  rbasync_t##TB##_u##U##_s##S##_##sfx(const T* x, T* out, long long cols) { row_block_async<T, TB, U, S>(x, out, cols); }
#define ASYNCS(sfx, T) ASYNC(128, 4, 2, 8, sfx, T) ASYNC(128, 4, 3, 8, sfx, T) ASYNC(128, 2, 4, 8, sfx, T) \
  ASYNC(128, 2, 6, 8, sfx, T) ASYNC(128, 4, 4, 4, sfx, T) ASYNC(256, 2, 4, 4, sfx, T)
ASYNCS(f16, __half) ASYNCS(bf16, __nv_bfloat16) ASYNCS(f32, float)
'''
FORMS = ["rbasync_t128_u4_s2", "rbasync_t128_u4_s3", "rbasync_t128_u2_s4", "rbasync_t128_u2_s6", "rbasync_t128_u4_s4",
         "rbasync_t256_u2_s4"]
CASES = ((torch.float16, 1024, "f16"), (torch.bfloat16, 1024, "bf16"), (torch.float32, 4096, "f32"))


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"# {torch.cuda.get_device_name()}; copy (1 GiB, read + write): {bw:.0f} GB/s")
    probe = ProbeModule("logsumexp.cu", PROBE, "probe_async_copies.cu")
    d = probe.driver
    for dtype_forms in ((f"{form}_{sfx}" for form in FORMS) for _, _, sfx in CASES):
        for name in dtype_forms:  # all of shared memory for 8 blocks of 24 KB per SM
            d.cuFuncSetAttribute(probe.fn(name), d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    nbytes = 64 << 20
    print(f"90% of copy at 64 MiB: {nbytes / (0.9 * bw * 1e9) * 1e6:.2f} us\n")
    print("| shape | kernel | registers | blocks per SM | us | % of copy | matches float64 torch |")
    print("|---|---|---:|---:|---:|---:|---|")
    for dtype, rows, sfx in CASES:
        cols, bufs, ref = row_buffers(dtype, rows, nbytes)
        out = torch.empty(rows, device="cuda", dtype=dtype)

        def report(kernel, regs, blocks, us, got):
            ok = "yes" if torch.allclose(got.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
            pct = nbytes / (us * 1e-6) / 1e9 / bw * 100
            print(f"| {rows}x{cols} {sfx} | {kernel} | {regs} | {blocks} | {us:.2f} | {pct:.1f} | {ok} |")

        for form in FORMS:
            name = f"{form}_{sfx}"
            tb = int(form.split("_t")[1].split("_")[0])
            regs, blocks = probe.registers(name, tb)
            out.fill_(float("nan"))
            probe.launch(name, rows, tb, bufs[0], out, cols)
            torch.cuda.synchronize()
            got = out.clone()
            us = timed(lambda i: probe.launch(name, rows, tb, bufs[i % 8], out, cols))
            report(name, regs, blocks, us, got)
        name = f"logsumexp_rowblock128_{sfx}_vec"
        us, got = library_candidate(name, bufs, (1,))
        report(f"library: {name}", "-", "-", us, got)


if __name__ == "__main__":
    main()
