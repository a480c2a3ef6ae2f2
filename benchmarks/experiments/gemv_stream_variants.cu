// One-row decode GEMM (out[N] = w[N, K] @ a[K]) layouts that keep the weight streaming without pauses,
// appended to kernels/cuda/gemv.cu by benchmarks/experiments/gemv_stream_probe.py (which uses its
// load_stream, load_kept and dot8). The committed kernel gives each warp one row and ends; these run a
// persistent grid, `a` staged once per block in shared memory (K <= 24576: 48 KB), and issue the next
// row's loads before the current row is reduced:
// - gemv_persist_<T>_u<U>: a warp per row, rows n = warp, warp + warps, ...; the row streamed in chunks
//   of U loads per lane (512 contiguous bytes a load), the next chunk (the next row's first at a row's
//   end) loaded before the current one is multiplied.
// - gemv_rowblock_<T>_l<L>: a block of 256 threads per row, rows n = block, block + blocks, ...; each
//   thread holds up to L 16-byte loads of the row (K <= 2048 L), the next row's loads issued before
//   the block's reduction (shuffles, shared memory) of the current one.
// - read_x8: the read ceiling's kernel (8 loads in flight a thread, grid-stride), the weight's bytes.
// Host checks (the probe): float16/bfloat16, K a multiple of 8, 16-byte aligned rows.

namespace {

template <typename T, int U>
__device__ __forceinline__ void persist_load(uint4 (&dst)[U], const T* w, long long row, long long ldw, int c,
                                             long long K, int lane) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long k = static_cast<long long>(c) * U * 256 + u * 256 + lane * 8;
    dst[u] = k < K ? load_stream(w + row * ldw + k) : make_uint4(0, 0, 0, 0);
  }
}

template <typename T, int U>
__device__ __forceinline__ void gemv_persist(const T* __restrict__ a, const T* __restrict__ w,
                                             T* __restrict__ out, long long N, long long K, long long ldw) {
  extern __shared__ uint4 a_s[];
  for (long long i = threadIdx.x; i < K / 8; i += blockDim.x) a_s[i] = load_kept(a + 8 * i);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int per_block = blockDim.x >> 5;
  const long long stride = static_cast<long long>(gridDim.x) * per_block;
  long long n = static_cast<long long>(blockIdx.x) * per_block + (threadIdx.x >> 5);
  if (n >= N) return;
  const int chunks = static_cast<int>((K + U * 256 - 1) / (U * 256));
  uint4 cur[U], nxt[U];
  persist_load<T, U>(cur, w, n, ldw, 0, K, lane);
  int c = 0;
  float acc = 0.f;
  for (;;) {
    long long nn = n;
    int nc = c + 1;
    if (nc == chunks) nc = 0, nn = n + stride;
    const bool more = nn < N;
    if (more) persist_load<T, U>(nxt, w, nn, ldw, nc, K, lane);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = static_cast<long long>(c) * U * 256 + u * 256 + lane * 8;
      if (k < K) acc += dot8(cur[u], a_s[k / 8], T());
    }
    if (nc == 0) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      if (lane == 0) out[n] = tunekit::from_float<T>(acc);
      acc = 0.f;
    }
    if (!more) break;
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = nxt[u];
    n = nn, c = nc;
  }
}

template <typename T, int L>
__device__ __forceinline__ void rowblock_load(uint4 (&dst)[L], const T* w, long long row, long long ldw,
                                              long long K) {
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const long long k = (static_cast<long long>(l) * 256 + threadIdx.x) * 8;
    dst[l] = k < K ? load_stream(w + row * ldw + k) : make_uint4(0, 0, 0, 0);
  }
}

template <typename T, int L>
__device__ __forceinline__ void gemv_rowblock(const T* __restrict__ a, const T* __restrict__ w,
                                              T* __restrict__ out, long long N, long long K, long long ldw) {
  extern __shared__ uint4 a_s[];
  __shared__ float partial[2][8];
  for (long long i = threadIdx.x; i < K / 8; i += blockDim.x) a_s[i] = load_kept(a + 8 * i);
  __syncthreads();
  long long n = blockIdx.x;
  if (n >= N) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4 cur[L], nxt[L];
  rowblock_load<T, L>(cur, w, n, ldw, K);
  for (int parity = 0;; parity ^= 1) {
    const long long nn = n + gridDim.x;
    if (nn < N) rowblock_load<T, L>(nxt, w, nn, ldw, K);
    float acc = 0.f;
#pragma unroll
    for (int l = 0; l < L; ++l) {
      const long long k = (static_cast<long long>(l) * 256 + threadIdx.x) * 8;
      if (k < K) acc += dot8(cur[l], a_s[k / 8], T());
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) partial[parity][warp] = acc;  // two buffers: one barrier a row
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s += partial[parity][i];
      out[n] = tunekit::from_float<T>(s);
    }
    if (nn >= N) break;
#pragma unroll
    for (int l = 0; l < L; ++l) cur[l] = nxt[l];
    n = nn;
  }
}

}  // namespace

#define PERSIST(name, T, U)                                                                               \
  extern "C" __global__ void __launch_bounds__(256)                                                      \
      name(const T* a, const T* w, T* out, long long N, long long K, long long ldw) {                    \
    gemv_persist<T, U>(a, w, out, N, K, ldw);                                                            \
  }
#define ROWBLOCK(name, T, L)                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                      \
      name(const T* a, const T* w, T* out, long long N, long long K, long long ldw) {                    \
    gemv_rowblock<T, L>(a, w, out, N, K, ldw);                                                           \
  }

PERSIST(gemv_persist_bf16_u4, __nv_bfloat16, 4)
PERSIST(gemv_persist_bf16_u8, __nv_bfloat16, 8)
ROWBLOCK(gemv_rowblock_bf16_l2, __nv_bfloat16, 2)
ROWBLOCK(gemv_rowblock_bf16_l4, __nv_bfloat16, 4)
ROWBLOCK(gemv_rowblock_bf16_l8, __nv_bfloat16, 8)

extern "C" __global__ void __launch_bounds__(256) read_x8(const uint4* __restrict__ x, unsigned* __restrict__ y,
                                                          long long n) {
  const long long tile = 256LL * 8;
  unsigned acc = 0;
  for (long long b = blockIdx.x; b * tile < n; b += gridDim.x) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long i = b * tile + threadIdx.x + u * 256LL;
      v[u] = i < n ? x[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) y[blockIdx.x] = acc;  // the loads cannot be dropped
}
