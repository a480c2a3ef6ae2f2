// silu(x) = x * sigmoid(x) and its gradient, in every form of elementwise.cuh (f32, f32x4, f16,
// f16x2, f16x8, f16x8_pack, the same in bf16, and strided multi-pack forms).
#include "elementwise.cuh"

// expf, not __expf: the fast intrinsic's error grows with |x| (about 1e-5 relative near x = -80).
// x = -inf gives -inf / inf = NaN, as torch does.
struct SiluForward {
  __device__ __forceinline__ float operator()(float x) const { return x / (1.0f + expf(-x)); }
};

// PyTorch's formula, so special values (inf, NaN) come out as torch's do.
struct SiluBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float s = 1.0f / (1.0f + expf(-x));
    return dy * s * (1.0f + x * (1.0f - s));
  }
};

// 16-bit storage: the same formulas on tunekit::fast_sigmoid (see elementwise.cuh for why).
struct SiluForwardFast {
  __device__ __forceinline__ float operator()(float x) const { return x * tunekit::fast_sigmoid(x); }
};

struct SiluBackwardFast {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float s = tunekit::fast_sigmoid(x);
    return dy * s * (1.0f + x * (1.0f - s));
  }
};

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_FORMS(TUNEKIT_UNARY, silu, SiluForward, SiluForwardFast, SiluForwardFast)
TUNEKIT_FORMS(TUNEKIT_BINARY, silu_backward, SiluBackward, SiluBackwardFast, SiluBackwardFast)
#endif
