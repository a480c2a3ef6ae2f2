// Storage types <-> fp32, and a pack of VEC elements loaded or stored as one access, shared by
// every kernel source (inlined into each .cu by tunekit.backends.nvrtc.source).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tunekit {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// A pack stored as one vector access. NVVM scalarises a pack built element by element and merges
// the stores again only where it can prove their alignment itself; it cannot when the offset comes
// from a runtime division (logsumexp_backward.cu's flat and columns forms: 4 x STG.E per float4, 8 x
// STG.E.U16 per half x 8 in SASS, a kernel several times slower), and neither a vector type nor
// __builtin_assume_aligned changed that. So 16- and 8-byte packs are stored by PTX. Callers
// guarantee the alignment, as they do for the loads.
template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, VEC>& v) {
  if constexpr (sizeof(Pack<T, VEC>) == 16) {
    const uint4 w = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                 : "memory");
  } else if constexpr (sizeof(Pack<T, VEC>) == 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(&v);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w.x), "r"(w.y) : "memory");
  } else {
    *reinterpret_cast<Pack<T, VEC>*>(p) = v;
  }
}

}  // namespace tunekit
