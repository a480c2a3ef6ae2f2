// EXPERIMENT, not part of the package (nothing compiles it): four MMA layouts for decode GEMMs (M <= 16)
// measured on an H200 on 2026-11-27 as mm candidates at commit bc1dd23 (ops/gemm/cuda_decode_cluster.py there
// launched them; benchmarks/experiments/gemm_decode_probe.py timed them). Every one was slower than
// kernels/cuda/gemm_decode.cu and cuBLAS at M = 16: benchmarks/results/gemm_decode_variants-NVIDIA_H200.txt.
// Kept to read: the cluster split over K with distributed shared memory sums, the rows form (512-byte row
// loads through a warp's shared memory into the MMA fragments), and w as the MMA's A operand.
//
// Decode GEMM, split over K by a thread block cluster: out[M, N] = a[M, K] @ w[N, K]^T for M <= 16 rows.
// Hopper (sm_90): the cluster's S blocks share a group of rows of w and split K between them; their
// partial sums meet through distributed shared memory, in rank order (one launch, no workspace, no
// atomics: deterministic).
//
// Why, against gemm_decode.cu (a block per 8 G rows, its warps splitting all of K, a's fragments
// loaded from global memory beside w's): that form reads every row of a once per block, twice w's bytes
// at M = 16, and holds a's fragments of two passes in registers, which caps the bytes of w in flight per
// warp; on an H200 it ran 1.00x cuBLAS at 16 x 4096 x 4096, where a pure read of the weight's bytes
// leaves 1.3x. Here a block copies its slice of a into shared memory once (cp.async: no registers, the
// first pass of w already in flight), each warp owns its own rows over the block's whole slice of K, and
// registers hold only w: two passes of U steps, 2 x U x G x 512 bytes per warp in flight.
//
// Work: block b of the grid is rank r = b % S of cluster b / S; the cluster owns rows [R c, R c + R) of
// w, R = 8 G W; warp v of each block owns rows 8 G v .. 8 G v + 8 G - 1 of those. K is cut in chunks of
// `kc` (a multiple of 32, at most KC); rank r takes chunks r, r + S, ..., staging each chunk of a in
// shared memory. The MMA fragments are gemm_decode.cu's (K permuted per quad: see there), a's from
// shared memory, swizzled so the quad reads of rows g and g + 1 fall in different banks.
//
// Requirements (the host checks them, ops/gemm/cuda_decode.py): float16 or bfloat16; a and w 16-byte
// aligned with K, lda and ldw multiples of 8; 1 <= M <= 16, N >= 1, K >= 8; kc a multiple of 32,
// at most KC;
// the grid a multiple of S; out row-major with row stride ldo. 64-bit offsets.
#include "convert.cuh"

namespace {

using tunekit::from_float;


template <typename T> struct Mma;

template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], uint4 lo, uint4 hi, unsigned b0, unsigned b1, bool first) {
    const unsigned a0 = first ? lo.x : lo.z, a1 = first ? hi.x : hi.z, a2 = first ? lo.y : lo.w, a3 = first ? hi.y : hi.w;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], uint4 lo, uint4 hi, unsigned b0, unsigned b1, bool first) {
    const unsigned a0 = first ? lo.x : lo.z, a1 = first ? hi.x : hi.z, a2 = first ? lo.y : lo.w, a3 = first ? hi.y : hi.w;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint4 load_kept(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The weight streams once: no L1 allocation. volatile: the compiler keeps the order written.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory without registers; `bytes` 0 writes zeros.
__device__ __forceinline__ void copy_async(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Staged rows (of a, or of w in the rows form) of `vecs` 16-byte vectors: row r's vector c at
// r * vecs + (c ^ 4 (r & 1)): a quad's four vectors of rows g and g + 1 land in the two halves of the banks.
template <int VECS>
__device__ __forceinline__ int staged(int r, int c) { return r * VECS + (c ^ ((r & 1) << 2)); }

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float load_remote(const float* p, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(p)), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// One pass of a warp's w: U steps of 32 k from `base` (16 bytes of each of its G rows per lane and step).
// Past `end` (the chunk's or K's end, a multiple of 8): the last 8 k of the row, zeroed after the load.
template <int G, int U>
struct Pass {
  uint4 w[U][G];

  template <typename T>
  __device__ __forceinline__ void load(const T* const (&w_row)[G], long long base, long long end, int quad) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + 8 * quad;
      const bool in = k < end;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        w[u][g] = load_stream(w_row[g] + (in ? k : end - 8));
        if (!in) w[u][g] = make_uint4(0, 0, 0, 0);
      }
    }
  }

  // a's quad vectors of rows `row` and `row + 8` at step `step0 + u` of the staged chunk
  template <typename T, int VECS>
  __device__ __forceinline__ void multiply(float (&acc)[G][4], const uint4* a_s, int step0, int row, int quad) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = 4 * (step0 + u) + quad;
      const uint4 lo = a_s[staged<VECS>(row, c)], hi = a_s[staged<VECS>(row + 8, c)];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        Mma<T>::run(acc[g], lo, hi, w[u][g].x, w[u][g].y, true);
        Mma<T>::run(acc[g], lo, hi, w[u][g].z, w[u][g].w, false);
      }
    }
  }
};

