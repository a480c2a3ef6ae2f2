"""The CUDA driver and NVRTC through ``cuda-bindings``, imported at first use.

Everything that talks to the driver or NVRTC directly (compiling, loading modules, launching,
occupancy) goes through :func:`bindings`, so a machine without the ``cuda`` extra imports tunekit
fine and every CUDA C candidate says why it cannot run (:class:`NvrtcUnavailable`).
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["NvrtcUnavailable", "bindings", "check", "entry_point"]


class NvrtcUnavailable(RuntimeError):
    """cuda-bindings / NVRTC is not installed (``pip install 'tunekit[cuda]'``)."""


@functools.lru_cache(maxsize=None)
def bindings():
    """``(cuda.bindings.driver, cuda.bindings.nvrtc)``; NvrtcUnavailable without cuda-bindings."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:
        raise NvrtcUnavailable(f"CUDA C candidates need cuda-bindings and NVRTC: pip install 'tunekit[cuda]' ({exc})") from None
    return driver, nvrtc


def check(result, what: str) -> None:
    """Raise RuntimeError naming ``what`` unless ``result`` (a CUresult / nvrtcResult) is success."""
    if int(result) != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


@functools.lru_cache(maxsize=None)
def entry_point(symbol: str = "cuLaunchKernel") -> int:
    """The address of the driver's ``symbol`` (``cuLaunchKernel``, or ``cuLaunchKernelEx`` for
    programmatic dependent launches; legacy default-stream semantics for stream 0, as torch's own
    launches have), found through the driver's ``cuGetProcAddress``; 0 when the driver lacks it."""
    driver, _ = bindings()
    err, version = driver.cuDriverGetVersion()
    check(err, "cuDriverGetVersion")
    legacy = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    err, address, _ = driver.cuGetProcAddress(symbol.encode(), version, legacy)
    address = int(address) if int(err) == 0 else 0
    if not address:  # not expected from a working driver; libcuda's exported symbol is the same function
        address = ctypes.cast(getattr(ctypes.CDLL("libcuda.so.1"), symbol, None), ctypes.c_void_p).value or 0
    if not address and symbol == "cuLaunchKernel":
        raise RuntimeError("cuLaunchKernel not found in the CUDA driver")
    return address
