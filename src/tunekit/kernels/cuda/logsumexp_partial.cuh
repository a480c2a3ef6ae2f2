// The partial (max, sum) of a logsumexp and its algebra, shared by logsumexp.cu and
// logsumexp_bulk.cu (inlined into each by tunekit.backends.nvrtc.source; the include guards make a
// second inclusion harmless). Semantics: see logsumexp.cu's header.
#ifndef TUNEKIT_LOGSUMEXP_PARTIAL_CUH
#define TUNEKIT_LOGSUMEXP_PARTIAL_CUH
#include "convert.cuh"
#include "fastmath.cuh"

namespace tunekit {
namespace lse {

// NVRTC has no <math.h> macros
#define TUNEKIT_INF __int_as_float(0x7f800000)
#define TUNEKIT_NAN __int_as_float(0x7fffffff)
constexpr float LOG2E = 1.44269504088896340736f;

// (m, s): m the largest value seen (-inf if none but -inf), s = sum of exp(x - shift(m)); NaN in s
// if a NaN was seen. While m = +inf, s is 0 or NaN.
struct Partial {
  float m;
  float s;
};

__device__ __forceinline__ float shift_of(float m) { return m == -TUNEKIT_INF ? 0.0f : m; }

__device__ __forceinline__ float scaled_exp(float x, float shift) { return fast_exp2((x - shift) * LOG2E); }

// Fold N values into p: one rescale for all N. FUSED (fp32 storage): exp(x - shift) as
// exp2(x * log2(e) - shift * log2(e)), one FFMA per element instead of FADD + FMUL (as flash
// attention computes it); the product's rounding moves an exponent by at most an ulp of
// shift * log2(e), ~1e-7 relative in the result. Measured on an H200: f32 split rows 94.4 -> 97.1%
// and 92.2 -> 95.3% of copy. Not for 16-bit storage: there the same change (48 registers instead of
// 53) let ptxas interleave the tile's loads with the math, and split rows fell 84.6 -> 81.6%
// (taking the tile max on packed 16-bit pairs as well, 40 registers: 72%).
// A tile whose max is +inf: keep only whether a NaN was seen (x * 0 keeps NaN, zeroes the rest).
template <int N>
__device__ __forceinline__ Partial infinite_partial(const Partial& p, float m, const float (&v)[N]) {
  float s = p.s * 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) s = v[k] != v[k] ? v[k] : s;
  return Partial{m, s};
}

template <bool FUSED, int N>
__device__ __forceinline__ void fold(Partial& p, const float (&v)[N]) {
  float tile_max = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) tile_max = fmaxf(tile_max, v[k]);
  const float m = fmaxf(p.m, tile_max);
  if (m == TUNEKIT_INF) {  // rare
    p = infinite_partial(p, m, v);
    return;
  }
  const float shift = shift_of(m);
  float s;
  if constexpr (FUSED) {
    const float offset = -shift * LOG2E;
    s = p.s * fast_exp2(fmaf(p.m, LOG2E, offset));
#pragma unroll
    for (int k = 0; k < N; ++k) s += fast_exp2(fmaf(v[k], LOG2E, offset));
  } else {
    s = p.s * scaled_exp(p.m, shift);
#pragma unroll
    for (int k = 0; k < N; ++k) s += scaled_exp(v[k], shift);
  }
  p = Partial{m, s};
}

// t[0] = the max (the sum) of t[0 .. 2W): log2 levels, unrolled by the template (a loop over the
// levels left ptxas a runtime index: the array went to local memory, 7x slower)
template <int W, int N>
__device__ __forceinline__ void tree_max(float (&t)[N]) {
  if constexpr (W > 0) {
#pragma unroll
    for (int k = 0; k < W; ++k) t[k] = fmaxf(t[k], t[k + W]);
    tree_max<W / 2>(t);
  }
}
template <int W, int N>
__device__ __forceinline__ void tree_sum(float (&t)[N]) {
  if constexpr (W > 0) {
#pragma unroll
    for (int k = 0; k < W; ++k) t[k] += t[k + W];
    tree_sum<W / 2>(t);
  }
}

// fold with the tile's max and sum taken as trees: dependency chains of log2(N) steps instead of
// N (the sequential sum is N dependent FADDs per tile); the pairwise sum rounds no worse.
template <bool FUSED, int N>
__device__ __forceinline__ void fold_pairwise(Partial& p, const float (&v)[N]) {
  static_assert((N & (N - 1)) == 0, "N a power of two");
  float t[N];
#pragma unroll
  for (int k = 0; k < N; ++k) t[k] = v[k];
  tree_max<N / 2>(t);
  const float m = fmaxf(p.m, t[0]);
  if (m == TUNEKIT_INF) {  // rare
    p = infinite_partial(p, m, v);
    return;
  }
  const float shift = shift_of(m);
  float scale;
  if constexpr (FUSED) {
    const float offset = -shift * LOG2E;
    scale = fast_exp2(fmaf(p.m, LOG2E, offset));
#pragma unroll
    for (int k = 0; k < N; ++k) t[k] = fast_exp2(fmaf(v[k], LOG2E, offset));
  } else {
    scale = scaled_exp(p.m, shift);
#pragma unroll
    for (int k = 0; k < N; ++k) t[k] = scaled_exp(v[k], shift);
  }
  tree_sum<N / 2>(t);
  p = Partial{m, fmaf(p.s, scale, t[0])};
}

// fold in the form a kernel instance names
template <bool FUSED, bool PAIRWISE, int N>
__device__ __forceinline__ void fold_as(Partial& p, const float (&v)[N]) {
  if constexpr (PAIRWISE) {
    fold_pairwise<FUSED>(p, v);
  } else {
    fold<FUSED>(p, v);
  }
}

__device__ __forceinline__ Partial merge(Partial a, Partial b) {
  const float m = fmaxf(a.m, b.m);
  if (m == TUNEKIT_INF) return Partial{m, a.s * 0.0f + b.s * 0.0f};
  const float shift = shift_of(m);
  return Partial{m, a.s * scaled_exp(a.m, shift) + b.s * scaled_exp(b.m, shift)};
}

__device__ __forceinline__ float finish(Partial p) {
  if (p.m == TUNEKIT_INF) return p.s == p.s ? TUNEKIT_INF : TUNEKIT_NAN;
  return shift_of(p.m) + logf(p.s);  // accurate log: s may hold millions of terms
}

// Merge across aligned groups of TPR (<= 32) lanes with shuffles; every lane ends with the result.
template <int TPR>
__device__ __forceinline__ Partial group_reduce(Partial p) {
#pragma unroll
  for (int offset = TPR / 2; offset > 0; offset /= 2) {
    Partial o;
    o.m = __shfl_xor_sync(0xffffffffu, p.m, offset, TPR);
    o.s = __shfl_xor_sync(0xffffffffu, p.s, offset, TPR);
    p = merge(p, o);
  }
  return p;
}

// A result: the finished value when the reduction is not split, else the partial for combine.
template <typename T>
__device__ __forceinline__ void emit(Partial p, T* out, float2* partials, long long index, long long n_out,
                                     long long split, long long splits) {
  if (splits == 1) {
    out[index] = from_float<T>(finish(p));
  } else {
    partials[split * n_out + index] = make_float2(p.m, p.s);
  }
}

}  // namespace lse
}  // namespace tunekit
#endif  // TUNEKIT_LOGSUMEXP_PARTIAL_CUH