// Copy a's 16 rows over [k0, k0 + vecs x 8) into shared memory; rows past M and k past `end`: zeros (a
// pass may run past a chunk's end: its w there is zeroed, and so is a, so no inf x 0 reaches a sum).
template <typename T, int W, int VECS>
__device__ __forceinline__ void stage(uint4* a_s, const T* a, long long M, long long end, long long lda, long long k0,
                                      int vecs) {
  for (int i = threadIdx.x; i < 16 * vecs; i += 32 * W) {
    const int r = i / vecs, c = i - r * vecs;
    const long long k = k0 + 8LL * c;
    const bool in = r < M && k < end;
    copy_async(shared_address(a_s + staged<VECS>(r, c)), a + (in ? r * lda + k : 0), in ? 16 : 0);
  }
}

// The rows form's pass: 256 k of each of the warp's 8 G rows, each load instruction 512 contiguous bytes of
// one row (lane l: k = base + 8 l), as gemv.cu reads; then through the warp's own shared memory into the
// quad layout of the MMA fragments (lane (row, quad) of step u: vector 4 u + quad of its row).
template <int G>
struct RowsPass {
  uint4 w[8 * G];

  template <typename T>
  __device__ __forceinline__ void load(const T* weight, long long n0, long long N, long long ldw, long long base,
                                       long long end, int lane) {
    const long long k = base + 8 * lane;
    const bool in = k < end;
#pragma unroll
    for (int i = 0; i < 8 * G; ++i) {
      w[i] = load_stream(weight + min(n0 + i, N - 1) * ldw + (in ? k : end - 8));
      if (!in) w[i] = make_uint4(0, 0, 0, 0);
    }
  }

  template <typename T, int VECS>
  __device__ __forceinline__ void multiply(float (&acc)[G][4], const uint4* a_s, uint4* w_s, int step0, int lane) const {
    const int row = lane >> 2, quad = lane & 3;
    __syncwarp();  // the warp is done reading the previous pass
#pragma unroll
    for (int i = 0; i < 8 * G; ++i) w_s[staged<32>(i, lane)] = w[i];
    __syncwarp();
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int c = 4 * (step0 + u) + quad;
      const uint4 lo = a_s[staged<VECS>(row, c)], hi = a_s[staged<VECS>(row + 8, c)];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const uint4 f = w_s[staged<32>(8 * g + row, 4 * u + quad)];
        Mma<T>::run(acc[g], lo, hi, f.x, f.y, true);
        Mma<T>::run(acc[g], lo, hi, f.z, f.w, false);
      }
    }
  }
};

template <bool C, typename A, typename B> struct Choose { using type = A; };
template <typename A, typename B> struct Choose<false, A, B> { using type = B; };

