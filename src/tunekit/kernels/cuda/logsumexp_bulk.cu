// logsumexp over rows (inner = 1) with the loads handed to the bulk copy engine (sm_90: TMA,
// `cp.async.bulk`), the math of logsumexp.cu.
//
// Why: the rows kernels of logsumexp.cu keep their loads in registers, so how many bytes are in
// flight is ptxas's choice; in 16-bit storage it interleaves the loads with the exp2 math and the
// long rows stay at 83-84% of copy bandwidth on an H200 (Nsight Compute: 42% of stalls on loads,
// DRAM 72%). Per-thread `cp.async` (LDGSTS) was measured slower (one more instruction and a
// shared-memory write per 16 bytes). Here one thread asks the copy engine for a whole chunk of a
// row (CHUNK bytes, in PIECES pieces, each completing on its own mbarrier): every byte of the
// chunk is in flight at once, and the block folds piece 0 while the later pieces still arrive.
// Several blocks per SM (CHUNK of shared memory each) overlap one block's loads with another's math.
//
// Work: items (row, chunk of the row), split fastest so neighbouring blocks read neighbouring
// bytes; one item per block when the grid allows, else grid-stride. A row longer than CHUNK is
// split: each item writes a partial (m, s) and logsumexp.cu's logsumexp_combine merges them.
// Requirements (the host checks them): 16-byte aligned input, cols a multiple of 16 bytes.
#include "logsumexp_partial.cuh"

namespace {

using tunekit::Pack;
using tunekit::to_float;
using namespace tunekit::lse;

constexpr int BLOCK = 256;

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
}

// barrier inits visible to the copy engine (the async proxy) before any copy completes on them
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The one arrival a phase expects, with the bytes its copy will deliver, then the copy itself.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

__device__ __forceinline__ void wait_phase(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

template <typename T, int CHUNK, int PIECES, bool FUSED, bool PAIRWISE>
__device__ __forceinline__ void rows_bulk(const T* x, T* out, float2* partials, long long n_rows, long long cols,
                                          long long chunk, long long splits) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int PIECE = CHUNK / PIECES;     // bytes
  constexpr int PACKS = PIECE / 16 / BLOCK;  // 16-byte packs per thread in a whole piece
  static_assert(PACKS >= 1 && PIECE % (16 * BLOCK) == 0, "a piece is whole packs for every thread");
  __shared__ alignas(128) unsigned char buffer[CHUNK];
  __shared__ alignas(8) unsigned long long bars[PIECES];
  __shared__ Partial warp_partials[BLOCK / 32];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < PIECES; ++q) barrier_init(&bars[q]);
    fence_barrier_init();
  }
  __syncthreads();
  unsigned parity = 0;  // bit q: the phase piece q's barrier completes next
  for (long long item = blockIdx.x; item < n_rows * splits; item += gridDim.x) {
    const long long row = item / splits;
    const long long begin = (item - row * splits) * chunk;
    const long long end = begin + chunk < cols ? begin + chunk : cols;
    const int bytes = static_cast<int>((end - begin) * static_cast<long long>(sizeof(T)));
    if (threadIdx.x == 0) {  // the buffer is free: every thread passed the previous item's barriers
      const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * cols + begin);
#pragma unroll
      for (int q = 0; q < PIECES; ++q) {
        const int lo = q * PIECE;
        if (lo < bytes) bulk_load(buffer + lo, src + lo, bytes - lo < PIECE ? bytes - lo : PIECE, &bars[q]);
      }
    }
    Partial p{-TUNEKIT_INF, 0.0f};
#pragma unroll
    for (int q = 0; q < PIECES; ++q) {
      const int lo = q * PIECE;
      if (lo >= bytes) break;
      wait_phase(&bars[q], (parity >> q) & 1u);
      parity ^= 1u << q;
      const Pack<T, VEC>* packs = reinterpret_cast<const Pack<T, VEC>*>(buffer + lo);
      if (bytes - lo >= PIECE) {  // a whole piece: all of a thread's packs in one fold
        float v[PACKS * VEC];
#pragma unroll
        for (int u = 0; u < PACKS; ++u) {
          const Pack<T, VEC> pk = packs[u * BLOCK + threadIdx.x];
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[u * VEC + k] = to_float(pk.v[k]);
        }
        fold_as<FUSED, PAIRWISE>(p, v);
      } else {
        for (int i = threadIdx.x; i < (bytes - lo) / 16; i += BLOCK) {
          const Pack<T, VEC> pk = packs[i];
          float v[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[k] = to_float(pk.v[k]);
          fold_as<FUSED, PAIRWISE>(p, v);
        }
      }
    }
    p = group_reduce<32>(p);
    if (threadIdx.x % 32 == 0) warp_partials[threadIdx.x / 32] = p;
    __syncthreads();  // also: the buffer is read, the next item may be loaded into it
    if (threadIdx.x == 0) {
      Partial total = warp_partials[0];
#pragma unroll
      for (int w = 1; w < BLOCK / 32; ++w) total = merge(total, warp_partials[w]);
      emit(total, out, partials, row, n_rows, item - row * splits, splits);
    }
    __syncthreads();  // warp_partials is reused by the next item
  }
}
#endif

}  // namespace

// Older GPUs compile a stub (CI builds every source for sm_80 too); the host never launches it there.
#if __CUDA_ARCH__ >= 900
#define TUNEKIT_BULK_BODY(...) rows_bulk<__VA_ARGS__>(x, out, partials, n_rows, cols, chunk, splits);
#else
#define TUNEKIT_BULK_BODY(...) __trap();
#endif

#define TUNEKIT_LSE_BULK(name, T, CHUNK, PIECES, FUSED, PAIRWISE)                                       \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* x, T* out, float2* partials, long long n_rows, long long cols, long long chunk,    \
           long long splits) {                                                                         \
    TUNEKIT_BULK_BODY(T, CHUNK, PIECES, FUSED, PAIRWISE)                                               \
  }

// 32 KB chunks in four 8 KB pieces; the exp argument as FADD + FMUL for 16-bit storage (as
// logsumexp.cu) or as one FFMA (_ffma), the tile's max and sum sequential or as trees (_pairwise).
#define TUNEKIT_LSE_BULK_FORMS(suffix, T)                                                              \
  TUNEKIT_LSE_BULK(logsumexp_bulk_32k_##suffix, T, 32768, 4, sizeof(T) == 4, false)                    \
  TUNEKIT_LSE_BULK(logsumexp_bulk_32k_ffma_##suffix, T, 32768, 4, true, false)                         \
  TUNEKIT_LSE_BULK(logsumexp_bulk_32k_pairwise_##suffix, T, 32768, 4, true, true)

TUNEKIT_LSE_BULK_FORMS(f32, float)
TUNEKIT_LSE_BULK_FORMS(f16, __half)
TUNEKIT_LSE_BULK_FORMS(bf16, __nv_bfloat16)
