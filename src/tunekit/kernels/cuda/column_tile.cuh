// Where a columns block works, shared by logsumexp.cu (the reduction) and logsumexp_backward.cu
// (its gradient), which use the same launch: a block is IX threads along inner (VEC adjacent columns
// each, so a row's loads are one contiguous run) by BLOCK / IX along R, and blockIdx.x flattens
// (inner blocks, outer, splits of R). 64-bit indices throughout.
#pragma once
namespace tunekit {

template <int IX, int VEC, int BLOCK>
struct ColumnTile {
  int tx, ty;                           // this thread's place along inner and along R
  long long ib, o;                      // the block's inner block and outer index
  long long i0;                         // this thread's first column (VEC of them)
  long long split;                      // the block's split of R: rows [begin, end)

  __device__ __forceinline__ ColumnTile(long long outer, long long inner) {
    tx = threadIdx.x % IX;
    ty = threadIdx.x / IX;
    const long long inner_blocks = (inner + IX * VEC - 1) / (IX * VEC);
    ib = blockIdx.x % inner_blocks;
    o = (blockIdx.x / inner_blocks) % outer;
    split = blockIdx.x / inner_blocks / outer;
    i0 = (ib * IX + tx) * VEC;
  }

  // Separate from the constructor so a kernel computes them where it uses them (the gradient after
  // its early exit, so threads past the last column skip that arithmetic).
  __device__ __forceinline__ long long begin(long long chunk) const { return split * chunk; }
  __device__ __forceinline__ long long end(long long R, long long chunk) const {
    return split * chunk + chunk < R ? split * chunk + chunk : R;
  }
};

}  // namespace tunekit
