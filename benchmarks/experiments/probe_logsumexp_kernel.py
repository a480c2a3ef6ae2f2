"""Timing probe, not a candidate: a bare logsumexp pass over 128 MiB of float16 (64 x 1M) against the
library's candidates on the same buffers, to tell the kernel's code from its work split and timer.

The bare kernel: one block per 32 KB chunk, 256 threads, 4 x 16-byte loads in flight, a partial
(m, s) per block, none of the library's special-value handling (its results are not checked).
MODE 0: max, exp2, sum; 1: exp2 replaced by FMUL (no MUFU); 2: sum only; 3: every 4th exp2 in
software. Timed with CUDA events over 40 calls rotating 8 buffers (1 GiB: L2-cold), plain stream
launches and CUDA-graph replay. Needs cupy (the device image has it):
``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_kernel.py``. Results and what they led to:
``benchmarks/results/logsumexp_rows_experiments-NVIDIA_H200.md``."""
import statistics
import cupy as cp, torch

SRC = r'''
#include <cuda_fp16.h>
template <typename T> __device__ float tf(T v);
template <> __device__ float tf<float>(float v) { return v; }
template <> __device__ float tf<__half>(__half v) { return __half2float(v); }
__device__ __forceinline__ float ex2(float v) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
__device__ __forceinline__ float soft_ex2(float x) {
  const float t = x + 12582912.0f; const float n = t - 12582912.0f; const float f = x - n;
  float p = 1.3333558e-3f; p = fmaf(p, f, 9.6181291e-3f); p = fmaf(p, f, 5.5504109e-2f);
  p = fmaf(p, f, 2.4022651e-1f); p = fmaf(p, f, 6.9314718e-1f); p = fmaf(p, f, 1.0f);
  const float r = __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
  return x < -126.0f ? 0.0f : r;
}
template <typename T, int MODE>
__device__ void body(const T* x, float2* part, long long chunk) {
  constexpr int VEC = 16 / sizeof(T);
  const T* base = x + blockIdx.x * chunk;
  float m = __int_as_float(0xff800000), s = 0.f;
  for (long long c = threadIdx.x * VEC; c < chunk; c += 4 * 256 * VEC) {
    uint4 pk[4];
    #pragma unroll
    for (int u = 0; u < 4; ++u) pk[u] = *reinterpret_cast<const uint4*>(base + c + u * 256 * VEC);
    float v[4 * VEC];
    #pragma unroll
    for (int u = 0; u < 4; ++u) { const T* e = reinterpret_cast<const T*>(&pk[u]);
      #pragma unroll
      for (int k = 0; k < VEC; ++k) v[u * VEC + k] = tf<T>(e[k]); }
    if (MODE == 2) {
      #pragma unroll
      for (int k = 0; k < 4 * VEC; ++k) s += v[k];
      continue;
    }
    float tm = v[0];
    #pragma unroll
    for (int k = 1; k < 4 * VEC; ++k) tm = fmaxf(tm, v[k]);
    const float nm = fmaxf(m, tm);
    const float off = -nm * 1.4426950408889634f;
    s = s * ex2(fmaf(m, 1.4426950408889634f, off));
    #pragma unroll
    for (int k = 0; k < 4 * VEC; ++k) {
      const float a = fmaf(v[k], 1.4426950408889634f, off);
      if (MODE == 1) s += a * 0.5f;
      else if (MODE == 3 && (k % 4) == 3) s += soft_ex2(a);
      else s += ex2(a);
    }
    m = nm;
  }
  __shared__ float2 w[8];
  #pragma unroll
  for (int o = 16; o; o /= 2) { const float om = __shfl_xor_sync(~0u, m, o), os = __shfl_xor_sync(~0u, s, o);
    const float nm = fmaxf(m, om); s = s * ex2((m - nm) * 1.44f) + os * ex2((om - nm) * 1.44f); m = nm; }
  if (threadIdx.x % 32 == 0) w[threadIdx.x / 32] = make_float2(m, s);
  __syncthreads();
  if (threadIdx.x == 0) { float2 t = w[0]; for (int i = 1; i < 8; ++i) { t.x = fmaxf(t.x, w[i].x); t.y += w[i].y; } part[blockIdx.x] = t; }
}
#define K(T, M, name) extern "C" __global__ void __launch_bounds__(256) name(const T* x, float2* p, long long c) { body<T, M>(x, p, c); }
K(__half, 0, full_f16) K(__half, 1, nomufu_f16) K(__half, 2, sumonly_f16) K(__half, 3, soft4_f16)
K(float, 0, full_f32) K(float, 1, nomufu_f32) K(float, 2, sumonly_f32) K(float, 3, soft4_f32)
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17", "--gpu-architecture=sm_90"), name_expressions=None)
stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
nbytes = 128 << 20
bufs = [torch.randn(nbytes // 2, device="cuda").half() * 3 for _ in range(8)]
part = torch.empty(1 << 16, 2, device="cuda")
copy_src, copy_dst = torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for _ in range(3): copy_dst.copy_(copy_src)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record(); [copy_dst.copy_(copy_src) for _ in range(20)]; e.record(); torch.cuda.synchronize()
print(f"copy 256 MiB: {2 * (256 << 20) * 20 / (s.elapsed_time(e) * 1e-3) / 1e9:.0f} GB/s")
def timed(fn, graph=False, n=40):
    g = None
    if graph:
        fn(0); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                fn(i)
    times = []
    for rep in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if g is not None:
            g.replay()
        else:
            for i in range(n):
                fn(i)
        end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / n)
    return statistics.median(times[1:])

from tunekit.ops.logsumexp import logsumexp_op, LogsumexpParams
views = [b.view(64, -1) for b in bufs]
k = mod.get_function("full_f16")
def probe(i):
    b = bufs[i % 8]
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        k((4096,), (256,), (b.data_ptr(), part.data_ptr(), cp.int64(16384)))
comb = logsumexp_op.candidate("logsumexp_block_split_f16_vec").combine
outs = torch.empty(64, dtype=torch.float16, device="cuda")
def probe_and_combine(i):
    probe(i)
    comb.launch(0, 8, 256, part, outs, 64, 64)
print(f"probe kernel, stream: {timed(probe):.2f}  graph: {timed(probe, True):.2f}")
print(f"probe + combine, stream: {timed(probe_and_combine):.2f}  graph: {timed(probe_and_combine, True):.2f}")
for name in ("logsumexp_block_split_f16_vec", "logsumexp_chunks32k_f16", "logsumexp_chunks64k_f16"):
    c = logsumexp_op.candidate(name)
    ps = [LogsumexpParams(v, (1,), False, torch.empty(64, dtype=torch.float16, device="cuda")) for v in views]
    fn = lambda i: c.run(ps[i % 8])
    print(f"{name}, stream: {timed(fn):.2f}  graph: {timed(fn, True):.2f}")

