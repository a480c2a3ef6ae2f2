// One-row decode GEMM (out[N] = w[N, K] @ a[K]) with the weight brought into shared memory by the bulk copy
// engine (cp.async.bulk, sm_90) instead of load instructions, appended to kernels/cuda/gemv.cu by
// benchmarks/experiments/gemv_bulk_probe.py (it uses gemv.cu's load_kept and dot8):
// - gemv_bulk_<T>_w<W>_s<S>_p<P>: blocks of W warps, each block a contiguous range of rows, its warps taking
//   the range's rows in turn. Each warp runs its own ring of S slots of P bytes (a piece of a row each, one
//   mbarrier a slot): lane 0 keeps S - 1 pieces in flight, the lanes multiply a piece from shared memory by
//   `a` (staged once per block in shared memory) and reduce by shuffles at each row's end. No register holds
//   the weight in flight, so the bytes in flight per SM are set by S x P x warps, not by registers.
// - bulk_read_w<W>_s<S>_p<P>: the same rings over the weight's bytes with nothing computed: the engine's
//   read ceiling.
// Host checks (the probe): float16/bfloat16, K a multiple of 8, 16-byte aligned rows; dynamic shared memory
// = barriers (8 B a slot, in 128-byte units) + W x S x P + 2K (the read kernel: no a).

namespace {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void barriers_visible() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// lane 0: one piece of `bytes` bytes from global `src` into shared `dst`, completing `bar`'s current phase
__device__ __forceinline__ void bulk_piece(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the lanes' reads of the slot come first
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(shared_address(dst)), "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

__device__ __forceinline__ void barrier_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// The barriers' bytes at the start of shared memory, in 128-byte units (the slots after them aligned).
__host__ __device__ constexpr int barrier_bytes(int slots) { return (slots * 8 + 127) / 128 * 128; }

// The block's rows [first, end): block b of B gets rows [b N / B, (b + 1) N / B).
struct Rows {
  long long first, end;
};

__device__ __forceinline__ Rows block_rows(long long N) {
  return {N * blockIdx.x / gridDim.x, N * (blockIdx.x + 1) / gridDim.x};
}

// A warp's ring over the pieces of its rows: row first + warp + i W, piece j of ceil(2K / P) each.
template <int W, int S, int P>
struct Ring {
  unsigned long long* bar;
  unsigned char* slots;
  long long first, rows, per_row, row_bytes, ldw_bytes;
  const unsigned char* w;

  __device__ long long items() const { return rows * per_row; }
  __device__ long long row(long long item) const { return first + (item / per_row) * W; }
  __device__ unsigned bytes(long long item) const {
    const long long left = row_bytes - (item % per_row) * P;
    return static_cast<unsigned>(left < P ? left : P);
  }
  __device__ void issue(long long item) const {
    const int s = static_cast<int>(item % S);
    bulk_piece(slots + s * P, w + row(item) * ldw_bytes + (item % per_row) * P, bytes(item), bar + s);
  }
  __device__ const unsigned char* wait(long long item) const {
    const int s = static_cast<int>(item % S);
    barrier_wait(bar + s, static_cast<unsigned>((item / S) & 1));
    return slots + s * P;
  }
};

template <int W, int S, int P>
__device__ __forceinline__ Ring<W, S, P> warp_ring(unsigned char* smem, const void* w, long long N, long long K,
                                                   long long ldw, int elem) {
  const int warp = threadIdx.x >> 5;
  const Rows r = block_rows(N);
  Ring<W, S, P> ring;
  ring.bar = reinterpret_cast<unsigned long long*>(smem) + warp * S;
  ring.slots = smem + barrier_bytes(W * S) + warp * S * P;
  ring.first = r.first + warp;
  ring.rows = ring.first < r.end ? (r.end - 1 - ring.first) / W + 1 : 0;
  ring.row_bytes = K * elem;
  ring.per_row = (ring.row_bytes + P - 1) / P;
  ring.ldw_bytes = ldw * elem;
  ring.w = static_cast<const unsigned char*>(w);
  if ((threadIdx.x & 31) == 0) {
    for (int s = 0; s < S; ++s) barrier_init(ring.bar + s);
    barriers_visible();
  }
  return ring;
}

template <typename T, int W, int S, int P>
__device__ __forceinline__ void gemv_bulk(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                                          long long N, long long K, long long ldw) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* a_s = reinterpret_cast<uint4*>(smem + barrier_bytes(W * S) + W * S * P);
  for (long long i = threadIdx.x; i < K / 8; i += blockDim.x) a_s[i] = load_kept(a + 8 * i);
  const Ring<W, S, P> ring = warp_ring<W, S, P>(smem, w, N, K, ldw, sizeof(T));
  __syncthreads();  // a staged, barriers initialised
  const int lane = threadIdx.x & 31;
  const long long items = ring.items();
  if (lane == 0)
    for (long long i = 0; i < S - 1 && i < items; ++i) ring.issue(i);
  float acc = 0.f;
  for (long long i = 0; i < items; ++i) {
    if (lane == 0 && i + S - 1 < items) ring.issue(i + S - 1);  // slot (i - 1) % S: read by every lane before
    const uint4* piece = reinterpret_cast<const uint4*>(ring.wait(i));
    const uint4* ap = a_s + (i % ring.per_row) * (P / 16);
    const int n16 = static_cast<int>(ring.bytes(i) / 16);
    if (n16 == P / 16) {
#pragma unroll
      for (int e = lane; e < P / 16; e += 32) acc += dot8(piece[e], ap[e], T());
    } else {
      for (int e = lane; e < n16; e += 32) acc += dot8(piece[e], ap[e], T());
    }
    __syncwarp();  // every lane done with slot i % S before lane 0 refills it (next iteration)
    if (i % ring.per_row == ring.per_row - 1) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      if (lane == 0) out[ring.row(i)] = from_float<T>(acc);
      acc = 0.f;
    }
  }
}