template <typename T, int G, int W, int U, int S, int KC, bool ROWS>
__device__ __forceinline__ void decode_cluster(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                               long long M, long long N, long long K, long long lda, long long ldw,
                                               long long ldo, int kc) {
  constexpr int VECS = KC / 8;  // 16-byte vectors per staged row of a
  __shared__ __align__(16) uint4 a_s[16 * VECS];
  __shared__ __align__(16) uint4 w_s[ROWS ? W * 8 * G * 32 : 1];
  __shared__ float partial[W][G][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = lane >> 2, quad = lane & 3;
  const int rank = static_cast<int>(blockIdx.x % S);
  const long long n0 = static_cast<long long>(blockIdx.x / S) * (8 * G * W) + 8 * G * warp;

  // Rows past N read a row that exists: their products land only in results never stored.
  const T* w_row[G];
#pragma unroll
  for (int g = 0; g < G; ++g) w_row[g] = w + min(n0 + 8 * g + row, N - 1) * ldw;

  float acc[G][4];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;

  constexpr int PASS = 32 * U;  // k of a pass
  static_assert(!ROWS || U == 8, "the rows form's pass is 256 k: a 512-byte row per load instruction");
  for (long long k0 = static_cast<long long>(rank) * kc; k0 < K; k0 += static_cast<long long>(S) * kc) {
    const long long end = min(k0 + kc, K);
    using P = typename Choose<ROWS, RowsPass<G>, Pass<G, U>>::type;
    P now, next;
    const auto load = [&](P& p, long long base) {
      if constexpr (ROWS) p.load(w, n0, N, ldw, base, end, lane); else p.load(w_row, base, end, quad);
    };
    load(now, k0);  // in flight while a's chunk is copied
    __syncthreads();  // every warp is done reading the previous chunk
    stage<T, W, VECS>(a_s, a, M, end, lda, k0, (kc + PASS - 1) / PASS * (PASS / 8));
    copy_async_wait();
    __syncthreads();
    for (long long base = k0;; base += PASS) {  // the same for the whole warp: mma.sync needs all 32 lanes
      const bool more = base + PASS < end;
      if (more) load(next, base + PASS);
      const int step0 = static_cast<int>((base - k0) / 32);
      if constexpr (ROWS) now.template multiply<T, VECS>(acc, a_s, w_s + warp * 8 * G * 32, step0, lane);
      else now.template multiply<T, VECS>(acc, a_s, step0, row, quad);
      if (!more) break;
      now = next;
    }
  }

#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][g][j][lane] = acc[g][j];
  if constexpr (S > 1) cluster_sync(); else __syncthreads();
  // accumulator j of lane l in group g of warp v: row (l / 4) + 8 (j / 2) of out, column
  // 8 G v + 8 g + 2 (l % 4) + j % 2 of the cluster's rows; rank r sums entries r, r + S, ... in rank order
  const long long cluster_n0 = static_cast<long long>(blockIdx.x / S) * (8 * G * W);
  for (int i = rank + S * static_cast<int>(threadIdx.x); i < W * G * 128; i += S * 32 * W) {
    const int v = i / (G * 128), g = (i >> 7) % G, j = (i >> 5) & 3, l = i & 31;
    const long long m = (l >> 2) + 8 * (j >> 1);
    const long long n = cluster_n0 + 8 * G * v + 8 * g + 2 * (l & 3) + (j & 1);
    if (m < M && n < N) {
      float s = 0.f;
      if constexpr (S > 1) {
#pragma unroll
        for (int q = 0; q < S; ++q) s += load_remote(&partial[v][g][j][l], q);
      } else {
        s = partial[v][g][j][l];
      }
      out[m * ldo + n] = from_float<T>(s);
    }
  }
  if constexpr (S > 1) cluster_sync();  // no block leaves while another reads its partial sums
}

// Experiment: gemm_decode.cu's layout (a block per 8 rows, its W warps splitting K by passes, a's fragments
// loaded from global memory at use, partial sums met in shared memory) with the rows form's loads.
template <typename T, int W>
__device__ __forceinline__ void decode_rows(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                            long long M, long long N, long long K, long long lda, long long ldw,
                                            long long ldo) {
  __shared__ __align__(16) uint4 w_s[W * 8 * 32];
  __shared__ float partial[W][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = lane >> 2, quad = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * 8;
  const T* a_lo = a + min(static_cast<long long>(row), M - 1) * lda;
  const T* a_hi = a + min(static_cast<long long>(row + 8), M - 1) * lda;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  uint4* mine = w_s + warp * 8 * 32;
  constexpr long long PASS = 256, STEP = PASS * W;
  long long base = static_cast<long long>(warp) * PASS;
  if (base < K) {
    RowsPass<1> now, next;
    now.load(w, n0, N, ldw, base, K, lane);
    for (;;) {
      const bool more = base + STEP < K;
      if (more) next.load(w, n0, N, ldw, base + STEP, K, lane);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 8; ++i) mine[staged<32>(i, lane)] = now.w[i];
      __syncwarp();
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const long long k = base + 32 * u + 8 * quad;
        const bool in = k < K;
        uint4 lo = load_kept(a_lo + (in ? k : K - 8)), hi = load_kept(a_hi + (in ? k : K - 8));
        if (!in) lo = hi = make_uint4(0, 0, 0, 0);
        const uint4 f = mine[staged<32>(row, 4 * u + quad)];
        Mma<T>::run(acc[0], lo, hi, f.x, f.y, true);
        Mma<T>::run(acc[0], lo, hi, f.z, f.w, false);
      }
      if (!more) break;
      now = next;
      base += STEP;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) partial[warp][j][lane] = acc[0][j];
  __syncthreads();
  for (int i = threadIdx.x; i < 128; i += 32 * W) {
    const int j = i >> 5, l = i & 31;
    const long long m = (l >> 2) + 8 * (j >> 1), n = n0 + 2 * (l & 3) + (j & 1);
    if (m < M && n < N) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < W; ++v) s += partial[v][j][l];
      out[m * ldo + n] = from_float<T>(s);
    }
  }
}

