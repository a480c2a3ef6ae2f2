// logsumexp over the last dimension of a contiguous (rows, cols) array, one pass per row:
// lse = m + log(sum(exp(x - m))), with m the row's max, computed online (each thread keeps a running
// max and a sum rescaled whenever the max grows), so the row is read once and no temporary is
// written (the seed's design, 000_; torch.logsumexp runs amax, subtract, exp, sum, log, add).
//
// Groups of TPR threads own a row: TPR = 8 (four rows per warp, for rows of 64 and fewer), 32 (a
// warp per row) or 256 (a block per row). Partial (max, sum) pairs merge with warp shuffles, then
// across warps through shared memory. Rows are walked grid-stride.
//
// Semantics as torch.logsumexp: a NaN anywhere in the row gives NaN; otherwise a +inf gives +inf;
// a row of only -inf gives -inf. fmaxf ignores NaN, so NaN is tracked by its own flag, and the
// rescale factor of a -inf partial max is 0, never exp(-inf - -inf) = NaN.
// Math in fp32 for every storage type (expf/logf: the row sum can hold a million terms).
// VEC elements per load (16 bytes for the _vec forms: the host checks alignment and cols % VEC).
#include "convert.cuh"

namespace {

using tunekit::from_float;
using tunekit::Pack;
using tunekit::to_float;

// NVRTC has no <math.h> macros
#define TUNEKIT_INF __int_as_float(0x7f800000)
#define TUNEKIT_NAN __int_as_float(0x7fffffff)

// A running (max, sum of exp(x - max), NaN seen) triple.
struct Partial {
  float m;
  float s;
  bool nan;
};

__device__ __forceinline__ float rescale(float from, float to) {
  return from == -TUNEKIT_INF ? 0.0f : expf(from - to);
}

__device__ __forceinline__ void add(Partial& p, float x) {
  if (x != x) {
    p.nan = true;
    return;
  }
  if (x > p.m) {  // a new max: rescale the sum once (one exp per element, not two)
    p.s = p.s * rescale(p.m, x) + 1.0f;
    p.m = x;
  } else {  // x = -inf adds 0; with p.m = +inf the sum no longer matters (finish returns +inf)
    p.s += rescale(x, p.m);
  }
}

__device__ __forceinline__ Partial merge(Partial a, Partial b) {
  const float m = fmaxf(a.m, b.m);
  return Partial{m, a.s * rescale(a.m, m) + b.s * rescale(b.m, m), a.nan || b.nan};
}

__device__ __forceinline__ float finish(Partial p) {
  if (p.nan) return TUNEKIT_NAN;
  if (p.m == TUNEKIT_INF || p.m == -TUNEKIT_INF) return p.m;
  return p.m + logf(p.s);
}

// Merge across the TPR (<= 32) lanes of a group with shuffles; every lane ends with the result.
template <int TPR>
__device__ __forceinline__ Partial group_reduce(Partial p) {
#pragma unroll
  for (int offset = TPR / 2; offset > 0; offset /= 2) {
    Partial o;
    o.m = __shfl_xor_sync(0xffffffffu, p.m, offset, TPR);
    o.s = __shfl_xor_sync(0xffffffffu, p.s, offset, TPR);
    o.nan = __shfl_xor_sync(0xffffffffu, static_cast<int>(p.nan), offset, TPR) != 0;
    p = merge(p, o);
  }
  return p;
}

template <typename T, int VEC, int TPR>
__device__ __forceinline__ void logsumexp_rows(const T* x, T* out, long long rows, long long cols) {
  constexpr int BLOCK = 256;
  constexpr int GROUPS = BLOCK / TPR;  // rows a block works on at once
  const int lane = threadIdx.x % TPR;
  const int group = threadIdx.x / TPR;
  __shared__ Partial warp_partials[BLOCK / 32];
  // every thread of a block runs the same number of iterations (barriers inside for TPR > 32)
  for (long long base = static_cast<long long>(blockIdx.x) * GROUPS; base < rows;
       base += static_cast<long long>(gridDim.x) * GROUPS) {
    const long long row = base + group;
    Partial p{-TUNEKIT_INF, 0.0f, false};
    if (row < rows) {
      const T* r = x + row * cols;
      if (VEC > 1) {
        for (long long c = static_cast<long long>(lane) * VEC; c < cols; c += static_cast<long long>(TPR) * VEC) {
          const Pack<T, VEC> v = *reinterpret_cast<const Pack<T, VEC>*>(r + c);
#pragma unroll
          for (int k = 0; k < VEC; ++k) add(p, to_float(v.v[k]));
        }
      } else {
        for (long long c = lane; c < cols; c += TPR) add(p, to_float(r[c]));
      }
    }
    if constexpr (TPR <= 32) {
      p = group_reduce<TPR>(p);
      if (lane == 0 && row < rows) out[row] = from_float<T>(finish(p));
    } else {
      p = group_reduce<32>(p);
      if (threadIdx.x % 32 == 0) warp_partials[threadIdx.x / 32] = p;
      __syncthreads();
      if (threadIdx.x == 0) {
        Partial total = warp_partials[0];
        for (int w = 1; w < BLOCK / 32; ++w) total = merge(total, warp_partials[w]);
        if (row < rows) out[row] = from_float<T>(finish(total));
      }
      __syncthreads();  // warp_partials is reused by the next row
    }
  }
}

}  // namespace

#define TUNEKIT_LSE(name, T, VEC, TPR)                                                                 \
  extern "C" __global__ void __launch_bounds__(256) name(const T* x, T* out, long long rows, long long cols) { \
    logsumexp_rows<T, VEC, TPR>(x, out, rows, cols);                                                  \
  }

#define TUNEKIT_LSE_FORMS(suffix, T, VEC)                   \
  TUNEKIT_LSE(logsumexp_rows8_##suffix, T, 1, 8)            \
  TUNEKIT_LSE(logsumexp_warp_##suffix, T, 1, 32)            \
  TUNEKIT_LSE(logsumexp_warp_##suffix##_vec, T, VEC, 32)    \
  TUNEKIT_LSE(logsumexp_block_##suffix, T, 1, 256)          \
  TUNEKIT_LSE(logsumexp_block_##suffix##_vec, T, VEC, 256)

TUNEKIT_LSE_FORMS(f32, float, 4)
TUNEKIT_LSE_FORMS(f16, __half, 8)
TUNEKIT_LSE_FORMS(bf16, __nv_bfloat16, 8)
