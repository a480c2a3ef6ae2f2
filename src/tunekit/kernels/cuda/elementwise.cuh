// Shared by the elementwise kernels (silu.cu, gelu.cu): storage conversions and the two ways of
// walking an array, for ops of one input (forward: y = f(x)) or two (backward: dx = f(dy, x)).
//
// Rules every kernel built on this keeps (naive elementwise kernels tend to break each of them):
// - math in fp32 for every storage type (fp16 hexp / tanh paths lose accuracy or overflow);
// - any element count: a pack that would cross n falls back to scalar loads and stores, so nothing
//   is read or written past n and every element is written;
// - 64-bit indexing (tensors over 2^31 elements work);
// - the output may be one of the inputs (in place): each element is read, then written, by one
//   thread, so no __restrict__;
// - launched by tunekit on the caller's stream (never the legacy default stream).
//
// Forms:
// - map_consecutive<VEC, LOADS>: thread t handles LOADS consecutive packs of VEC elements (the
//   classic forms: f16x8 is four half2 packs, f16x8_pack one 16-byte pack). One tile per block.
// - map_strided<VEC, UNROLL>: a block's tile is UNROLL * blockDim packs; thread t handles packs
//   t, t + blockDim, ... so every load instruction of a warp is one contiguous 512-byte run, and
//   all UNROLL loads are issued before the first use (more bytes in flight per thread). Tiles are
//   walked grid-stride, so the host may launch one block per tile or a persistent grid.
// VEC * sizeof(T) is the width of one access; the host checks pointer alignment for it.
// (inlined into each .cu by tunekit.backends.nvrtc.source, each header once; #pragma once does
// the same for plain nvcc)
#pragma once
#include "convert.cuh"
#include "fastmath.cuh"

namespace tunekit {

// The inputs of one call: NIN pointers of the same length n, and the output.
template <typename T, int NIN>
struct Arrays {
  const T* in[NIN];
  T* out;
  long long n;
};

template <int NIN, typename Op>
__device__ __forceinline__ float apply(const Op& op, const float (&v)[NIN]) {
  if constexpr (NIN == 1) {
    return op(v[0]);
  } else {
    return op(v[0], v[1]);
  }
}

// One element, scalar loads and stores (tails).
template <typename T, int NIN, typename Op>
__device__ __forceinline__ void map_one(const Arrays<T, NIN>& a, long long i, const Op& op) {
  float v[NIN];
#pragma unroll
  for (int k = 0; k < NIN; ++k) v[k] = to_float(a.in[k][i]);
  a.out[i] = from_float<T>(apply<NIN>(op, v));
}

// A run of UNROLL packs starting at the element offsets start[u]; all loads before any math.
template <typename T, int NIN, int VEC, int UNROLL, typename Op>
__device__ __forceinline__ void map_packs(const Arrays<T, NIN>& a, const long long (&start)[UNROLL], const Op& op) {
  Pack<T, VEC> in[NIN][UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int k = 0; k < NIN; ++k) in[k][u] = *reinterpret_cast<const Pack<T, VEC>*>(a.in[k] + start[u]);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    Pack<T, VEC> out;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      float v[NIN];
#pragma unroll
      for (int k = 0; k < NIN; ++k) v[k] = to_float(in[k][u].v[e]);
      out.v[e] = from_float<T>(apply<NIN>(op, v));
    }
    *reinterpret_cast<Pack<T, VEC>*>(a.out + start[u]) = out;
  }
}

template <typename T, int NIN, int VEC, int LOADS, typename Op>
__device__ __forceinline__ void map_consecutive(const Arrays<T, NIN>& a, const Op& op) {
  constexpr int PER_THREAD = VEC * LOADS;
  const long long first = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * PER_THREAD;
  if (first >= a.n) return;
  if (first + PER_THREAD <= a.n) {
    long long start[LOADS];
#pragma unroll
    for (int l = 0; l < LOADS; ++l) start[l] = first + l * VEC;
    map_packs<T, NIN, VEC, LOADS>(a, start, op);
  } else {  // the tail: fewer than PER_THREAD elements left
    for (long long i = first; i < a.n; ++i) map_one(a, i, op);
  }
}