// Experiment: the MMA with w as its A operand (16 rows of w per MMA, a's tokens as B, 8 per MMA): per
// byte of w, half the loads of a of gemm_decode.cu's form (w as B, 8 rows), and none of a's second half at M <= 8.
template <typename T, int G, int W, int U>
__device__ __forceinline__ void decode_swap(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                            long long M, long long N, long long K, long long lda, long long ldw,
                                            long long ldo) {
  __shared__ float partial[W][G][2][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g8 = lane >> 2, quad = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * (16 * G);
  const bool two = M > 8;  // the same for the whole block: mma.sync sees all 32 lanes either way
  const T* x0 = a + min(static_cast<long long>(g8), M - 1) * lda;
  const T* x1 = a + min(static_cast<long long>(g8 + 8), M - 1) * lda;
  const T* w0[G];
  const T* w1[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    w0[g] = w + min(n0 + 16 * g + g8, N - 1) * ldw;
    w1[g] = w + min(n0 + 16 * g + g8 + 8, N - 1) * ldw;
  }
  float acc[G][2][4];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[g][h][0] = acc[g][h][1] = acc[g][h][2] = acc[g][h][3] = 0.f;

  struct SwapPass {
    uint4 lo[U][G], hi[U][G], xa[U], xb[U];
  };
  const auto load = [&](SwapPass& p, long long base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + 8 * quad;
      const bool in = k < K;
      const long long at = in ? k : K - 8;
#pragma unroll
      for (int g = 0; g < G; ++g) p.lo[u][g] = load_stream(w0[g] + at), p.hi[u][g] = load_stream(w1[g] + at);
      p.xa[u] = load_kept(x0 + at);
      p.xb[u] = two ? load_kept(x1 + at) : make_uint4(0, 0, 0, 0);
      if (!in) {
        p.xa[u] = p.xb[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int g = 0; g < G; ++g) p.lo[u][g] = p.hi[u][g] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  const auto multiply = [&](const SwapPass& p) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        // A = w: {row g8, k slot 2q}, {row g8 + 8, 2q}, {row g8, 8 + 2q}, {row g8 + 8, 8 + 2q}
        const uint4 l = p.lo[u][g], h = p.hi[u][g];
        Mma<T>::run(acc[g][0], make_uint4(l.x, l.y, 0, 0), make_uint4(h.x, h.y, 0, 0), p.xa[u].x, p.xa[u].y, true);
        Mma<T>::run(acc[g][0], make_uint4(l.z, l.w, 0, 0), make_uint4(h.z, h.w, 0, 0), p.xa[u].z, p.xa[u].w, true);
        if (two) {
          Mma<T>::run(acc[g][1], make_uint4(l.x, l.y, 0, 0), make_uint4(h.x, h.y, 0, 0), p.xb[u].x, p.xb[u].y, true);
          Mma<T>::run(acc[g][1], make_uint4(l.z, l.w, 0, 0), make_uint4(h.z, h.w, 0, 0), p.xb[u].z, p.xb[u].w, true);
        }
      }
  };
  constexpr long long PASS = 32 * U, STEP = PASS * W;
  long long base = static_cast<long long>(warp) * PASS;
  if (base < K) {
    SwapPass now, next;
    load(now, base);
    for (;;) {
      const bool more = base + STEP < K;
      if (more) load(next, base + STEP);
      multiply(now);
      if (!more) break;
      now = next;
      base += STEP;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j) partial[warp][g][h][j][lane] = acc[g][h][j];
  __syncthreads();
  // D of group g, half h: row 16 g + (l / 4) + 8 (j / 2) of the block's w rows, token 8 h + 2 (l % 4) + j % 2
  for (int i = threadIdx.x; i < G * 256; i += 32 * W) {
    const int g = i >> 8, h = (i >> 7) & 1, j = (i >> 5) & 3, l = i & 31;
    const long long m = 8 * h + 2 * (l & 3) + (j & 1), n = n0 + 16 * g + (l >> 2) + 8 * (j >> 1);
    if (m < M && n < N) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < W; ++v) s += partial[v][g][h][j][l];
      out[m * ldo + n] = from_float<T>(s);
    }
  }
}

}  // namespace

