// Decode GEMM: out[M, N] = a[M, K] @ w[N, K]^T for M <= 16 rows (a token, or a few, against a
// linear layer's weight), one pass over the weight (M = 1 reads faster through gemv.cu's kernels). The time is the weight's bytes: the kernel is a
// stream of 16-byte loads with many in flight, and the products are tensor-core MMAs
// (mma.sync m16n8k16, fp32 accumulators), which take up to 16 rows for the price of one.
//
// Layout of the work: a block owns 8 x G rows of w (G MMA column groups of 8) and all of K; its W
// warps split K in passes of U steps of 32 (a pass's loads issued while the previous pass multiplies),
// and their partial sums meet in shared memory. No split over blocks, so no workspace, no second kernel
// and no atomics: one launch, deterministic.
//
// The MMA fragments, with K permuted: a dot product does not care in which order K is summed, as
// long as a and w agree. Lane (row = lane / 4, quad = lane % 4) loads 8 consecutive k at
// k0 + 8 * quad, 16 bytes, from w's row n0 + 8 g + row and from a's rows `row` and `row + 8`; the
// elements {0,1}, {2,3} of those 16 bytes are the fragment's k = 2 quad + {0,1} and 8 + 2 quad + {0,1}
// of a first MMA, {4,5}, {6,7} of a second. So each lane reads whole 16-byte vectors (a quad reads
// 64 contiguous bytes of a row) where the fragment's own order would want 4-byte pieces.
//
// Requirements (the host checks them, ops/gemm/cuda_decode.py): float16 or bfloat16; a and w
// 16-byte aligned with K, lda and ldw multiples of 8; 1 <= M <= 16, N >= 1, K >= 8; out row-major
// with row stride ldo. 64-bit offsets.
#include "convert.cuh"

namespace {

using tunekit::from_float;

// volatile, as the loads are: the compiler keeps the order written (a pass's loads, then the MMAs of
// the pass before).
template <typename T> struct Mma;

template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// The weight streams once: no L1 allocation.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// a's rows are read by every block: kept in the caches. (__ldg's form; written out, as nvcc with NVRTC's headers
// leaves __ldg's uint4 overload unresolved)
__device__ __forceinline__ uint4 load_kept(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// One pass of a warp's loads: U steps of 32 k from `base` (per lane, 16 bytes of each of its G rows of
// w and of its two rows of a per step). Addresses stay in range (past K: the last 8 k, zeroed after the
// load), so the loads need no branch.
template <typename T, int G, int U>
struct Pass {
  uint4 w[U][G], lo[U], hi[U];

  __device__ __forceinline__ void load(const T* a_lo, const T* a_hi, const T* const (&w_row)[G], long long base,
                                       long long K, int quad) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + 8 * quad;
      const bool in = k < K;
      const long long at = in ? k : K - 8;
#pragma unroll
      for (int g = 0; g < G; ++g) w[u][g] = load_stream(w_row[g] + at);
      lo[u] = load_kept(a_lo + at);
      hi[u] = load_kept(a_hi + at);
      if (!in) {
        lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int g = 0; g < G; ++g) w[u][g] = make_uint4(0, 0, 0, 0);
      }
    }
  }

  __device__ __forceinline__ void multiply(float (&acc)[G][4]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        Mma<T>::run(acc[g], lo[u].x, hi[u].x, lo[u].y, hi[u].y, w[u][g].x, w[u][g].y);
        Mma<T>::run(acc[g], lo[u].z, hi[u].z, lo[u].w, hi[u].w, w[u][g].z, w[u][g].w);
      }
    }
  }
};

template <typename T, int G, int W, int U>
__device__ __forceinline__ void decode(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                       long long M, long long N, long long K, long long lda, long long ldw,
                                       long long ldo) {
  __shared__ float partial[W][G][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = lane >> 2, quad = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * (8 * G);

  // Rows past M or N read a row that exists: their products land only in results never stored.
  const T* a_lo = a + min(static_cast<long long>(row), M - 1) * lda;
  const T* a_hi = a + min(static_cast<long long>(row + 8), M - 1) * lda;
  const T* w_row[G];
#pragma unroll
  for (int g = 0; g < G; ++g) w_row[g] = w + min(n0 + 8 * g + row, N - 1) * ldw;

  float acc[G][4];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;

  // Two passes in registers: the next pass's loads are issued (in a block of their own) before this
  // pass's MMAs, whose operands have arrived. With one pass, ptxas interleaved each load with the MMA
  // that uses it: one or two loads in flight per warp. `base` is the same for the whole warp, so
  // every lane reaches every MMA (mma.sync needs all 32).
  const long long step = 32LL * U * W;
  long long base = static_cast<long long>(warp) * (32 * U);
  if (base < K) {
    Pass<T, G, U> now, next;
    now.load(a_lo, a_hi, w_row, base, K, quad);
    for (;;) {
      const bool more = base + step < K;
      if (more) next.load(a_lo, a_hi, w_row, base + step, K, quad);
      now.multiply(acc);
      if (!more) break;
      now = next;
      base += step;
    }
  }

#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][g][j][lane] = acc[g][j];
  __syncthreads();
  // accumulator j of lane l in group g: row (l / 4) + 8 (j / 2), column 8 g + 2 (l % 4) + j % 2
  for (int i = threadIdx.x; i < G * 128; i += 32 * W) {
    const int g = i >> 7, j = (i >> 5) & 3, l = i & 31;
    const long long m = (l >> 2) + 8 * (j >> 1);
    const long long n = n0 + 8 * g + 2 * (l & 3) + (j & 1);
    if (m < M && n < N) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < W; ++v) s += partial[v][g][j][l];
      out[m * ldo + n] = from_float<T>(s);
    }
  }
}

}  // namespace

#define TUNEKIT_GEMM_DECODE(name, T, G, W, U)                                                            \
  extern "C" __global__ void __launch_bounds__(32 * W)                                                  \
      name(const T* a, const T* w, T* out, long long M, long long N, long long K, long long lda,        \
           long long ldw, long long ldo) {                                                              \
    decode<T, G, W, U>(a, w, out, M, N, K, lda, ldw, ldo);                                              \
  }

#define TUNEKIT_GEMM_DECODE_FORMS(suffix, T)                                                             \
  TUNEKIT_GEMM_DECODE(gemm_decode_##suffix##_g1_w4_u4, T, 1, 4, 4)                                       \
  TUNEKIT_GEMM_DECODE(gemm_decode_##suffix##_g2_w8_u2, T, 2, 8, 2)

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_GEMM_DECODE_FORMS(f16, __half)
TUNEKIT_GEMM_DECODE_FORMS(bf16, __nv_bfloat16)
#endif
