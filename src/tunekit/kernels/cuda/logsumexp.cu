// logsumexp of a contiguous array seen as (outer, R, inner), reduced over R, in one read of the
// input: lse = m + log(sum(exp(x - m))) with m the max, kept online (torch.logsumexp runs amax,
// subtract, exp, sum, log, add).
//
// Layouts (each its own candidate; the host picks the launch):
// - rows (inner = 1): TPR threads own a row: 8 (rows of 64 and fewer), 32 (a warp), 256 (a block);
//   row blocks: one block of 128 or 256 threads per row, the grid every row.
//   With splits > 1 a row is cut into chunks, each block writes a partial (m, s) and
//   logsumexp_combine merges them: few very long rows (4 x 16M) then still fill every SM.
// - columns (inner > 1, e.g. dim 0 of a matrix): a block is IX threads along inner (VEC adjacent
//   columns each, so they read one contiguous run) by 256 / IX along R; a column's partials merge
//   in shared memory. IX = 32, or 8 for the narrow form: 8 x 16 bytes is still one whole 128-byte
//   line per row, a block spans 4x fewer columns (inner = 128 in 16-bit fills the block, where
//   IX = 32 idles half of it) and 4x more rows, so fewer R splits are needed to fill the GPU. The
//   input is read in place, never transposed. splits > 1 cuts R, and logsumexp_combine merges the
//   chunks' partials (a warp per result; _wide: a block per result, for many splits). Column strips
//   (float32): a block per 32 columns over all of R, no split.
//
// Speed: each thread loads UNROLL packs of VEC elements before using any (bytes in flight), takes
// their max first, then rescales its sum once per tile and adds independent exp2 terms: one MUFU
// per element and no dependent rescale chain per element.
//
// Semantics as torch.logsumexp, with no per-element test: fmaxf ignores NaN, so a NaN reaches the
// sum (exp2(NaN) = NaN) and poisons it; a max of +inf or -inf shifts by 0, so exp2(+inf) makes the
// sum +inf (it stays +inf or NaN: every term and scale is >= 0) and exp2(-inf) = 0.
// Results: NaN if any NaN, else +inf if any +inf, -inf for only -inf (0 + log(0)).
// Math in fp32 for every storage type; 64-bit offsets.
#include "column_tile.cuh"
#include "convert.cuh"
#include "fastmath.cuh"
#include "logsumexp_fold.cuh"

