"""CUDA C candidates: ``.cu`` sources shipped in ``tunekit/kernels/cuda`` compiled at first use with
NVRTC for the running GPU, cached on disk, and launched on PyTorch's current CUDA stream.

- Compilation (no GPU needed, so CI compile-checks every source): NVRTC through ``cuda-bindings``,
  with the fp16/bf16 headers found in the ``nvidia-cuda-runtime`` wheel or a CUDA toolkit. A
  compile error raises :class:`CompileError` carrying NVRTC's log; the candidate using it is
  rejected by tuning and the op carries on.
- The cubin cache (``$TUNEKIT_CACHE`` or ``~/.cache/tunekit/cubin``) is keyed by a hash of the
  source, architecture, options and NVRTC version, and written to a temporary file then renamed,
  so two processes compiling at once never leave a torn file.
- Launching: ``cuLaunchKernel`` on ``torch.cuda``'s current stream (graph capture works; the legacy
  default stream is used only when it is torch's current stream), through the small C extension
  of :mod:`tunekit.backends.fast_launch` (cuda-bindings when it cannot be built).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import re
import tempfile
import threading
from importlib import resources

import torch

__all__ = ["CompileError", "NvrtcUnavailable", "available", "compile_cubin", "source", "include_dirs", "CudaKernel",
           "kernel", "arch_of"]


class NvrtcUnavailable(RuntimeError):
    """cuda-bindings / NVRTC is not installed (``pip install 'tunekit[cuda]'``)."""


class CompileError(RuntimeError):
    def __init__(self, name: str, log: str):
        self.log = log
        super().__init__(f"NVRTC could not compile {name}:\n{log}")


@functools.lru_cache(maxsize=None)
def _bindings():
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:
        raise NvrtcUnavailable(f"CUDA C candidates need cuda-bindings and NVRTC: pip install 'tunekit[cuda]' ({exc})") from None
    return driver, nvrtc


def available() -> str | None:
    """None when NVRTC can be used, else why not."""
    try:
        _bindings()
        nvrtc_version()
    except Exception as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    _, nvrtc = _bindings()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return major, minor


def _check(result, what: str) -> None:
    if int(result) != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """Directories holding cuda_fp16.h / cuda_bf16.h: the pip wheel's first, then a toolkit."""
    found = []
    try:
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13/include", "cu12/include", "cuda_runtime/include"):
                p = pathlib.Path(base) / sub
                if (p / "cuda_fp16.h").exists():
                    found.append(str(p))
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "include"))
    found.append("/usr/local/cuda/include")
    return tuple(p for p in dict.fromkeys(found) if os.path.exists(os.path.join(p, "cuda_fp16.h")))


_LOCAL_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.MULTILINE)


@functools.lru_cache(maxsize=None)
def source(filename: str) -> str:
    """The text of ``tunekit/kernels/cuda/<filename>`` with its local ``#include "x.cuh"`` lines
    replaced by those files' text, each header once (a later include of it is dropped, as an include
    guard would): NVRTC needs no include path for them, and the source hash (the cubin cache key,
    the tuning validators) changes when a shared header does."""
    return _expand(filename, set())


def _expand(filename: str, seen: set[str]) -> str:
    text = resources.files("tunekit.kernels.cuda").joinpath(filename).read_text()

    def inline(m: re.Match) -> str:
        header = m.group(1)
        if header in seen:
            return f"// ---- {header} (included above) ----"
        seen.add(header)
        return f"// ---- {header} ----\n{_expand(header, seen)}"

    return _LOCAL_INCLUDE.sub(inline, text)


