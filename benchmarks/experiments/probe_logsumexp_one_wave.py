"""Timing probe, not a candidate: can any logsumexp read 64 MiB of rows within 0.7 us of a pure read?

Issue 4's 90% of the copy bandwidth at 64 MiB (16-bit 1024x32768, float32 4096x4096) allows 17.47 us
on an H200, where the best pure read of 64 MiB takes 16.78 us (`read_ceiling-NVIDIA_H200.md`). A
merge pass alone costs 1.3-2.2 us, so only a kernel that finishes a row where it reads it can make
it; the library's block-per-row kernels do (19.5 us at 1024x32768), but at 45-53 registers 4-5
blocks of 256 threads fit an SM, so 1024 rows of 64 KB run in 1.55-1.94 waves of long blocks.

The probe times, on the same buffers: a pure read of the whole input (persistent grid, 4 x 16 B in
flight per thread, as read_ceiling.py), the same read with one block per row, and block-per-row
logsumexp kernels built from the library's own fold (logsumexp.cu's fold_range, FFMA exponent) with
TB threads per row, UNROLL packs in flight and __launch_bounds__(TB, MINB): fewer threads per row so
that every row's block is resident at once (one wave; 128 x 8 = 1024 threads per SM leave 64
registers a thread). Results are checked against float64 torch. The library's candidates are timed
in the same harness. CUDA-graph replay of 40 calls rotating 8 buffers (512 MiB: L2-cold), median of
6. Needs cuda.bindings (the device image has it):
``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_one_wave.py``. Results:
``benchmarks/results/logsumexp_rows_experiments-NVIDIA_H200.md``."""
import torch

from tunekit.bench.measure import copy_bandwidth
from probe_timing import ProbeModule, library_candidate, row_buffers, timed

PROBE = r'''
namespace {
// The block's partial in thread 0, for any TB (a multiple of 32, at most 1024).
template <int TB>
__device__ __forceinline__ Partial reduce_block(Partial p) {
  __shared__ Partial warps[TB / 32];
  p = group_reduce<32>(p);
  if (TB == 32) return p;
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x < 32) {
    p = threadIdx.x < TB / 32 ? warps[threadIdx.x] : Partial{-TUNEKIT_INF, 0.0f};
    p = group_reduce<32>(p);
  }
  return p;
}
template <typename T, int TB, int UNROLL, bool FUSED = true>
__device__ __forceinline__ void probe_row_block(const T* x, T* out, long long cols) {
  constexpr int VEC = 16 / sizeof(T);
  Partial p{-TUNEKIT_INF, 0.0f};
  fold_range<T, VEC, UNROLL, static_cast<long long>(TB) * VEC, FUSED>(p, x + blockIdx.x * cols, threadIdx.x * VEC, cols);
  p = reduce_block<TB>(p);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(finish(p));
}
// Software-pipelined: the next tile's loads are issued before the current tile's math (the row
// must be a whole number of tiles, as in the probe's shapes).
template <typename T, int TB, int UNROLL>
__device__ __forceinline__ void row_block_pipelined(const T* x, T* out, long long cols) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr long long STEP = static_cast<long long>(TB) * VEC;
  const T* r = x + blockIdx.x * cols;
  Partial p{-TUNEKIT_INF, 0.0f};
  Pack<T, VEC> cur[UNROLL], nxt[UNROLL];
  long long c = threadIdx.x * VEC;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) cur[u] = *reinterpret_cast<const Pack<T, VEC>*>(r + c + u * STEP);
  for (; c < cols; c += UNROLL * STEP) {
    if (c + UNROLL * STEP < cols) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) nxt[u] = *reinterpret_cast<const Pack<T, VEC>*>(r + c + UNROLL * STEP + u * STEP);
    }
    float v[UNROLL * VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[u * VEC + k] = to_float(cur[u].v[k]);
    fold<true>(p, v);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
  }
  p = reduce_block<TB>(p);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(finish(p));
}
// Pure reads: XOR of every word, so no load can be dropped.
template <int TB, int UNROLL>
__device__ __forceinline__ void read_row(const uint4* x, unsigned* sink, long long packs_per_row) {
  const uint4* r = x + blockIdx.x * packs_per_row;
  unsigned acc = 0;
  for (long long c = threadIdx.x; c < packs_per_row; c += UNROLL * TB) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = r[c + u * TB];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x % 1024, acc);
}
}  // namespace
extern "C" __global__ void __launch_bounds__(256) read_persistent_x4(const uint4* x, unsigned* sink, long long n) {
  const long long tile = 256 * 4;
  unsigned acc = 0;
  for (long long b = blockIdx.x; b * tile < n; b += gridDim.x) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) { const long long i = b * tile + threadIdx.x + u * 256; v[u] = i < n ? x[i] : make_uint4(0, 0, 0, 0); }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x % 1024, acc);
}
#define READ_ROW(TB, U, MINB) extern "C" __global__ void __launch_bounds__(TB, MINB) \
  read_row_t##TB##_u##U(const uint4* x, unsigned* sink, long long packs) { read_row<TB, U>(x, sink, packs); }
READ_ROW(128, 4, 8) READ_ROW(256, 4, 4)
#define ROW(TB, U, MINB, sfx, T) extern "C" __global__ void __launch_bounds__(TB, MINB) \
  rb_t##TB##_u##U##_m##MINB##_##sfx(const T* x, T* out, long long cols) { probe_row_block<T, TB, U>(x, out, cols); }
#define ROW_TWO_STEP(TB, U, MINB, sfx, T) extern "C" __global__ void __launch_bounds__(TB, MINB) \
  rb2_t##TB##_u##U##_m##MINB##_##sfx(const T* x, T* out, long long cols) { probe_row_block<T, TB, U, false>(x, out, cols); }
#define ROWS(sfx, T) ROW_TWO_STEP(128, 4, 8, sfx, T) ROW(128, 6, 8, sfx, T) ROW(128, 5, 8, sfx, T) ROW(64, 8, 16, sfx, T) ROW(128, 4, 8, sfx, T) ROW(128, 8, 8, sfx, T) ROW(256, 4, 1, sfx, T) \
  ROW(256, 4, 8, sfx, T) ROW(512, 2, 2, sfx, T) ROW(512, 4, 2, sfx, T)
#define PIPE(TB, U, MINB, sfx, T) extern "C" __global__ void __launch_bounds__(TB, MINB) \
  rbpipe_t##TB##_u##U##_m##MINB##_##sfx(const T* x, T* out, long long cols) { row_block_pipelined<T, TB, U>(x, out, cols); }
#define PIPES(sfx, T) PIPE(128, 2, 8, sfx, T) PIPE(128, 4, 8, sfx, T) PIPE(256, 2, 4, sfx, T) PIPE(256, 4, 1, sfx, T)
ROWS(f16, __half) ROWS(f32, float) PIPES(f16, __half) PIPES(f32, float)
'''
ROW_FORMS = ["rb2_t128_u4_m8", "rb_t128_u5_m8", "rb_t128_u6_m8", "rb_t64_u8_m16", "rb_t128_u4_m8", "rb_t128_u8_m8", "rb_t256_u4_m1", "rb_t256_u4_m8", "rb_t512_u2_m2",
             "rb_t512_u4_m2",
             "rbpipe_t128_u2_m8", "rbpipe_t128_u4_m8", "rbpipe_t256_u2_m4", "rbpipe_t256_u4_m1"]