namespace {

using tunekit::fast_exp2;
using tunekit::from_float;
using tunekit::Pack;
using tunekit::to_float;

constexpr int BLOCK = 256;

// Programmatic dependent launch (sm_90 and later): a kernel whose partials a merge pass reads lets
// that pass launch before it ends (the host launches the pass with programmatic stream
// serialization), and the pass waits for this grid's writes before its first read. The early launch
// hides the pass's launch latency behind the last wave (docs/measurements.md). Both instructions
// are no-ops for launches made without that attribute.
__device__ __forceinline__ void allow_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
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

// One thread's share of elements [c, end) of a row, stepping STEP: tiles of UNROLL packs while
// they fit, then single packs. (end - c) is a multiple of VEC (the host checks it).
template <typename T, int VEC, int UNROLL, long long STEP, bool FUSED = sizeof(T) == 4>
__device__ __forceinline__ void fold_range(Partial& p, const T* r, long long c, long long end) {
  for (; c + (UNROLL - 1) * STEP < end; c += UNROLL * STEP) {
    Pack<T, VEC> pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(r + c + u * STEP);
    float v[UNROLL * VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[u * VEC + k] = to_float(pk[u].v[k]);
    fold<FUSED>(p, v);
  }
  for (; c < end; c += STEP) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(r + c);
    float v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = to_float(pk.v[k]);
    fold<FUSED>(p, v);
  }
}

// Rows: work items are (group of BLOCK / TPR rows, chunk of `chunk` columns), walked grid-stride.
template <typename T, int VEC, int TPR, int UNROLL>
__device__ __forceinline__ void rows(const T* x, T* out, float2* partials, long long n_rows, long long cols,
                                     long long chunk, long long splits) {
  constexpr int GROUPS = BLOCK / TPR;
  const int lane = threadIdx.x % TPR;
  const int group = threadIdx.x / TPR;
  __shared__ Partial warp_partials[BLOCK / 32];
  allow_dependents();
  const long long row_groups = (n_rows + GROUPS - 1) / GROUPS;
  // every thread of a block runs the same iterations (barriers inside for TPR > 32)
  for (long long item = blockIdx.x; item < row_groups * splits; item += gridDim.x) {
    const long long split = item / row_groups;
    const long long row = (item - split * row_groups) * GROUPS + group;
    Partial p{-TUNEKIT_INF, 0.0f};
    if (row < n_rows) {
      const long long begin = split * chunk;
      const long long end = begin + chunk < cols ? begin + chunk : cols;
      fold_range<T, VEC, UNROLL, static_cast<long long>(TPR) * VEC>(p, x + row * cols, begin + lane * VEC, end);
    }
    if constexpr (TPR <= 32) {
      p = group_reduce<TPR>(p);
      if (lane == 0 && row < n_rows) emit(p, out, partials, row, n_rows, split, splits);
    } else {
      p = block_reduce(p, warp_partials);
      if (threadIdx.x == 0 && row < n_rows) emit(p, out, partials, row, n_rows, split, splits);
      __syncthreads();  // warp_partials is reused by the next item
    }
  }
}

// Chunks: one block per (row, chunk) item, item = row * splits + split, the grid every item; its
// partial goes to partials[item] (row-major: [row][split]). When chunks tile every row exactly
// (cols == splits * chunk) a chunk starts at item * chunk: no division before the first load (a
// 64-bit division there sat on a chain ahead of every block's loads: docs/measurements.md). Ragged
// rows still divide. Its exponent is one FFMA for every storage type (fewer registers).
template <typename T, int VEC, int UNROLL>
__device__ __forceinline__ void chunks(const T* x, T* out, float2* partials, long long n_rows, long long cols,
                                       long long chunk, long long splits) {
  __shared__ Partial warp_partials[BLOCK / 32];
  allow_dependents();
  const long long item = blockIdx.x;
  const T* r;
  long long length;
  if (cols == chunk * splits) {
    r = x + item * chunk;
    length = chunk;
  } else {
    const long long row = item / splits;
    const long long begin = (item - row * splits) * chunk;
    r = x + row * cols + begin;
    length = begin + chunk < cols ? chunk : cols - begin;
  }
  Partial p{-TUNEKIT_INF, 0.0f};
  fold_range<T, VEC, UNROLL, static_cast<long long>(BLOCK) * VEC, true>(p, r, threadIdx.x * VEC, length);
  p = block_reduce(p, warp_partials);
  if (threadIdx.x == 0) {
    if (splits == 1) {
      out[item] = from_float<T>(finish(p));
    } else {
      partials[item] = make_float2(p.m, p.s);
    }
  }
}

// Row blocks: one block of TB threads per row, the grid every row: no loop over items and no
// division ahead of the loads (a row starts at blockIdx.x * cols). At TB = 128 and at most 64
// registers, 8 blocks fit an SM, so 1024 rows are resident at once (one wave where the 256-thread
// kernels run nearly two: docs/measurements.md). FFMA exponents for every storage type.
template <typename T, int VEC, int TB, int UNROLL>
__device__ __forceinline__ void row_block(const T* x, T* out, long long cols) {
  __shared__ Partial warp_partials[TB / 32];
  Partial p{-TUNEKIT_INF, 0.0f};
  fold_range<T, VEC, UNROLL, static_cast<long long>(TB) * VEC, true>(p, x + blockIdx.x * cols, threadIdx.x * VEC,
                                                                      cols);
  p = block_reduce(p, warp_partials);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(finish(p));
}

// Columns: block = IX threads along inner x RY along R; grid = (inner blocks, outer, splits) flattened into
// blockIdx.x. Thread (tx, ty) owns columns i0 .. i0 + VEC - 1 and rows r = ty, ty + RY, ... of its split.
template <typename T, int VEC, int UNROLL, int IX>
__device__ __forceinline__ void columns(const T* x, T* out, float2* partials, long long outer, long long R,
                                        long long inner, long long chunk, long long splits) {
  constexpr int RY = BLOCK / IX;
  __shared__ Partial shared[RY][IX * VEC];
  allow_dependents();
  const tunekit::ColumnTile<IX, VEC, BLOCK> t(outer, inner);
  const int tx = t.tx, ty = t.ty;
  const long long ib = t.ib, o = t.o, split = t.split, i0 = t.i0;
  const long long r_begin = t.begin(chunk), r_end = t.end(R, chunk);
  Partial p[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) p[k] = Partial{-TUNEKIT_INF, 0.0f};
  if (i0 < inner) {
    const T* base = x + o * R * inner + i0;
    long long r = r_begin + ty;
    for (; r + (UNROLL - 1) * RY < r_end; r += UNROLL * RY) {
      Pack<T, VEC> pk[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(base + (r + u * RY) * inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = to_float(pk[u].v[k]);
        fold<sizeof(T) == 4>(p[k], v);
      }
    }
    for (; r < r_end; r += RY) {
      const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(base + r * inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float v[1] = {to_float(pk.v[k])};
        fold<sizeof(T) == 4>(p[k], v);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) shared[ty][tx * VEC + k] = p[k];
  __syncthreads();
  // every thread merges the RY partials of one column (not 32 threads all VEC columns)
  for (int c = threadIdx.x; c < IX * VEC; c += BLOCK) {
    const long long i = ib * IX * VEC + c;
    if (i >= inner) break;
    Partial total = shared[0][c];
#pragma unroll
    for (int y = 1; y < RY; ++y) total = merge(total, shared[y][c]);
    emit(total, out, partials, o * inner + i, outer * inner, split, splits);
  }
}

// Column strips: one block of TB threads owns W = IX x VEC adjacent columns of one outer slice over
// all R rows, so nothing is merged outside the block and there is no second pass. IX threads along
// the columns (16 bytes each), TB / IX along R; lanes of a warp that share columns merge by
// shuffles, then a warp per column merges the warps' partials from shared memory. Float32 dim 0 of
// 4096 x 4096 at W = 32 columns (128 bytes a row) and TB = 1024 is 128 blocks, one wave of one block
// per SM, with no merge pass; its 16-bit forms were slower than the split kernels, so only float32
// has one (docs/measurements.md).
template <typename T, int VEC, int IX, int TB, int UNROLL>
__device__ __forceinline__ void column_strip(const T* x, T* out, long long R, long long inner) {
  constexpr int W = IX * VEC, WARPS = TB / 32, RY = TB / IX;
  __shared__ Partial warp_partials[WARPS][W];
  const int tx = threadIdx.x % IX, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long strips = (inner + W - 1) / W;
  const long long o = blockIdx.x / strips;
  const long long c0 = (blockIdx.x - o * strips) * W;  // the strip's first column
  const long long i = c0 + tx * VEC;                    // this thread's first column (VEC of them)
  Partial p[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) p[k] = Partial{-TUNEKIT_INF, 0.0f};
  if (i < inner) {
    const long long step = RY * inner;
    const T* ptr = x + o * R * inner + (threadIdx.x / IX) * inner + i;
    long long r = threadIdx.x / IX;
    for (; r + (UNROLL - 1) * RY < R; r += UNROLL * RY, ptr += UNROLL * step) {
      Pack<T, VEC> pk[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(ptr + u * step);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = to_float(pk[u].v[k]);
        fold<true>(p[k], v);
      }
    }
    for (; r < R; r += RY, ptr += step) {
      const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(ptr);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float v[1] = {to_float(pk.v[k])};
        fold<true>(p[k], v);
      }
    }
  }
  // lanes tx, tx + IX, ... of a warp own the same columns (idle threads hold empty partials)
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
#pragma unroll
    for (int offset = IX; offset < 32; offset *= 2) {
      Partial q;
      q.m = __shfl_xor_sync(0xffffffffu, p[k].m, offset);
      q.s = __shfl_xor_sync(0xffffffffu, p[k].s, offset);
      p[k] = merge(p[k], q);
    }
  }
  if (lane < IX) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) warp_partials[warp][tx * VEC + k] = p[k];
  }
  __syncthreads();
  for (int c = warp; c < W; c += WARPS) {
    Partial q = lane < WARPS ? warp_partials[lane][c] : Partial{-TUNEKIT_INF, 0.0f};
    q = group_reduce<32>(q);
    if (lane == 0 && c0 + c < inner) out[o * inner + c0 + c] = from_float<T>(finish(q));
  }
}

