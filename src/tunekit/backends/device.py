"""Facts of a CUDA device that launch code needs on every call, read once per process."""

from __future__ import annotations

import functools

import torch

__all__ = ["sm_count", "current_device", "raw_stream"]


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (grids are sized in waves of them)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def _stream_of_current(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


#: the current device's index (a private binding, with a public fallback). Launches compare it with
#: the kernel's device: cuLaunchKernel runs in the calling thread's current context, and a kernel
#: of another device's module fails there (CUDA_ERROR_INVALID_HANDLE: a tensor on cuda:1 while
#: cuda:0 is current, as multi-GPU programs have).
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

#: the raw handle of torch's current stream on a device (a private binding, with a public fallback)
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_of_current
