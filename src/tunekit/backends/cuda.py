"""CUDA C kernels at run time: a compiled module loaded once per device, and launches on
PyTorch's current CUDA stream.

- :class:`CudaKernel`: one ``extern "C" __global__`` function of a ``tunekit/kernels/cuda`` source,
  compiled by :mod:`tunekit.backends.nvrtc` (or read from its cubin cache) and loaded on each device
  it runs on.
- Compiling: each kernel alone by default (its own translation unit, :mod:`tunekit.backends.kernel_units`),
  or its whole file (:func:`compile_whole_files`); one load per (unit, device) in the process, safe
  from any thread (a worker thread may load kernels while others launch).
- Launching: ``cuLaunchKernel`` on ``torch.cuda``'s current stream (graph capture works; the legacy
  default stream is used only when it is torch's current stream), through the small C extension of
  :mod:`tunekit.backends.fast_launch` (cuda-bindings when it cannot be built), with the kernel's
  device made current when it is not (the driver launches in the current context), from any thread
  (:mod:`tunekit.backends.thread_context`).
- :meth:`CudaKernel.launch_dependent`: a programmatic dependent launch (sm_90 and later).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading

import torch

from . import fast_launch, kernel_units, thread_context
from .device import current_device, raw_stream
from .driver import bindings, check, libcuda
from .env import switch
from .nvrtc import arch_of, compile_cubin, source

__all__ = ["CudaKernel", "kernel", "direct_launch", "current_stream", "compile_whole_files"]

#: compile every kernel's whole file (one NVRTC run per file), not each kernel alone: for a process
#: that will use most kernels of a file (offline tuning of every candidate), one longer compile
_whole_files = False


def compile_whole_files(enabled: bool = True) -> bool:
    """Whether kernels loaded from now on compile their whole ``.cu`` file (True) or only their own
    translation unit (False, the default: a fraction of a second each, see
    :mod:`tunekit.backends.kernel_units`); the previous setting. A file already loaded whole on a
    device serves all its kernels there either way."""
    global _whole_files
    previous, _whole_files = _whole_files, bool(enabled)
    return previous


class _Once:
    """A value per key made by ``make(*key)`` once, however many threads ask at the same time (a
    lock per key: a load of one kernel never waits for another's compile). Failures are not kept."""

    def __init__(self, make):
        self._make = make
        self._values: dict = {}
        self._locks: dict = {}
        self._lock = threading.Lock()

    def get(self, *key):
        return self._values.get(key)

    def __call__(self, *key):
        value = self._values.get(key)
        if value is not None:
            return value
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            value = self._values.get(key)
            if value is None:
                value = self._values[key] = self._make(*key)
        return value


def _prepare(index: int) -> str:
    """Make device ``index`` usable by the driver in this thread (torch initialised, its primary
    context current); its architecture. Called inside ``torch.cuda.device(index)``."""
    torch.cuda.init()
    thread_context.bind(index)
    return arch_of(torch.device("cuda", index))


def _load_module(filename: str, options: tuple[str, ...], index: int, kernel_name: str | None):
    """The loaded module of ``kernel_name``'s translation unit (None: the whole file) on device
    ``index``: compiled, or read from the cubin cache (recompiled once when that copy does not load).
    A kernel the file's per-kernel section does not define gets the whole file's module (whose load
    names a kernel that is missing altogether)."""
    driver = libcuda()
    if kernel_name is None:
        code, identity, name = source(filename), None, filename
    else:
        code, name = functools.partial(kernel_units.kernel_source, filename, kernel_name), f"{filename}:{kernel_name}"
        identity = kernel_units.unit_identity(filename, kernel_name)
    with torch.cuda.device(index):
        arch = _prepare(index)
        try:
            image = compile_cubin(code, name, arch, options, identity=identity)
        except kernel_units.UnitError:
            if kernel_name in (kernel_units.definitions(filename) or ()):
                raise
            return _modules(filename, options, index, None)
        with thread_context.capture_relaxed():  # a user's graph capture neither refuses it nor breaks
            err, module = driver.cuModuleLoadData(image)
        if int(err):  # a corrupt or truncated cached cubin
            image = compile_cubin(code, name, arch, options, identity=identity, refresh=True)
            with thread_context.capture_relaxed():
                err, module = driver.cuModuleLoadData(image)
        check(err, f"cuModuleLoadData({name})")
    return module


#: loaded modules: (filename, options, device index, kernel name or None for the whole file)
_modules = _Once(_load_module)


def _module(filename: str, options: tuple[str, ...], index: int, kernel_name: str | None = None):
    """The module holding ``kernel_name`` of ``filename`` on device ``index``: the whole file's when
    it is loaded there already or whole files are asked for, else the kernel's own (or the whole
    file's, when its per-kernel section lacks the kernel: :func:`_load_module`)."""
    if kernel_name is not None:
        whole = _modules.get(filename, options, index, None)
        if whole is not None:
            return whole
        if _whole_files:
            kernel_name = None
    return _modules(filename, options, index, kernel_name)


@functools.lru_cache(maxsize=None)
def _source_digest(filename: str, options: tuple[str, ...]) -> str:
    """One file's hash per process: an op's first call hashes every candidate, and dozens of kernels
    share a file (logsumexp's 46 forward kernels: 46 SHA-256s of the same text before)."""
    return hashlib.sha256((source(filename) + repr(options)).encode()).hexdigest()[:16]


class CudaKernel:
    """One ``extern "C" __global__`` function of a source file, loaded on each device it runs on.

    ``launch(device_index, grid, block, *args)`` takes tensors (passed as device pointers) and
    Python ints (passed as 64-bit integers), and enqueues the kernel on the device's current stream.
    Loading (:meth:`function`, :meth:`address`) compiles the kernel's own translation unit (or the
    whole file: :func:`compile_whole_files`) once per process, whichever threads ask at once; any
    thread may load or launch, its first driver call binding the device's primary context.
    """

    def __init__(self, filename: str, name: str, options: tuple[str, ...] = ()):
        self.filename, self.name, self.options = filename, name, options
        self._functions: dict[int, int] = {}  # device index -> CUfunction handle
        self._addresses: dict[int, int] = {}  # device index -> CUfunction handle as an int
        self._resident: dict[tuple[int, int], int] = {}  # (device index, block) -> blocks per SM
        self._local = threading.local()
        self._lock = threading.Lock()

    def source_hash(self) -> str:
        """The whole file's (and the options'): what tuning results of this kernel depend on."""
        return _source_digest(self.filename, self.options)

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
            fn = driver.CUfunction(self.address(index))
            with torch.cuda.device(index):
                thread_context.bind(index)
                err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block, 0)
            check(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
            blocks = self._resident[key] = max(1, int(blocks))
        return blocks

    def _load(self, index: int) -> int:
        driver = libcuda()
        err, fn = driver.cuModuleGetFunction(_module(self.filename, self.options, index, self.name), self.name.encode())
        check(err, f"cuModuleGetFunction({self.name})")
        return fn

    def launch(self, device_index: int, grid: int, block: int, *args) -> None:
        """Tensors go in as device pointers, ints as 64-bit integers, on torch's current stream.

        Host cost matters here (it is most of a small op's time): the C extension of
        :mod:`tunekit.backends.fast_launch` packs the arguments and calls the driver; without it,
        cuda-bindings' ``cuLaunchKernel`` with the packing in Python (~1 us more per call). A thread
        with no current context (its first CUDA work is this launch) gets the device's primary
        context bound when the driver refuses the launch, and the launch is retried once
        (:mod:`tunekit.backends.thread_context`): nothing is checked on the common path."""
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
        fn = bindings()[0].CUfunction(self.address(device_index))
        holders, _, address = self._arg_array(len(args))
        for h, a in zip(holders, args):
            h.value = a & 0xFFFFFFFFFFFFFFFF if type(a) is int else a.data_ptr()
        (err,) = _driver_launch()(fn, grid, 1, 1, block, 1, 1, 0, raw_stream(device_index), address, 0)
        if int(err) and thread_context.launch_hook():  # no context was current in this thread: now one is
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
    griddepcontrol), a driver without cuLaunchKernelEx, no C extension, or TUNEKIT_PDL off (read
    here, at a device's first dependent launch: a value it cannot read raises SettingError)."""
    if not switch("TUNEKIT_PDL") or torch.cuda.get_device_capability(device_index) < (9, 0):
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
