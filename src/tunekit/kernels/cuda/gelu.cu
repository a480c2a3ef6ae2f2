// gelu(x) in both of torch's forms and their gradients, in every form of elementwise.cuh.
//   "none": 0.5 x (1 + erf(x / sqrt 2))
//   "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// All math in fp32 with the accurate erff/tanhf/expf (a half-precision tanh built from exp
// overflows to NaN for x > ~4); no clamping of the input. The formulas follow PyTorch's
// kernels term by term, so results agree within fp32 rounding and special values match.
#include "elementwise.cuh"

#define TUNEKIT_SQRT1_2 0.70710678118654752440f
#define TUNEKIT_BETA 0.79788456080286535588f    /* sqrt(2 / pi) */
#define TUNEKIT_KAPPA 0.044715f
#define TUNEKIT_PDF_SCALE 0.39894228040143267794f /* 1 / sqrt(2 pi) */

struct GeluForward {
  __device__ __forceinline__ float operator()(float x) const { return 0.5f * x * (1.0f + erff(x * TUNEKIT_SQRT1_2)); }
};

struct GeluTanhForward {
  __device__ __forceinline__ float operator()(float x) const {
    const float inner = TUNEKIT_BETA * (x + TUNEKIT_KAPPA * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
};

struct GeluBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float cdf = 0.5f * (1.0f + erff(x * TUNEKIT_SQRT1_2));
    const float pdf = expf(-0.5f * x * x) * TUNEKIT_PDF_SCALE;
    return dy * (cdf + x * pdf);
  }
};

struct GeluTanhBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float x_sq = x * x;
    const float inner = TUNEKIT_BETA * (x + TUNEKIT_KAPPA * x_sq * x);
    const float t = tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.0f + t;
    const float left_derivative = 0.5f * right;
    const float right_derivative = left * (1.0f - t * t) * (TUNEKIT_BETA * (1.0f + 3.0f * TUNEKIT_KAPPA * x_sq));
    return dy * (left_derivative + right_derivative);
  }
};

// 16-bit storage: the same functions from the fast building blocks of elementwise.cuh.
// erf form: Phi(x) from Phi(-|x|) (no cancellation for x < 0): fast_normal_tail, fitted per storage
// type for a small relative error, forward; fast_normal_cdf, which also gives exp(-x^2/2), backward.
// tanh form: 0.5 (1 + tanh(u)) = sigmoid(2u) exactly, so gelu = x sigmoid(2u) and, with
// s = sigmoid(2u), 1 - tanh^2(u) = 4 s (1 - s): no tanh, no cancellation near tanh = -1.
template <typename Fit>
struct GeluForwardFast {
  __device__ __forceinline__ float operator()(float x) const {
    const float tail = tunekit::fast_normal_tail<Fit>(x);  // Phi(-|x|)
    return x * (x >= 0.0f ? 1.0f - tail : tail);
  }
};

struct GeluTanhForwardFast {
  __device__ __forceinline__ float operator()(float x) const {
    return x * tunekit::fast_sigmoid(2.0f * TUNEKIT_BETA * (x + TUNEKIT_KAPPA * x * x * x));
  }
};

struct GeluBackwardFast {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    float e;  // exp(-x^2 / 2)
    const float cdf = tunekit::fast_normal_cdf(x, e);
    return dy * (cdf + x * e * TUNEKIT_PDF_SCALE);
  }
};

struct GeluTanhBackwardFast {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float x_sq = x * x;
    const float s = tunekit::fast_sigmoid(2.0f * TUNEKIT_BETA * (x + TUNEKIT_KAPPA * x_sq * x));
    const float inner_derivative = TUNEKIT_BETA * (1.0f + 3.0f * TUNEKIT_KAPPA * x_sq);
    return dy * (s + 2.0f * x * s * (1.0f - s) * inner_derivative);
  }
};

#ifndef TUNEKIT_SELECTED_KERNELS  // the kernels; tunekit.backends.kernel_units compiles one at a time
TUNEKIT_FORMS(TUNEKIT_UNARY, gelu, GeluForward, GeluForwardFast<tunekit::NormalTailF16>,
              GeluForwardFast<tunekit::NormalTailBF16>)
TUNEKIT_FORMS(TUNEKIT_UNARY, gelu_tanh, GeluTanhForward, GeluTanhForwardFast, GeluTanhForwardFast)
TUNEKIT_FORMS(TUNEKIT_BINARY, gelu_backward, GeluBackward, GeluBackwardFast, GeluBackwardFast)
TUNEKIT_FORMS(TUNEKIT_BINARY, gelu_tanh_backward, GeluTanhBackward, GeluTanhBackwardFast, GeluTanhBackwardFast)
#endif