template <typename T, int NIN, int VEC, int UNROLL, typename Op>
__device__ __forceinline__ void map_strided(const Arrays<T, NIN>& a, const Op& op) {
  const long long tile = static_cast<long long>(blockDim.x) * VEC * UNROLL;
  const long long tiles = (a.n + tile - 1) / tile;
  for (long long b = blockIdx.x; b < tiles; b += gridDim.x) {
    long long start[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) start[u] = b * tile + (static_cast<long long>(u) * blockDim.x + threadIdx.x) * VEC;
    if (b * tile + tile <= a.n) {
      map_packs<T, NIN, VEC, UNROLL>(a, start, op);
    } else {  // the last tile: whole packs vectorised, a pack crossing n element by element
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (start[u] + VEC <= a.n) {
          long long one[1] = {start[u]};
          map_packs<T, NIN, VEC, 1>(a, one, op);
        } else {
          for (long long i = start[u]; i < a.n; ++i) map_one(a, i, op);
        }
      }
    }
  }
}

}  // namespace tunekit

// Kernel definitions: `TUNEKIT_UNARY(name, T, Op, form, VEC, N)` defines
// `extern "C" name(const T* x, T* y, long long n)`; `TUNEKIT_BINARY` defines
// `name(const T* a, const T* b, T* y, long long n)` (backward: a = dy, b = x). `form` is
// map_consecutive (N = loads per thread) or map_strided (N = packs per thread, strided).
#define TUNEKIT_UNARY(name, T, Op, form, VEC, N)                                                 \
  extern "C" __global__ void __launch_bounds__(256) name(const T* x, T* y, long long n) {        \
    tunekit::form<T, 1, VEC, N>(tunekit::Arrays<T, 1>{{x}, y, n}, Op{});                          \
  }

#define TUNEKIT_BINARY(name, T, Op, form, VEC, N)                                                        \
  extern "C" __global__ void __launch_bounds__(256) name(const T* a, const T* b, T* y, long long n) {   \
    tunekit::form<T, 2, VEC, N>(tunekit::Arrays<T, 2>{{a, b}, y, n}, Op{});                              \
  }