class Probe(ProbeModule):
    """The probe's kernels; a kernel's block size is in its name (``_t<threads>_``)."""

    def __init__(self):
        super().__init__("logsumexp.cu", PROBE, "probe_one_wave.cu")

    @staticmethod
    def block_of(name):
        return 256 if name == "read_persistent_x4" else int(name.split("_t", 1)[1].split("_")[0])

    def registers(self, name):
        return super().registers(name, self.block_of(name))

    def launch(self, name, grid, *args):
        super().launch(name, grid, self.block_of(name), *args)


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth(torch.device("cuda"))  # eager copies: a captured copy runs on a copy engine, slower
    print(f"# {torch.cuda.get_device_name()}; copy (1 GiB, read + write): {bw:.0f} GB/s")
    probe = Probe()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1024, dtype=torch.int32, device="cuda")
    nbytes = 64 << 20
    line = 90.0 * bw * 1e9 / 100
    print(f"90% of copy at 64 MiB: {nbytes / line * 1e6:.2f} us\n")
    print("| shape | kernel | registers | blocks per SM | waves | us | % of copy | matches float64 torch |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for dtype, rows, sfx in ((torch.float16, 1024, "f16"), (torch.float32, 4096, "f32")):
        cols, bufs, ref = row_buffers(dtype, rows, nbytes)
        shape = f"{rows}x{cols} {sfx}"

        def row(kernel, regs, blocks, grid, us, ok):
            waves = f"{grid / (blocks * sms):.2f}" if blocks else "-"
            print(f"| {shape} | {kernel} | {regs} | {blocks} | {waves} | {us:.2f} | {nbytes / (us * 1e-6) / 1e9 / bw * 100:.1f} | {ok} |")

        regs, blocks = probe.registers("read_persistent_x4")
        packs = nbytes // 16
        us = timed(lambda i: probe.launch("read_persistent_x4", blocks * sms, bufs[i % 8], sink, packs))
        row("pure read, persistent grid, 4 x 16 B per thread", regs, blocks, blocks * sms, us, "-")
        for tb in (128, 256):
            name = f"read_row_t{tb}_u4"
            regs, blocks = probe.registers(name)
            us = timed(lambda i: probe.launch(name, rows, bufs[i % 8], sink, packs // rows))
            row(f"pure read, block per row ({name})", regs, blocks, rows, us, "-")
        out = torch.empty(rows, device="cuda", dtype=dtype)
        for form in ROW_FORMS:
            name = f"{form}_{sfx}"
            regs, blocks = probe.registers(name)
            out.fill_(float("nan"))
            probe.launch(name, rows, bufs[0], out, cols)
            torch.cuda.synchronize()
            ok = "yes" if torch.allclose(out.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
            us = timed(lambda i: probe.launch(name, rows, bufs[i % 8], out, cols))
            row(name, regs, blocks, rows, us, ok)
        names = [f"logsumexp_chunks32k_{sfx}", f"logsumexp_chunks64k_{sfx}", f"logsumexp_block_{sfx}_vec",
                 "logsumexp_triton_rows_b4096_w8"]
        for name in names:
            timing = library_candidate(name, bufs, (1,))
            if timing is not None:
                us, got = timing
                ok = "yes" if torch.allclose(got.double(), ref, rtol=2e-3, atol=2e-3) else "NO"
                row(f"library: {name}", "-", 0, 0, us, ok)


if __name__ == "__main__":
    main()