#define TUNEKIT_GEMM_DECODE_CLUSTER(name, T, G, W, U, S, KC, ROWS)                                       \
  extern "C" __global__ void __launch_bounds__(32 * W) __cluster_dims__(S, 1, 1)                        \
      name(const T* a, const T* w, T* out, long long M, long long N, long long K, long long lda,        \
           long long ldw, long long ldo, long long kc) {                                                \
    decode_cluster<T, G, W, U, S, KC, ROWS>(a, w, out, M, N, K, lda, ldw, ldo, static_cast<int>(kc));    \
  }

#define TUNEKIT_GEMM_DECODE_CLUSTER_FORMS(suffix, T)                                                      \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_g2_w4_u4_s4, T, 2, 4, 4, 4, 1024, false)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_g2_w8_u4_s4, T, 2, 8, 4, 4, 1024, false)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_rows_g1_w4_s2, T, 1, 4, 8, 2, 512, true)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_rows_g1_w4_s4, T, 1, 4, 8, 4, 512, true)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_rows_g1_w4_s8, T, 1, 4, 8, 8, 512, true)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_rows_g1_w2_s4, T, 1, 2, 8, 4, 512, true)     \
  TUNEKIT_GEMM_DECODE_CLUSTER(gemm_decode_cluster_##suffix##_rows_g1_w8_s4, T, 1, 8, 8, 4, 256, true)

#define TUNEKIT_GEMM_DECODE_ROWS(name, T, W)                                                             \
  extern "C" __global__ void __launch_bounds__(32 * W)                                                  \
      name(const T* a, const T* w, T* out, long long M, long long N, long long K, long long lda,        \
           long long ldw, long long ldo, long long kc) {                                                \
    decode_rows<T, W>(a, w, out, M, N, K, lda, ldw, ldo);                                               \
  }

#define TUNEKIT_GEMM_DECODE_ROWS_FORMS(suffix, T)                                                        \
  TUNEKIT_GEMM_DECODE_ROWS(gemm_decode_cluster_##suffix##_plainrows_w4, T, 4)                            \
  TUNEKIT_GEMM_DECODE_ROWS(gemm_decode_cluster_##suffix##_plainrows_w2, T, 2)                            \
  TUNEKIT_GEMM_DECODE_ROWS(gemm_decode_cluster_##suffix##_plainrows_w8, T, 8)

#define TUNEKIT_GEMM_DECODE_SWAP(name, T, G, W, U)                                                      \
  extern "C" __global__ void __launch_bounds__(32 * W)                                                  \
      name(const T* a, const T* w, T* out, long long M, long long N, long long K, long long lda,        \
           long long ldw, long long ldo, long long kc) {                                                \
    decode_swap<T, G, W, U>(a, w, out, M, N, K, lda, ldw, ldo);                                         \
  }

#define TUNEKIT_GEMM_DECODE_SWAP_FORMS(suffix, T)                                                       \
  TUNEKIT_GEMM_DECODE_SWAP(gemm_decode_cluster_##suffix##_swap_g1_w4_u4, T, 1, 4, 4)                    \
  TUNEKIT_GEMM_DECODE_SWAP(gemm_decode_cluster_##suffix##_swap_g1_w4_u2, T, 1, 4, 2)                    \
  TUNEKIT_GEMM_DECODE_SWAP(gemm_decode_cluster_##suffix##_swap_g2_w4_u2, T, 2, 4, 2)                    \
  TUNEKIT_GEMM_DECODE_SWAP(gemm_decode_cluster_##suffix##_swap_g1_w8_u4, T, 1, 8, 4)                    \
  TUNEKIT_GEMM_DECODE_SWAP(gemm_decode_cluster_##suffix##_swap_g1_w2_u4, T, 1, 2, 4)

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_GEMM_DECODE_CLUSTER_FORMS(f16, __half)
TUNEKIT_GEMM_DECODE_CLUSTER_FORMS(bf16, __nv_bfloat16)
TUNEKIT_GEMM_DECODE_ROWS_FORMS(f16, __half)
TUNEKIT_GEMM_DECODE_ROWS_FORMS(bf16, __nv_bfloat16)
TUNEKIT_GEMM_DECODE_SWAP_FORMS(f16, __half)
TUNEKIT_GEMM_DECODE_SWAP_FORMS(bf16, __nv_bfloat16)
#endif
