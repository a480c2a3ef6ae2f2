// One-instruction fp32 approximations shared by the kernel sources (inlined into each .cu by
// tunekit.backends.nvrtc.source).
#pragma once
namespace tunekit {

// The hardware's approximate exp2 and reciprocal (one MUFU instruction each), flushing denormals:
// the CUDA intrinsics __expf / __fdividef wrap the same instructions in range fix-ups for denormal
// fp32 values, which no 16-bit result can hold (about a fifth of the fp16 GELU(erf) kernel's
// instructions: docs/measurements.md).
// Special values: exp2(+inf) = inf, exp2(-inf) = 0, rcp(inf) = 0, rcp(0) = inf, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float fast_rcp(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

}  // namespace tunekit