def cache_dir() -> pathlib.Path:
    base = os.environ.get("TUNEKIT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "tunekit")
    return pathlib.Path(base) / "cubin"


def compile_cubin(code: str, name: str, arch: str, options: tuple[str, ...] = (), *, use_cache: bool = True) -> bytes:
    """Machine code for ``arch`` (e.g. "sm_90") of the CUDA C source ``code``."""
    opts = (f"--gpu-architecture={arch}", "-std=c++17", *options,
            *(f"-I{d}" for d in include_dirs()))
    key = hashlib.sha256("\0".join((code, arch, *opts, repr(nvrtc_version()))).encode()).hexdigest()[:32]
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    if use_cache:
        try:
            return path.read_bytes()
        except OSError:
            pass
    cubin = _nvrtc_compile(code, name, opts)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(cubin)
            os.replace(tmp, path)  # atomic: readers see the old file, no file, or the whole new one
        except OSError:
            pass  # an unwritable cache only costs a recompilation
    return cubin


def _nvrtc_compile(code: str, name: str, opts: tuple[str, ...]) -> bytes:
    _, nvrtc = _bindings()
    err, prog = nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        if int(result) != 0:
            raise CompileError(name, log.decode(errors="replace").rstrip("\0 \n"))
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def arch_of(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


_module_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _module(filename: str, options: tuple[str, ...], index: int):
    """The loaded module of ``filename`` on device ``index``: compiled (or read from the cubin cache)
    and loaded once per process, shared by every kernel of the file."""
    driver, _ = _bindings()
    with _module_lock, torch.cuda.device(index):
        torch.cuda.init()
        torch.cuda.current_stream(index)  # makes the device's primary context current in this thread
        cubin = compile_cubin(source(filename), filename, arch_of(torch.device("cuda", index)), options)
        err, module = driver.cuModuleLoadData(cubin)
        _check(err, f"cuModuleLoadData({filename})")
    return module


def _stream_of_current(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


#: the current device's index (a private binding, with a public fallback). Launches compare it with
#: the kernel's device: cuLaunchKernel runs in the calling thread's current context, and a kernel
#: of another device's module failed there (CUDA_ERROR_INVALID_HANDLE: a tensor on cuda:1 while
#: cuda:0 is current, as multi-GPU programs have).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

#: the raw handle of torch's current stream on a device (a private binding, with a public fallback)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_of_current


class CudaKernel:
    """One ``extern "C" __global__`` function of a source file, loaded on each device it runs on.

    ``launch(grid, block, *args)`` takes tensors (passed as device pointers) and Python ints
    (passed as 64-bit integers), and enqueues the kernel on the device's current stream.
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
            driver, _ = _bindings()
            err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function(index), block, 0)
            _check(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
            blocks = self._resident[key] = max(1, int(blocks))
        return blocks

    def _load(self, index: int):
        driver, _ = _bindings()
        err, fn = driver.cuModuleGetFunction(_module(self.filename, self.options, index), self.name.encode())
        _check(err, f"cuModuleGetFunction({self.name})")
        return fn

    def _arg_array(self, n: int):
        cached = getattr(self._local, "args", None)
        if cached is None or len(cached[0]) != n:
            holders = [ctypes.c_uint64(0) for _ in range(n)]
            array = (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])
            cached = self._local.args = (holders, array, ctypes.addressof(array))
        return cached

    def launch(self, device_index: int, grid: int, block: int, *args) -> None:
        """Tensors go in as device pointers, ints as 64-bit integers, on torch's current stream.

        Host cost matters here (it is most of a small op's time): the C extension of
        :mod:`tunekit.backends.fast_launch` packs the arguments and calls the driver; without it,
        cuda-bindings' ``cuLaunchKernel`` with the packing in Python (~1 us more per call on an
        H200 host)."""
        if device_index != _current_device():  # the driver launches in the current device's context
            with torch.cuda.device(device_index):
                return self.launch(device_index, grid, block, *args)
        fn = self._addresses.get(device_index)
        if fn is None:
            fn = self.address(device_index)
        c_launch = _c_launch or _resolve_c_launch()
        if c_launch is not None:
            c_launch(fn, grid, block, _raw_stream(device_index), *args)
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
        if device_index != _current_device():
            with torch.cuda.device(device_index):
                return self.launch_dependent(device_index, grid, block, *args)
        fn = self._addresses.get(device_index)
        if fn is None:
            fn = self.address(device_index)
        launch(fn, grid, block, _raw_stream(device_index), *args)

    def _launch_with_bindings(self, device_index: int, grid: int, block: int, args: tuple) -> None:
        fn = self.function(device_index)
        args_cache = self._local.__dict__.get("args")
        if args_cache is None or len(args_cache[0]) != len(args):
            args_cache = self._arg_array(len(args))
        holders, _, address = args_cache
        for h, a in zip(holders, args):
            h.value = a & 0xFFFFFFFFFFFFFFFF if type(a) is int else a.data_ptr()
        (err,) = _driver_launch()(fn, grid, 1, 1, block, 1, 1, 0, _raw_stream(device_index), address, 0)
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
current_stream = _raw_stream


def _resolve_c_launch():
    global _c_launch
    from . import fast_launch

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
    from . import fast_launch

    module = fast_launch.load()
    entry = fast_launch.driver_entry_point("cuLaunchKernelEx") if module is not None else 0
    return functools.partial(module.launch_dependent, entry) if entry else None


@functools.lru_cache(maxsize=None)
def _driver_launch():
    driver, _ = _bindings()
    return driver.cuLaunchKernel


@functools.lru_cache(maxsize=None)
def kernel(filename: str, name: str) -> CudaKernel:
    """The shared :class:`CudaKernel` for ``name`` in ``filename``."""
    return CudaKernel(filename, name)
