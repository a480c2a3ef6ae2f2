// Decode GEMM for one row: out[N] = w[N, K] @ a[K] (a token against a linear layer's weight, M = 1),
// one pass over the weight. A warp per row of w: each load instruction reads 512 contiguous bytes of
// that row (gemm_decode.cu's MMA form reads 64 bytes of each of 8 rows per instruction), U of them in
// flight per lane with the next U issued before the current ones are multiplied, fp32 FMAs, a shuffle
// reduction. Rows of WARPS x blocks cover N.
//
// Requirements (the host checks them, ops/gemm/cuda_decode.py): float16 or bfloat16; a and w 16-byte
// aligned, K and ldw multiples of 8, K >= 8; 64-bit offsets.
#include "convert.cuh"

namespace {

using tunekit::from_float;

// The weight streams once: no L1 allocation.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// a is read by every warp: kept in the caches. (__ldg's form; written out, as nvcc with NVRTC's headers
// leaves __ldg's uint4 overload unresolved)
__device__ __forceinline__ uint4 load_kept(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x, __nv_bfloat16) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
  }
  return s;
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x, __half) {
  const __half2* wp = reinterpret_cast<const __half2*>(&w);
  const __half2* xp = reinterpret_cast<const __half2*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __half22float2(wp[i]), b = __half22float2(xp[i]);
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
  }
  return s;
}

template <typename T, int WARPS, int U>
__device__ __forceinline__ void gemv(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                     long long N, long long K, long long ldw) {
  const int lane = threadIdx.x & 31;
  const long long n = static_cast<long long>(blockIdx.x) * WARPS + (threadIdx.x >> 5);
  if (n >= N) return;  // the whole warp: no barrier follows
  const T* row = w + n * ldw;
  constexpr long long STEP = 32 * 8;  // elements a warp's load instruction covers
  float acc = 0.f;
  long long k = 8LL * lane;
  if (k + (U - 1) * STEP < K) {  // two passes in registers, as the MMA form: the next pass's loads first
    uint4 wv[U], xv[U], wn[U], xn[U];
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = load_stream(row + k + u * STEP), xv[u] = load_kept(a + k + u * STEP);
    for (;;) {
      const bool more = k + (2 * U - 1) * STEP < K;
      if (more) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          wn[u] = load_stream(row + k + (U + u) * STEP), xn[u] = load_kept(a + k + (U + u) * STEP);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc += dot8(wv[u], xv[u], T());
      k += U * STEP;
      if (!more) break;
#pragma unroll
      for (int u = 0; u < U; ++u) wv[u] = wn[u], xv[u] = xn[u];
    }
  }
  for (; k < K; k += STEP) acc += dot8(load_stream(row + k), load_kept(a + k), T());
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0) out[n] = from_float<T>(acc);
}

}  // namespace

#define TUNEKIT_GEMV(name, T, WARPS, U)                                                                  \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                              \
      name(const T* a, const T* w, T* out, long long N, long long K, long long ldw) {                   \
    gemv<T, WARPS, U>(a, w, out, N, K, ldw);                                                            \
  }

#define TUNEKIT_GEMV_FORMS(suffix, T)                                                                    \
  TUNEKIT_GEMV(gemv_##suffix##_w2_u8, T, 2, 8)                                                           \
  TUNEKIT_GEMV(gemv_##suffix##_w4_u8, T, 4, 8)                                                           \
  TUNEKIT_GEMV(gemv_##suffix##_w8_u4, T, 8, 4)

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_GEMV_FORMS(f16, __half)
TUNEKIT_GEMV_FORMS(bf16, __nv_bfloat16)
#endif