// The forms every elementwise op instantiates, per storage type; the host side lists the same
// names (ops/_shared/cuda_elementwise.py reads FORMS from it). `prefix` is e.g. silu,
// silu_backward, gelu_tanh. `Op32` computes float32 storage, `OpF16` float16 and `OpBF16` bfloat16
// storage (see fast_sigmoid below for why they may differ from Op32, and fast_normal_tail for why
// the two 16-bit types may differ).
#define TUNEKIT_FORMS(DEF, prefix, Op32, OpF16, OpBF16)                                        \
  DEF(prefix##_f32, float, Op32, map_consecutive, 1, 1)                                        \
  DEF(prefix##_f32x4, float, Op32, map_consecutive, 4, 1)                                      \
  DEF(prefix##_f32x4_x2, float, Op32, map_strided, 4, 2)                                       \
  DEF(prefix##_f32x4_x4, float, Op32, map_strided, 4, 4)                                       \
  DEF(prefix##_f16, __half, OpF16, map_consecutive, 1, 1)                                      \
  DEF(prefix##_f16x2, __half, OpF16, map_consecutive, 2, 1)                                    \
  DEF(prefix##_f16x8, __half, OpF16, map_consecutive, 2, 4)                                    \
  DEF(prefix##_f16x8_pack, __half, OpF16, map_consecutive, 8, 1)                               \
  DEF(prefix##_f16x8_pack_x2, __half, OpF16, map_strided, 8, 2)                                \
  DEF(prefix##_f16x8_pack_x4, __half, OpF16, map_strided, 8, 4)                                \
  DEF(prefix##_bf16, __nv_bfloat16, OpBF16, map_consecutive, 1, 1)                             \
  DEF(prefix##_bf16x2, __nv_bfloat16, OpBF16, map_consecutive, 2, 1)                           \
  DEF(prefix##_bf16x8, __nv_bfloat16, OpBF16, map_consecutive, 2, 4)                           \
  DEF(prefix##_bf16x8_pack, __nv_bfloat16, OpBF16, map_consecutive, 8, 1)                      \
  DEF(prefix##_bf16x8_pack_x2, __nv_bfloat16, OpBF16, map_strided, 8, 2)                       \
  DEF(prefix##_bf16x8_pack_x4, __nv_bfloat16, OpBF16, map_strided, 8, 4)

namespace tunekit {

// Fast fp32 building blocks for 16-bit storage. At 2 bytes per element the accurate libm forms
// (expf, erff, tanhf, IEEE division: tens of instructions each) make the kernels compute-bound:
// the 16-bit GELU(erf) kernels built on them fall well short of the copy bandwidth that the fp32
// ones, with twice the bytes per element, reach (docs/measurements.md). These
// approximations err by ~1e-6 relative, hundreds of times below fp16's (4.9e-4) and bf16's (3.9e-3)
// rounding, so the stored results are those of the accurate forms up to a last-bit tie.
__device__ __forceinline__ float fast_exp(float v) { return fast_exp2(v * 1.44269504088896340736f); }

// sigmoid(+inf) = 1, sigmoid(-inf) = rcp(inf) = 0, NaN stays NaN.
__device__ __forceinline__ float fast_sigmoid(float v) { return fast_rcp(1.0f + fast_exp(-v)); }

// Phi(-|x|) and exp(-x^2 / 2), for the GELU(erf) gradient. erfc from Abramowitz & Stegun 7.1.26
// (absolute error <= 1.5e-7): erfc(z) = t P(t) exp(-z^2), t = 1 / (1 + p z), z = |x| / sqrt 2.
// Its *relative* error grows in the far tail (0.16% at x = -5, 2% at x = -10), which the gradient
// does not feel: there Phi(x) + x pdf(x) is dominated by x pdf(x) (Phi / |x pdf| ~ 1 / x^2).
// Constants folded: 1/sqrt 2 into p, the 1/2 into P (exact), -1/2 log2(e) into the exponent.
__device__ __forceinline__ float fast_normal_cdf(float x, float& exp_neg_half_x2) {
  const float t = fast_rcp(fmaf(0.23164188826636045f /* 0.3275911 / sqrt 2 */, fabsf(x), 1.0f));
  const float half_poly =
      t * (0.127414796f + t * (-0.142248368f + t * (0.7107068705f + t * (-0.7265760135f + t * 0.5307027145f))));
  exp_neg_half_x2 = fast_exp2(x * x * -0.72134752044448170368f /* -log2(e) / 2 */);
  const float c = half_poly * exp_neg_half_x2;  // Phi(-|x|)
  return x >= 0.0f ? 1.0f - c : c;
}

// Phi(-|x|) with a small *relative* error over the whole range where the storage type holds a
// nonzero x Phi(x), for the GELU(erf) forward (where x Phi(x) for x < 0 is Phi(-|x|) scaled, so
// its relative error is the result's):
//   Phi(-z) = t 2^(-z^2 log2(e) / 2 + P(t)),  t = 1 / (1 + p z),  z = |x|,
// P of degree 5, minimax over the z the storage type needs (scripts/fit_normal_tail.py derives the
// constants; tests/kernels/test_normal_tail.py checks them). Relative error with fp32 arithmetic:
// 3.4e-6 for float16 (z <= 6: beyond ~5.8 the result rounds to 0 in float16), 1.8e-5 for bfloat16
// (z <= 13.3; beyond ~12.9 Phi is an fp32 subnormal, flushed to 0 as torch's fp32 math gives 0
// from ~5.9 on): under 1% of an ulp of either type.
// Same instruction count as the form above, whose relative error in the tail is several bfloat16
// ulps. x = +-inf: t = 0 and the exponent -inf, so 0; NaN stays NaN.
struct NormalTailF16 {
  static constexpr float p = 0.31945255398750305f;
  static constexpr float c0 = -2.9820685386657715f, c1 = 1.5547008514404297f, c2 = 0.06914915144443512f,
                         c3 = 1.334025502204895f, c4 = -1.3448870182037354f, c5 = 0.3690817952156067f;
};
struct NormalTailBF16 {
  static constexpr float p = 0.34803932905197144f;
  static constexpr float c0 = -2.8505547046661377f, c1 = 1.4765948057174683f, c2 = 0.33694177865982056f,
                         c3 = 0.7675883769989014f, c4 = -1.0652153491973877f, c5 = 0.3346536457538605f;
};

template <typename Fit>
__device__ __forceinline__ float fast_normal_tail(float x) {
  const float t = fast_rcp(fmaf(Fit::p, fabsf(x), 1.0f));
  const float poly = Fit::c0 + t * (Fit::c1 + t * (Fit::c2 + t * (Fit::c3 + t * (Fit::c4 + t * Fit::c5))));
  return t * fast_exp2(fmaf(x * x, -0.72134752044448170368f /* -log2(e) / 2 */, poly));
}

}  // namespace tunekit
