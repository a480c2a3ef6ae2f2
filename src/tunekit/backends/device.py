"""Facts of a CUDA device that launch code needs on every call, read once per process."""

from __future__ import annotations

import functools

import torch

__all__ = ["sm_count", "peak_flops_bound", "current_device", "raw_stream"]


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (grids are sized in waves of them)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


#: dense tensor-core FLOP per clock per SM for 16-bit inputs, by compute capability major (A100: 2048,
#: H100 / H200: 4096, B200: 8192); TF32 is half of it, float32 without TF32 256 (CUDA cores)
_TENSOR_FLOP_PER_CLOCK = {8: 2048, 9: 4096, 10: 8192}
#: a clock above any of those GPUs' boost clocks (1.4-2.0 GHz): the peak below is an upper bound
_CLOCK_BOUND_HZ = 2.2e9


def peak_flops_bound(index: int, kind: str) -> float | None:
    """An upper bound on CUDA device ``index``'s dense matrix FLOP/s for ``kind`` ("16bit", "tf32",
    "fp32"), from its SM count and architecture; None for an architecture not in the table."""
    per_clock = _TENSOR_FLOP_PER_CLOCK.get(torch.cuda.get_device_capability(index)[0])
    if per_clock is None:
        return None
    per_clock = {"16bit": per_clock, "tf32": per_clock // 2, "fp32": 256}[kind]
    return sm_count(index) * _CLOCK_BOUND_HZ * per_clock


def _stream_of_current(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


#: the current device's index (a private binding, with a public fallback). Launches compare it with
#: the kernel's device: cuLaunchKernel runs in the calling thread's current context, and a kernel
#: of another device's module fails there (CUDA_ERROR_INVALID_HANDLE: a tensor on cuda:1 while
#: cuda:0 is current, as multi-GPU programs have).
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

#: the raw handle of torch's current stream on a device (a private binding, with a public fallback)
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_of_current
