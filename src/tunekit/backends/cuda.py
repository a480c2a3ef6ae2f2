"""CUDA C kernels at run time: a compiled module loaded once per device, and launches on
PyTorch's current CUDA stream.

- :class:`CudaKernel`: one ``extern "C" __global__`` function of a ``tunekit/kernels/cuda`` source,
  compiled by :mod:`tunekit.backends.nvrtc` (or read from its cubin cache) and loaded on each device
  it runs on.
- Launching: ``cuLaunchKernel`` on ``torch.cuda``'s current stream (graph capture works; the legacy
  default stream is used only when it is torch's current stream), through the small C extension of
  :mod:`tunekit.backends.fast_launch` (cuda-bindings when it cannot be built), with the kernel's
  device made current when it is not (the driver launches in the current context).
- :meth:`CudaKernel.launch_dependent`: a programmatic dependent launch (sm_90 and later).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading

import torch

from . import fast_launch
from .device import current_device, raw_stream
from .driver import bindings, check
from .nvrtc import arch_of, compile_cubin, source

__all__ = ["CudaKernel", "kernel", "direct_launch", "current_stream"]

_module_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _module(filename: str, options: tuple[str, ...], index: int):
    """The loaded module of ``filename`` on device ``index``: compiled (or read from the cubin cache)
    and loaded once per process, shared by every kernel of the file."""
    driver, _ = bindings()
    with _module_lock, torch.cuda.device(index):
        torch.cuda.init()
        torch.cuda.current_stream(index)  # makes the device's primary context current in this thread
        cubin = compile_cubin(source(filename), filename, arch_of(torch.device("cuda", index)), options)
        err, module = driver.cuModuleLoadData(cubin)
        check(err, f"cuModuleLoadData({filename})")
    return module


class CudaKernel:
    """One ``extern "C" __global__`` function of a source file, loaded on each device it runs on.

    ``launch(device_index, grid, block, *args)`` takes tensors (passed as device pointers) and
    Python ints (passed as 64-bit integers), and enqueues the kernel on the device's current stream.
    """

    def __init__(self, filename: str, name: str, options: tuple[str, ...] = ()):
        self.filename, self.name, self.options = filename, name, options
        self._functions: dict[int, object] = {}
        self._addresses: dict[int, int] = {}  # device index -> CUfunction handle as an int
        self._resident: dict[tuple[int, int], int] = {}  # (device index, block) -> blocks per SM
        self._local = threading.local()
        self._lock = threading.Lock()

    def source_hash(self) -> str:
        return hashlib.sha256((source(self.filename) + repr(self.options)).encode()).hexdigest()[:16]

    def function(self, index: int):
        fn = self._functions.get(index)
        if fn is None:
            with self._lock:
                fn = self._functions.get(index)
                if fn is None:
                    fn = self._functions[index] = self._load(index)
        return fn

    def address(self, index: int) -> int:
        """The CUfunction handle on device ``index`` as an int (loading the module on first use)."""
        fn = self._addresses.get(index)
        if fn is None:
            fn = self._addresses[index] = int(self.function(index))
        return fn

    def resident_blocks(self, index: int, block: int) -> int:
        """How many blocks of ``block`` threads fit on one SM of device ``index`` at once (registers
        and static shared memory as compiled: the driver's occupancy calculator). Persistent grids
        launch that many per SM: one more block per SM would run as a second, mostly idle wave."""
        key = (index, block)
        blocks = self._resident.get(key)
        if blocks is None:
            driver, _ = bindings()
            err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function(index), block, 0)
            check(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
            blocks = self._resident[key] = max(1, int(blocks))
        return blocks

    def _load(self, index: int):
        driver, _ = bindings()
        err, fn = driver.cuModuleGetFunction(_module(self.filename, self.options, index), self.name.encode())
        check(err, f"cuModuleGetFunction({self.name})")
        return fn

    def launch(self, device_index: int, grid: int, block: int, *args) -> None:
        """Tensors go in as device pointers, ints as 64-bit integers, on torch's current stream.

        Host cost matters here (it is most of a small op's time): the C extension of
        :mod:`tunekit.backends.fast_launch` packs the arguments and calls the driver; without it,
        cuda-bindings' ``cuLaunchKernel`` with the packing in Python (~1 us more per call)."""
        if device_index != current_device():  # the driver launches in the current device's context
            with torch.cuda.device(device_index):
                return self.launch(device_index, grid, block, *args)
        fn = self._addresses.get(device_index)
        if fn is None:
            fn = self.address(device_index)
        c_launch = _c_launch or _resolve_c_launch()
        if c_launch is not None:
            c_launch(fn, grid, block, raw_stream(device_index), *args)
            return
        self._launch_with_bindings(device_index, grid, block, args)

    def launch_dependent(self, device_index: int, grid: int, block: int, *args) -> None:
        """:meth:`launch`, but the kernel may start before the stream's previous kernel ends
        (programmatic dependent launch, sm_90 and later): it hides this launch's latency behind that
        kernel's last wave. The kernel must execute ``griddepcontrol.wait`` before it reads anything
        the previous kernel wrote (see logsumexp.cu). Where the device, the driver or the C
        extension cannot, this is a plain launch: the same results, serialized as usual."""
        launch = _dependent_launch(device_index)
        if launch is None:
            self.launch(device_index, grid, block, *args)
            return
        if device_index != current_device():
            with torch.cuda.device(device_index):
                return self.launch_dependent(device_index, grid, block, *args)
        fn = self._addresses.get(device_index)
        if fn is None:
            fn = self.address(device_index)
        launch(fn, grid, block, raw_stream(device_index), *args)

    def _arg_array(self, n: int):
        cached = getattr(self._local, "args", None)
        if cached is None or len(cached[0]) != n:
            holders = [ctypes.c_uint64(0) for _ in range(n)]
            array = (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])
            cached = self._local.args = (holders, array, ctypes.addressof(array))
        return cached

    def _launch_with_bindings(self, device_index: int, grid: int, block: int, args: tuple) -> None:
        fn = self.function(device_index)
        holders, _, address = self._arg_array(len(args))
        for h, a in zip(holders, args):
            h.value = a & 0xFFFFFFFFFFFFFFFF if type(a) is int else a.data_ptr()
        (err,) = _driver_launch()(fn, grid, 1, 1, block, 1, 1, 0, raw_stream(device_index), address, 0)
        if int(err):
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {err!r}")


#: ``launch(function, grid, block, stream, *args)`` of the C extension bound to the driver's entry
#: point; False until first resolved, None when the extension is unavailable
_c_launch = False


def direct_launch():
    """``launch(function, grid, block, stream, *args)`` of the C extension (``function`` from
    :meth:`CudaKernel.address`, ``stream`` a raw handle), or None when it is unavailable: for
    callers that bind everything but the tensors once (the candidates' fast runners)."""
    return _c_launch if _c_launch is not False else _resolve_c_launch()


#: the raw handle of torch's current stream on a device: ``current_stream(index)``
current_stream = raw_stream


def _resolve_c_launch():
    global _c_launch
    module = fast_launch.load()
    _c_launch = None if module is None else functools.partial(module.launch, fast_launch.driver_entry_point())
    return _c_launch


@functools.lru_cache(maxsize=None)
def _dependent_launch(device_index: int):
    """``launch(function, grid, block, stream, *args)`` through cuLaunchKernelEx with programmatic
    stream serialization, or None where it is not worth or not possible: a device before sm_90 (no
    griddepcontrol), a driver without cuLaunchKernelEx, no C extension, or TUNEKIT_PDL=0."""
    if os.environ.get("TUNEKIT_PDL", "1") == "0" or torch.cuda.get_device_capability(device_index) < (9, 0):
        return None
    module = fast_launch.load()
    entry = fast_launch.driver_entry_point("cuLaunchKernelEx") if module is not None else 0
    return functools.partial(module.launch_dependent, entry) if entry else None


@functools.lru_cache(maxsize=None)
def _driver_launch():
    driver, _ = bindings()
    return driver.cuLaunchKernel


@functools.lru_cache(maxsize=None)
def kernel(filename: str, name: str) -> CudaKernel:
    """The shared :class:`CudaKernel` for ``name`` in ``filename``."""
    return CudaKernel(filename, name)
