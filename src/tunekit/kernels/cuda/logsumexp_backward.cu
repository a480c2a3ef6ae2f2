// The gradient of logsumexp, dx = dy * exp(x - lse), in one pass over x (torch's autograd runs
// it as subtract, exp, multiply: full-size temporaries). Same (outer, R, inner) layouts and work
// split as logsumexp.cu, so each thread loads dy and lse once and then streams x:
// - rows (inner = 1): TPR threads per row; items (group of rows, chunk of columns) walked
//   grid-stride, so a few very long rows still spread over every SM;
// - columns (inner > 1): 32 threads along inner (VEC columns each) x 8 along R, grid (inner blocks,
//   outer, chunks of R);
// - flat (any inner): the gradient as the elementwise op it is, every slice x[o] (R x inner
//   contiguous elements) cut into tiles of BLOCK x VEC x PACKS, one block per tile and no loop,
//   the layout of the activations' kernels; dy and lse come from L1/L2.
// Each thread loads UNROLL packs of VEC elements before using any. Math in fp32 (special values as
// torch's composite: exp(inf - inf) = NaN; grad_exp says which exp); 64-bit offsets; any length
// (the host checks VEC alignment).
#include "column_tile.cuh"
#include "convert.cuh"
#include "fastmath.cuh"

namespace {

using tunekit::from_float;
using tunekit::Pack;
using tunekit::store_pack;
using tunekit::to_float;

constexpr int BLOCK = 256;
constexpr float LOG2E = 1.44269504088896340736f;

// exp(v - l) of one gradient element. float32 storage keeps the accurate expf (its results are
// checked at float32 tolerance); 16-bit storage takes the one-instruction exp2 (fastmath.cuh), as
// the forward does: an error of ~2 fp32 ulp that no 16-bit result shows, and about a third of the
// instructions per element (expf is ~10), which a kernel moving 16 bytes per 8 elements both ways
// has to issue.
template <typename T>
__device__ __forceinline__ float grad_exp(float v, float l) {
  if constexpr (sizeof(T) == 4) {
    return expf(v - l);
  } else {
    return tunekit::fast_exp2((v - l) * LOG2E);
  }
}

template <typename T, int VEC, int UNROLL, long long STEP>
__device__ __forceinline__ void scale_range(const T* x, T* dx, long long c, long long end, float g, float l) {
  for (; c + (UNROLL - 1) * STEP < end; c += UNROLL * STEP) {
    Pack<T, VEC> pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + c + u * STEP);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) pk[u].v[k] = from_float<T>(g * grad_exp<T>(to_float(pk[u].v[k]), l));
      store_pack(dx + c + u * STEP, pk[u]);
    }
  }
  for (; c < end; c += STEP) {
    Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(x + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) pk.v[k] = from_float<T>(g * grad_exp<T>(to_float(pk.v[k]), l));
    store_pack(dx + c, pk);
  }
}

template <typename T, int VEC, int TPR, int UNROLL>
__device__ __forceinline__ void rows_backward(const T* dy, const T* x, const T* lse, T* dx, long long n_rows,
                                              long long cols, long long chunk, long long splits) {
  constexpr int GROUPS = BLOCK / TPR;
  const int lane = threadIdx.x % TPR;
  const int group = threadIdx.x / TPR;
  const long long row_groups = (n_rows + GROUPS - 1) / GROUPS;
  for (long long item = blockIdx.x; item < row_groups * splits; item += gridDim.x) {
    const long long split = item / row_groups;
    const long long row = (item - split * row_groups) * GROUPS + group;
    if (row >= n_rows) continue;
    const long long begin = split * chunk;
    const long long end = begin + chunk < cols ? begin + chunk : cols;
    scale_range<T, VEC, UNROLL, static_cast<long long>(TPR) * VEC>(x + row * cols, dx + row * cols,
                                                                   begin + lane * VEC, end, to_float(dy[row]),
                                                                   to_float(lse[row]));
  }
}

template <typename T, int VEC, int UNROLL>
__device__ __forceinline__ void columns_backward(const T* dy, const T* x, const T* lse, T* dx, long long outer,
                                                 long long R, long long inner, long long chunk) {
  constexpr int IX = 32;
  constexpr int RY = BLOCK / IX;
  const tunekit::ColumnTile<IX, VEC, BLOCK> t(outer, inner);
  const int ty = t.ty;
  const long long o = t.o, i0 = t.i0;
  if (i0 >= inner) return;
  float g[VEC], l[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    g[k] = to_float(dy[o * inner + i0 + k]);
    l[k] = to_float(lse[o * inner + i0 + k]);
  }
  const long long r_begin = t.begin(chunk), r_end = t.end(R, chunk);
  const long long offset = o * R * inner + i0;
  long long r = r_begin + ty;
  for (; r + (UNROLL - 1) * RY < r_end; r += UNROLL * RY) {
    Pack<T, VEC> pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + offset + (r + u * RY) * inner);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) pk[u].v[k] = from_float<T>(g[k] * grad_exp<T>(to_float(pk[u].v[k]), l[k]));
      store_pack(dx + offset + (r + u * RY) * inner, pk[u]);
    }
  }
  for (; r < r_end; r += RY) {
    Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(x + offset + r * inner);
#pragma unroll
    for (int k = 0; k < VEC; ++k) pk.v[k] = from_float<T>(g[k] * grad_exp<T>(to_float(pk.v[k]), l[k]));
    store_pack(dx + offset + r * inner, pk);
  }
}

