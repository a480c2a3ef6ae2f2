// silu(x) = x / (1 + exp(-x)), the seeds' six variants (001_, Swish) plus bf16, written anew.
//
// Rules every variant keeps (the seed's snippets broke each of them):
// - math in fp32 for every storage type (fp16/bf16 hexp loses accuracy);
// - any element count: the last thread's partial pack falls back to scalar loads/stores, so
//   nothing is read or written past n and every element is written;
// - 64-bit indexing (tensors over 2^31 elements work);
// - x and y may be the same buffer (in place): each element is read then written by one thread,
//   so no __restrict__;
// - launched on the caller's stream by tunekit (never the legacy default stream).
//
// One template, `silu_pack<T, VEC, LOADS>`: each thread handles LOADS consecutive packs of VEC
// elements. VEC * sizeof(T) is the width of one load: 16 bytes for f32x4 and the x8_pack forms,
// 4 bytes for the x2 forms (and the seeds' unpacked f16x8: four half2 loads). The host checks the
// pointers' alignment for that width before choosing a variant.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// expf, not __expf: the fast intrinsic's error grows with |x| (about 1e-5 relative near x = -80).
// -inf gives -inf / inf = NaN, as torch does.
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC, int LOADS>
__device__ __forceinline__ void silu_pack(const T* x, T* y, long long n) {
  constexpr int PER_THREAD = VEC * LOADS;
  const long long start = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * PER_THREAD;
  if (start >= n) return;
  if (start + PER_THREAD <= n) {
    Pack<T, VEC> in[LOADS];
#pragma unroll
    for (int l = 0; l < LOADS; ++l)  // every load issued before the first use
      in[l] = *reinterpret_cast<const Pack<T, VEC>*>(x + start + l * VEC);
#pragma unroll
    for (int l = 0; l < LOADS; ++l) {
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(silu_f(to_float(in[l].v[k])));
      *reinterpret_cast<Pack<T, VEC>*>(y + start + l * VEC) = out;
    }
  } else {  // the tail: fewer than PER_THREAD elements left
    for (long long i = start; i < n; ++i) y[i] = from_float<T>(silu_f(to_float(x[i])));
  }
}

#define TUNEKIT_SILU(name, T, VEC, LOADS)                                                  \
  extern "C" __global__ void __launch_bounds__(256) name(const T* x, T* y, long long n) { \
    silu_pack<T, VEC, LOADS>(x, y, n);                                                     \
  }

TUNEKIT_SILU(silu_f32, float, 1, 1)
TUNEKIT_SILU(silu_f32x4, float, 4, 1)
TUNEKIT_SILU(silu_f16, __half, 1, 1)
TUNEKIT_SILU(silu_f16x2, __half, 2, 1)
TUNEKIT_SILU(silu_f16x8, __half, 2, 4)
TUNEKIT_SILU(silu_f16x8_pack, __half, 8, 1)
TUNEKIT_SILU(silu_bf16, __nv_bfloat16, 1, 1)
TUNEKIT_SILU(silu_bf16x2, __nv_bfloat16, 2, 1)
TUNEKIT_SILU(silu_bf16x8, __nv_bfloat16, 2, 4)
TUNEKIT_SILU(silu_bf16x8_pack, __nv_bfloat16, 8, 1)
// more bytes in flight per thread: two 16-byte packs
TUNEKIT_SILU(silu_f32x8_pack2, float, 4, 2)
TUNEKIT_SILU(silu_f16x16_pack2, __half, 8, 2)
TUNEKIT_SILU(silu_bf16x16_pack2, __nv_bfloat16, 8, 2)
