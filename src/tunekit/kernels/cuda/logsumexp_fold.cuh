// The online (max, sum) fold of logsumexp and its merges, shared by every layout of logsumexp.cu
// (rows, row blocks, chunks, columns, column strips, the merge passes) and by the probes built on it
// (benchmarks/experiments/probe_logsumexp_*.py). Inlined into each source by
// tunekit.backends.nvrtc.source.
#pragma once
#include "convert.cuh"
#include "fastmath.cuh"

namespace {

using tunekit::fast_exp2;

// NVRTC has no <math.h> macros
#define TUNEKIT_INF __int_as_float(0x7f800000)
#define TUNEKIT_NAN __int_as_float(0x7fffffff)
constexpr float LOG2E = 1.44269504088896340736f;

// (m, s): m the largest value seen (-inf if none but -inf), s = sum of exp(x - shift(m)); NaN in s
// if a NaN was seen. A max of +inf shifts by 0 like -inf (no branch anywhere): its own term
// exp(+inf) makes s = +inf (or NaN), which every later rescale and merge keeps.
struct Partial {
  float m;
  float s;
};

__device__ __forceinline__ float shift_of(float m) { return fabsf(m) == TUNEKIT_INF ? 0.0f : m; }

__device__ __forceinline__ float scaled_exp(float x, float shift) { return fast_exp2((x - shift) * LOG2E); }

// Fold N values into p: one rescale for all N. FUSED (fp32 storage): exp(x - shift) as
// exp2(x * log2(e) - shift * log2(e)), one FFMA per element instead of FADD + FMUL (as flash
// attention computes it); the product's rounding moves an exponent by at most an ulp of
// shift * log2(e), ~1e-7 relative in the result; it frees registers and instructions in the
// float32 kernels. Not for 16-bit storage in the grid-stride kernels: there the fewer registers let
// ptxas interleave the tile's loads with the math instead of issuing them all first, which costs
// more than the instructions save. The chunks and row-block kernels use it for every storage type.
// No branch for +inf: a branch in the loop carries a reconvergence barrier on every tile. The
// measurements: docs/measurements.md.
template <bool FUSED, int N>
__device__ __forceinline__ void fold(Partial& p, const float (&v)[N]) {
  float tile_max = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) tile_max = fmaxf(tile_max, v[k]);
  const float m = fmaxf(p.m, tile_max);
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

// Two partials as one (the fold's shift, FFMA exponents): epilogues pay a merge's latency per
// block, so it has no branch either.
__device__ __forceinline__ Partial merge(Partial a, Partial b) {
  const float m = fmaxf(a.m, b.m);
  const float offset = -shift_of(m) * LOG2E;
  return Partial{m, fmaf(a.s, fast_exp2(fmaf(a.m, LOG2E, offset)), b.s * fast_exp2(fmaf(b.m, LOG2E, offset)))};
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

// A block's partial, valid in thread 0 (a block of 32 x WARPS threads): warps merge by shuffles,
// then warp 0 merges the warps' partials in log2(WARPS) more (a serial loop in thread 0 holds the
// block's slot for WARPS dependent merges). Reuses `scratch`: a caller that reduces again must
// sync first.
template <int WARPS>
__device__ __forceinline__ Partial block_reduce(Partial p, Partial (&scratch)[WARPS]) {
  p = group_reduce<32>(p);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x < 32) {
    p = threadIdx.x < WARPS ? scratch[threadIdx.x] : Partial{-TUNEKIT_INF, 0.0f};
    p = group_reduce<WARPS>(p);
  }
  return p;
}

}  // namespace