template <int W, int S, int P>
__device__ __forceinline__ void bulk_read(const void* __restrict__ w, unsigned* __restrict__ sink, long long N,
                                          long long K, long long ldw) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Ring<W, S, P> ring = warp_ring<W, S, P>(smem, w, N, K, ldw, 2);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const long long items = ring.items();
  if (lane == 0)
    for (long long i = 0; i < S - 1 && i < items; ++i) ring.issue(i);
  unsigned acc = 0;
  for (long long i = 0; i < items; ++i) {
    if (lane == 0 && i + S - 1 < items) ring.issue(i + S - 1);
    acc ^= reinterpret_cast<const unsigned*>(ring.wait(i))[lane];
    __syncwarp();
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = acc;  // keeps the reads
}

}  // namespace

#define TUNEKIT_GEMV_BULK(T, SUFFIX, W, S, P)                                                              \
  extern "C" __global__ void __launch_bounds__(32 * W) gemv_bulk_##SUFFIX##_w##W##_s##S##_p##P(             \
      const T* a, const T* w, T* out, long long N, long long K, long long ldw) {                           \
    gemv_bulk<T, W, S, P>(a, w, out, N, K, ldw);                                                           \
  }

#define TUNEKIT_BULK_READ(W, S, P)                                                                         \
  extern "C" __global__ void __launch_bounds__(32 * W) bulk_read_w##W##_s##S##_p##P(                        \
      const void* w, unsigned* sink, long long N, long long K, long long ldw) {                             \
    bulk_read<W, S, P>(w, sink, N, K, ldw);                                                                \
  }

#define TUNEKIT_BULK_FORMS(W, S, P)                                                                        \
  TUNEKIT_GEMV_BULK(__nv_bfloat16, bf16, W, S, P)                                                          \
  TUNEKIT_BULK_READ(W, S, P)

TUNEKIT_BULK_FORMS(4, 4, 4096)
TUNEKIT_BULK_FORMS(4, 8, 2048)
TUNEKIT_BULK_FORMS(8, 4, 2048)
TUNEKIT_BULK_FORMS(8, 3, 4096)
TUNEKIT_BULK_FORMS(2, 8, 4096)
TUNEKIT_BULK_FORMS(4, 6, 8192)
