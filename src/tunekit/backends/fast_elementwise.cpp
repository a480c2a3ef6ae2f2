// The CUDA C elementwise candidates' whole run (allocate the output, launch the kernel) in C++:
// on a cached call this is most of the host time, and torch.empty_like from Python alone costs
// ~1.2 us on an H200 host (argument parsing, the dispatcher, wrapping the result). Built at first
// use by tunekit.backends.fast_launch (pybind11 and ATen headers from the installed torch).
//
//   unary(entry, function, stream, x, out, per_block, max_grid) -> out
//   binary(entry, function, stream, a, b, out, per_block, max_grid) -> out
//
// entry: the driver's cuLaunchKernel; function: a CUfunction handle; stream: a CUstream handle
// (torch's current stream, from the caller); out: a tensor to write or None (allocate like x);
// the kernel takes (inputs..., out, long long n) and a grid of ceil(n / per_block) blocks of 256
// threads, capped at max_grid when max_grid > 0 (persistent forms). n = 0 launches nothing.
// The caller (CudaElementwise) has checked dtype, contiguity, device and alignment.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                             void**);
constexpr unsigned kBlock = 256;

void launch(uint64_t entry, uint64_t function, uint64_t stream, void** params, int64_t n, int64_t per_block,
            int64_t max_grid) {
  int64_t grid = (n + per_block - 1) / per_block;
  if (max_grid > 0 && grid > max_grid) grid = max_grid;
  if (grid > 0xFFFFFFFFll) throw std::invalid_argument("fast_elementwise: grid over 2^32 blocks");
  const int err = reinterpret_cast<LaunchKernel>(entry)(reinterpret_cast<void*>(function), static_cast<unsigned>(grid),
                                                         1, 1, kBlock, 1, 1, 0, reinterpret_cast<void*>(stream), params,
                                                         nullptr);
  if (err != 0) throw std::runtime_error("cuLaunchKernel failed: CUresult " + std::to_string(err));
}

at::Tensor unary(uint64_t entry, uint64_t function, uint64_t stream, const at::Tensor& x,
                 std::optional<at::Tensor> out, int64_t per_block, int64_t max_grid) {
  at::Tensor y = out.has_value() ? *out : at::empty_like(x);
  int64_t n = x.numel();
  if (n > 0) {
    void* xp = x.data_ptr();
    void* yp = y.data_ptr();
    void* params[] = {&xp, &yp, &n};
    launch(entry, function, stream, params, n, per_block, max_grid);
  }
  return y;
}

at::Tensor binary(uint64_t entry, uint64_t function, uint64_t stream, const at::Tensor& a, const at::Tensor& b,
                  std::optional<at::Tensor> out, int64_t per_block, int64_t max_grid) {
  at::Tensor y = out.has_value() ? *out : at::empty_like(b);
  int64_t n = b.numel();
  if (n > 0) {
    void* ap = a.data_ptr();
    void* bp = b.data_ptr();
    void* yp = y.data_ptr();
    void* params[] = {&ap, &bp, &yp, &n};
    launch(entry, function, stream, params, n, per_block, max_grid);
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("unary", &unary, "allocate (unless out is given) and launch a one-input elementwise kernel");
  m.def("binary", &binary, "allocate (unless out is given) and launch a two-input elementwise kernel");
}