// Flat: block b covers elements [t * TILE, (t + 1) * TILE) of slice o = b / tiles; each thread
// loads its PACKS packs (BLOCK x VEC elements apart) before using any. One 64-bit division per
// block; per pack, rows (inner = 1) need nothing more, columns one 32-bit modulo (a mask for a
// power-of-two inner size; the host declines inner >= 2^31) and a VEC-wide load each of dy and lse
// (inner % VEC == 0, so a pack never crosses a slice or a row of dy).
template <typename T, int VEC, int PACKS>
__device__ __forceinline__ void flat_backward(const T* dy, const T* x, const T* lse, T* dx, long long slice,
                                              long long inner, long long tiles) {
  constexpr int TILE = BLOCK * VEC * PACKS;
  const long long o = blockIdx.x / tiles;
  const long long start = (blockIdx.x - o * tiles) * TILE;
  const long long offset = o * slice + start;
  const int left = slice - start < TILE ? static_cast<int>(slice - start) : TILE;
  Pack<T, VEC> pk[PACKS];
#pragma unroll
  for (int u = 0; u < PACKS; ++u) {
    const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
    if (s < left) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + offset + s);
  }
  if (inner == 1) {
    const float g = to_float(dy[o]), l = to_float(lse[o]);
#pragma unroll
    for (int u = 0; u < PACKS; ++u) {
      const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
      if (s >= left) break;
      Pack<T, VEC> r;
#pragma unroll
      for (int k = 0; k < VEC; ++k) r.v[k] = from_float<T>(g * grad_exp<T>(to_float(pk[u].v[k]), l));
      store_pack(dx + offset + s, r);
    }
  } else {
    const unsigned first = static_cast<unsigned>(start % inner);
    const bool pow2 = (inner & (inner - 1)) == 0;  // most hidden sizes: a mask, not a 32-bit division
#pragma unroll
    for (int u = 0; u < PACKS; ++u) {
      const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
      if (s >= left) break;
      const unsigned at = first + static_cast<unsigned>(s);
      const long long j = o * inner + (pow2 ? at & (static_cast<unsigned>(inner) - 1) : at % static_cast<unsigned>(inner));
      const Pack<T, VEC> g = *reinterpret_cast<const Pack<T, VEC>*>(dy + j);
      const Pack<T, VEC> l = *reinterpret_cast<const Pack<T, VEC>*>(lse + j);
      Pack<T, VEC> r;
#pragma unroll
      for (int k = 0; k < VEC; ++k) r.v[k] = from_float<T>(to_float(g.v[k]) * grad_exp<T>(to_float(pk[u].v[k]), to_float(l.v[k])));
      store_pack(dx + offset + s, r);
    }
  }
}

}  // namespace

#define TUNEKIT_LSE_BACKWARD_ROWS(name, T, VEC, TPR, UNROLL)                                           \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* dy, const T* x, const T* lse, T* dx, long long n_rows, long long cols,             \
           long long chunk, long long splits) {                                                        \
    rows_backward<T, VEC, TPR, UNROLL>(dy, x, lse, dx, n_rows, cols, chunk, splits);                   \
  }

#define TUNEKIT_LSE_BACKWARD_COLUMNS(name, T, VEC, UNROLL)                                             \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* dy, const T* x, const T* lse, T* dx, long long outer, long long R, long long inner, \
           long long chunk, long long splits) {                                                        \
    columns_backward<T, VEC, UNROLL>(dy, x, lse, dx, outer, R, inner, chunk);                          \
  }

#define TUNEKIT_LSE_BACKWARD_FLAT(name, T, VEC, PACKS)                                                 \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* dy, const T* x, const T* lse, T* dx, long long slice, long long inner,             \
           long long tiles) {                                                                          \
    flat_backward<T, VEC, PACKS>(dy, x, lse, dx, slice, inner, tiles);                                 \
  }

#define TUNEKIT_LSE_BACKWARD_FORMS(suffix, T, VEC)                                                     \
  TUNEKIT_LSE_BACKWARD_ROWS(logsumexp_backward_rows8_##suffix, T, 1, 8, 4)                             \
  TUNEKIT_LSE_BACKWARD_ROWS(logsumexp_backward_warp_##suffix, T, 1, 32, 8)                             \
  TUNEKIT_LSE_BACKWARD_ROWS(logsumexp_backward_warp_##suffix##_vec, T, VEC, 32, 4)                     \
  TUNEKIT_LSE_BACKWARD_ROWS(logsumexp_backward_block_##suffix##_vec, T, VEC, 256, 4)                   \
  TUNEKIT_LSE_BACKWARD_COLUMNS(logsumexp_backward_columns_##suffix, T, 1, 8)                           \
  TUNEKIT_LSE_BACKWARD_COLUMNS(logsumexp_backward_columns_##suffix##_vec, T, VEC, 4)                   \
  TUNEKIT_LSE_BACKWARD_FLAT(logsumexp_backward_flat_##suffix, T, 1, 4)                                 \
  TUNEKIT_LSE_BACKWARD_FLAT(logsumexp_backward_flat_##suffix##_vec, T, VEC, 1)                         \
  TUNEKIT_LSE_BACKWARD_FLAT(logsumexp_backward_flat_##suffix##_vec_x2, T, VEC, 2)

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_LSE_BACKWARD_FORMS(f32, float, 4)
TUNEKIT_LSE_BACKWARD_FORMS(f16, __half, 8)
TUNEKIT_LSE_BACKWARD_FORMS(bf16, __nv_bfloat16, 8)
#endif
