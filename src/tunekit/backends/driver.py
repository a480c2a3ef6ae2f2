"""The CUDA driver and NVRTC: ``cuda-bindings`` imported at first use, and the few driver calls a
process's first launch needs straight from ``libcuda`` (:func:`libcuda`).

Compiling (NVRTC), occupancy and the launch fallback go through :func:`bindings`, so a machine
without the ``cuda`` extra imports tunekit fine and every CUDA C candidate says why it cannot run
(:class:`NvrtcUnavailable`). Loading a module, finding its function, binding a thread's context and
finding ``cuLaunchKernel`` go through :func:`libcuda` (ctypes, the library torch already loaded):
importing cuda-bindings took 100 ms of a process's first call on the H100, which a cached or
shipped kernel otherwise loads in under a millisecond. Both answer in cuda-bindings' convention (the
error code first), handles as ints.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["NvrtcUnavailable", "bindings", "libcuda", "check", "entry_point"]


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


class _LibCuda:
    """The driver calls of loading and context binding, through ctypes, in cuda-bindings' calling
    convention: ``(error, value...)`` tuples, handles as ints."""

    #: CU_GET_PROC_ADDRESS_LEGACY_STREAM (cuda.h)
    LEGACY_STREAM = 1
    #: entry points older drivers lack: cuGetProcAddress_v2 (before CUDA 12: exported symbols serve),
    #: cuFuncGetParamInfo (before CUDA 12.4: Triton kernels launch through Triton)
    OPTIONAL = ("cuGetProcAddress_v2", "cuFuncGetParamInfo")

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        p, c_int, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
        for name, args in (("cuModuleLoadData", [ctypes.POINTER(p), ctypes.c_char_p]),
                           ("cuModuleGetFunction", [ctypes.POINTER(p), p, ctypes.c_char_p]),
                           ("cuCtxGetCurrent", [ctypes.POINTER(p)]), ("cuCtxSetCurrent", [p]),
                           ("cuDeviceGet", [ctypes.POINTER(c_int), c_int]),
                           ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(p), c_int]),
                           ("cuDriverGetVersion", [ctypes.POINTER(c_int)]),
                           ("cuFuncSetAttribute", [p, c_int, c_int]),
                           ("cuFuncGetParamInfo", [p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                                   ctypes.POINTER(ctypes.c_size_t)]),
                           ("cuGetProcAddress_v2", [ctypes.c_char_p, ctypes.POINTER(p), c_int, u64,
                                                    ctypes.POINTER(c_int)])):
            fn = getattr(lib, name, None)
            if fn is None and name in self.OPTIONAL:
                continue
            fn.argtypes, fn.restype = args, c_int

    def _out(self, name: str, out_type, *args):
        out = out_type()
        err = getattr(self._lib, name)(ctypes.byref(out), *args)
        return err, out.value or 0

    def cuModuleLoadData(self, image: bytes):
        return self._out("cuModuleLoadData", ctypes.c_void_p, image)

    def cuModuleGetFunction(self, module: int, name: bytes):
        return self._out("cuModuleGetFunction", ctypes.c_void_p, module, name)

    def cuFuncSetAttribute(self, function: int, attribute: int, value: int):
        return (self._lib.cuFuncSetAttribute(function, attribute, value),)

    def cuFuncGetParamInfo(self, function: int, index: int):
        """``(error, offset, size)`` of the kernel's parameter ``index``; error 1 (invalid value) past
        the last one; 500 (not found) where the driver lacks the call."""
        if getattr(self._lib, "cuFuncGetParamInfo", None) is None:
            return 500, 0, 0
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        err = self._lib.cuFuncGetParamInfo(function, index, ctypes.byref(offset), ctypes.byref(size))
        return err, offset.value, size.value

    def cuCtxGetCurrent(self):
        return self._out("cuCtxGetCurrent", ctypes.c_void_p)

    def cuCtxSetCurrent(self, context: int):
        return (self._lib.cuCtxSetCurrent(context),)

    def cuDeviceGet(self, ordinal: int):
        return self._out("cuDeviceGet", ctypes.c_int, ordinal)

    def cuDevicePrimaryCtxRetain(self, device: int):
        return self._out("cuDevicePrimaryCtxRetain", ctypes.c_void_p, device)

    def cuDriverGetVersion(self):
        return self._out("cuDriverGetVersion", ctypes.c_int)

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: int):
        if getattr(self._lib, "cuGetProcAddress_v2", None) is None:
            return 500, 0, 0  # CUDA_ERROR_NOT_FOUND: entry_point takes the exported symbol
        address, status = ctypes.c_void_p(), ctypes.c_int()
        err = self._lib.cuGetProcAddress_v2(symbol, ctypes.byref(address), version, flags, ctypes.byref(status))
        return err, address.value or 0, status.value


@functools.lru_cache(maxsize=None)
def libcuda() -> _LibCuda:
    """The driver calls of loading and context binding (ctypes); RuntimeError without a driver."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return _LibCuda(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
    raise RuntimeError("no CUDA driver library (libcuda) could be loaded")


def check(result, what: str) -> None:
    """Raise RuntimeError naming ``what`` unless ``result`` (a CUresult / nvrtcResult) is success."""
    if int(result) != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


@functools.lru_cache(maxsize=None)
def entry_point(symbol: str = "cuLaunchKernel") -> int:
    """The address of the driver's ``symbol`` (``cuLaunchKernel``, or ``cuLaunchKernelEx`` for
    programmatic dependent launches; legacy default-stream semantics for stream 0, as torch's own
    launches have), found through the driver's ``cuGetProcAddress``; 0 when the driver lacks it."""
    driver = libcuda()
    err, version = driver.cuDriverGetVersion()
    check(err, "cuDriverGetVersion")
    err, address, _ = driver.cuGetProcAddress(symbol.encode(), version, driver.LEGACY_STREAM)
    address = int(address) if int(err) == 0 else 0
    if not address:  # not expected from a working driver; libcuda's exported symbol is the same function
        address = ctypes.cast(getattr(ctypes.CDLL("libcuda.so.1"), symbol, None), ctypes.c_void_p).value or 0
    if not address and symbol == "cuLaunchKernel":
        raise RuntimeError("cuLaunchKernel not found in the CUDA driver")
    return address