// The second pass of a split reduction: out[j] merges the splits' partials of result j, at
// partials[j * result_stride + k * split_stride] for k < splits (split-major for rows and columns,
// row-major for chunks). Each lane keeps 4 loads in flight (a load-then-merge loop waits on every load),
// and merges go through shuffle trees, not one thread's serial chain of dependent merges (docs/measurements.md).
template <int THREADS>
__device__ __forceinline__ Partial merge_splits(const float2* q, long long splits, long long split_stride, int lane) {
  Partial total{-TUNEKIT_INF, 0.0f};
  for (long long k = lane; k < splits; k += 4 * THREADS) {
    float2 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long s = k + u * THREADS;
      v[u] = s < splits ? q[s * split_stride] : make_float2(-TUNEKIT_INF, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) total = merge(total, Partial{v[u].x, v[u].y});
  }
  return total;
}

// A warp per result (up to 4 x 32 splits in one round of loads).
template <typename T>
__device__ __forceinline__ void combine(const float2* partials, T* out, long long n, long long splits,
                                        long long split_stride, long long result_stride) {
  wait_for_prerequisites();
  const int lane = threadIdx.x % 32;
  const long long warps = static_cast<long long>(gridDim.x) * (BLOCK / 32);
  for (long long j = static_cast<long long>(blockIdx.x) * (BLOCK / 32) + threadIdx.x / 32; j < n; j += warps) {
    Partial total = merge_splits<32>(partials + j * result_stride, splits, split_stride, lane);
    total = group_reduce<32>(total);
    if (lane == 0) out[j] = from_float<T>(finish(total));
  }
}

// A block per result, for many splits (4 x 16M rows in 32 KB chunks: 1024 per row).
template <typename T>
__device__ __forceinline__ void combine_wide(const float2* partials, T* out, long long n, long long splits,
                                             long long split_stride, long long result_stride) {
  __shared__ Partial warp_partials[BLOCK / 32];
  wait_for_prerequisites();
  for (long long j = blockIdx.x; j < n; j += gridDim.x) {
    Partial total = merge_splits<BLOCK>(partials + j * result_stride, splits, split_stride, threadIdx.x);
    total = block_reduce(total, warp_partials);
    if (threadIdx.x == 0) out[j] = from_float<T>(finish(total));
    __syncthreads();  // warp_partials is reused by the next result
  }
}

}  // namespace

#define TUNEKIT_LSE_ROWS(name, T, VEC, TPR, UNROLL)                                                    \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* x, T* out, float2* partials, long long n_rows, long long cols, long long chunk,    \
           long long splits) {                                                                         \
    rows<T, VEC, TPR, UNROLL>(x, out, partials, n_rows, cols, chunk, splits);                          \
  }

#define TUNEKIT_LSE_COLUMNS(name, T, VEC, UNROLL, IX)                                                  \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* x, T* out, float2* partials, long long outer, long long R, long long inner,        \
           long long chunk, long long splits) {                                                        \
    columns<T, VEC, UNROLL, IX>(x, out, partials, outer, R, inner, chunk, splits);                     \
  }

// VEC: elements of one 16-byte load (the _vec forms; 1 for the others).
#define TUNEKIT_LSE_FORMS(suffix, T, VEC)                                                              \
  TUNEKIT_LSE_ROWS(logsumexp_rows8_##suffix, T, 1, 8, 4)                                               \
  TUNEKIT_LSE_ROWS(logsumexp_rows8_##suffix##_vec, T, VEC, 8, 2)                                       \
  TUNEKIT_LSE_ROWS(logsumexp_warp_##suffix, T, 1, 32, 8)                                               \
  TUNEKIT_LSE_ROWS(logsumexp_warp_##suffix##_vec, T, VEC, 32, 4)                                       \
  TUNEKIT_LSE_ROWS(logsumexp_block_##suffix, T, 1, 256, 8)                                             \
  TUNEKIT_LSE_ROWS(logsumexp_block_##suffix##_vec, T, VEC, 256, 4)                                     \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      logsumexp_chunks_##suffix(const T* x, T* out, float2* partials, long long n_rows, long long cols,  \
                                long long chunk, long long splits) {                                   \
    chunks<T, VEC, 4>(x, out, partials, n_rows, cols, chunk, splits);                                  \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(128, 8)                                                 \
      logsumexp_rowblock128_##suffix##_vec(const T* x, T* out, long long cols) {                       \
    row_block<T, VEC, 128, 4>(x, out, cols);                                                           \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256)                                                    \
      logsumexp_rowblock256_##suffix##_vec(const T* x, T* out, long long cols) {                       \
    row_block<T, VEC, 256, 4>(x, out, cols);                                                           \
  }                                                                                                    \
  TUNEKIT_LSE_COLUMNS(logsumexp_columns_##suffix, T, 1, 8, 32)                                         \
  TUNEKIT_LSE_COLUMNS(logsumexp_columns_##suffix##_vec, T, VEC, 4, 32)                                 \
  TUNEKIT_LSE_COLUMNS(logsumexp_columns_narrow_##suffix##_vec, T, VEC, 4, 8)                           \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      logsumexp_combine_##suffix(const float2* partials, T* out, long long n, long long splits,        \
                                 long long split_stride, long long result_stride) {                    \
    combine<T>(partials, out, n, splits, split_stride, result_stride);                                 \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      logsumexp_combine_wide_##suffix(const float2* partials, T* out, long long n, long long splits,   \
                                      long long split_stride, long long result_stride) {               \
    combine_wide<T>(partials, out, n, splits, split_stride, result_stride);                            \
  }

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_LSE_FORMS(f32, float, 4)
extern "C" __global__ void __launch_bounds__(1024, 1)
    logsumexp_columns_strip_f32_vec(const float* x, float* out, long long R, long long inner) {
  column_strip<float, 4, 8, 1024, 4>(x, out, R, inner);
}
TUNEKIT_LSE_FORMS(f16, __half, 8)
TUNEKIT_LSE_FORMS(bf16, __nv_bfloat16, 8)
#endif
