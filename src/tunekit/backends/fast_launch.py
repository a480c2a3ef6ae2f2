"""The host side of a kernel launch, kept short: a ~60-line CPython extension (``fast_launch.c``)
that packs the arguments and calls the driver's ``cuLaunchKernel`` directly, and a C++ extension
(``fast_elementwise.cpp``, pybind11 + ATen) that runs a CUDA C elementwise candidate whole:
allocate the output with ``at::empty_like``, launch.

Why: on a cached signature most of a small op's time is host time, and the issue's bar is torch's
own ``F.silu`` (~5 us per call on an H200 host). Measured there (benchmarks/launch_overhead.py):
the driver call through cuda-bindings costs ~2.8-3.0 us with everything pre-built and ~3.65 us with
the argument packing done in Python; a ctypes call was slower still (3.4 us); the C extension's
call costs 2.5 us, ~0.2 us over the driver's own floor. ``torch.empty_like`` from Python adds
1.1-1.4 us, most of it Python argument parsing and wrapping that the C++ run skips.

Both are compiled at first use, the way Triton builds its launcher: the system compiler (``$CC`` /
``$CXX``, else cc / gcc / clang, c++ / g++ / clang++) with Python's headers (and, for the C++ one,
the installed torch's headers and libraries), into the cache next to the cubins, keyed by the
source, the Python ABI, the compiler, its flags and the torch version, written to a temporary name
and renamed, so concurrent first uses never see a torn file. The C one builds in ~0.2 s, the C++
one in ~10 s. Nothing here needs CUDA headers or a GPU, so CI builds and tests both (through a
stand-in entry point with cuLaunchKernel's signature).

If one cannot be built (no compiler, no headers) or ``TUNEKIT_FAST_LAUNCH=0``, its ``load``
returns None, ``unavailable`` says why, and the candidates fall back: allocation in Python, launch
through the C extension, else through cuda-bindings. Slower on the host, the same on the device.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from importlib import resources

from . import nvrtc

__all__ = ["load", "unavailable", "build", "build_elementwise", "load_elementwise", "elementwise_unavailable",
           "driver_entry_point"]

_MODULE = "tunekit_fast_launch"
_ELEMENTWISE = "tunekit_fast_elementwise"


def _find(env: str, names: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _compiler() -> str | None:
    return _find("CC", ("cc", "gcc", "clang"))


def _cxx_compiler() -> str | None:
    return _find("CXX", ("c++", "g++", "clang++"))


def _build(filename: str, module: str, compiler: str | None, flags: list[str], key_parts: tuple[str, ...],
           directory) -> str:
    """Compile ``tunekit/backends/<filename>`` into ``<module>-<key><ext suffix>`` (or find it built)."""
    code = resources.files("tunekit.backends").joinpath(filename).read_text()
    if compiler is None:
        raise RuntimeError("no C/C++ compiler found (set CC / CXX)")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join((code, suffix, compiler, *flags, *key_parts)).encode()).hexdigest()[:16]
    base = os.fspath(directory) if directory is not None else os.fspath(nvrtc.cache_dir().parent / "launch")
    path = os.path.join(base, f"{module}-{key}{suffix}")
    if os.path.exists(path):
        return path
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = os.path.join(tmp, filename)
        with open(src, "w") as f:
            f.write(code)
        out = os.path.join(tmp, os.path.basename(path))
        cmd = [*compiler.split(), src, "-o", out, *flags]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise RuntimeError(f"cannot run the compiler {compiler!r}: {exc}") from None
        if run.returncode != 0:
            raise RuntimeError(f"compiling {filename} failed ({' '.join(cmd)}):\n{run.stderr.strip()[-4000:]}")
        os.replace(out, path)  # atomic: a concurrent builder's identical file or ours, never a torn one
    return path


def _python_include() -> str:
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python headers not found in {include}")
    return include


def build(directory: str | os.PathLike | None = None) -> str:
    """Compile the C launch extension (or find it already built); return the shared library's path.
    Raises RuntimeError with the compiler's output when it cannot be built."""
    flags = ["-O2", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{_python_include()}"]
    return _build("fast_launch.c", _MODULE, _compiler(), flags, (), directory)


def build_elementwise(directory: str | os.PathLike | None = None, std: str = "c++17") -> str:
    """Compile the C++ run of the CUDA C elementwise candidates (``fast_elementwise.cpp``) against
    the installed torch's headers and libraries (no CUDA headers: the stream and the driver entry
    point come from Python). About 10 s once; cached like the C extension."""
    import torch
    from torch.utils import cpp_extension

    libdir = cpp_extension.library_paths()[0]
    flags = [f"-std={std}", "-O2", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-DTORCH_EXTENSION_NAME={_ELEMENTWISE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
             *(f"-I{d}" for d in cpp_extension.include_paths()), f"-I{_python_include()}",
             f"-L{libdir}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{libdir}"]
    return _build("fast_elementwise.cpp", _ELEMENTWISE, _cxx_compiler(), flags, (torch.__version__,), directory)


def _import(path: str, name: str = _MODULE):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _load():
    if os.environ.get("TUNEKIT_FAST_LAUNCH", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by TUNEKIT_FAST_LAUNCH=0"
    try:
        return _import(build()), None
    except Exception as exc:  # no compiler or headers: the cuda-bindings launch still works
        return None, str(exc)


def load():
    """The built extension module (its ``launch`` function), or None (see :func:`unavailable`)."""
    return _load()[0]


@functools.lru_cache(maxsize=None)
def _load_elementwise():
    if os.environ.get("TUNEKIT_FAST_LAUNCH", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by TUNEKIT_FAST_LAUNCH=0"
    errors = []
    for std in ("c++17", "c++20"):  # newer torch headers may need C++20
        try:
            return _import(build_elementwise(std=std), _ELEMENTWISE), None
        except Exception as exc:
            errors.append(f"-std={std}: {exc}")
    return None, "; ".join(errors)


def load_elementwise():
    """The built C++ elementwise run (``unary`` / ``binary``), or None (see
    :func:`elementwise_unavailable`): the candidates then allocate in Python and launch through
    :func:`load`'s ``launch``."""
    return _load_elementwise()[0]


def elementwise_unavailable() -> str | None:
    return _load_elementwise()[1]


def unavailable() -> str | None:
    """None when the extension is in use, else why not."""
    return _load()[1]


@functools.lru_cache(maxsize=None)
def driver_entry_point() -> int:
    """The address of the driver's ``cuLaunchKernel`` (legacy default-stream semantics for stream
    0, as torch's own launches have), found through the driver's ``cuGetProcAddress``."""
    driver, _ = nvrtc._bindings()
    err, version = driver.cuDriverGetVersion()
    nvrtc._check(err, "cuDriverGetVersion")
    legacy = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    err, address, _ = driver.cuGetProcAddress(b"cuLaunchKernel", version, legacy)
    nvrtc._check(err, "cuGetProcAddress(cuLaunchKernel)")
    address = int(address)
    if not address:  # not expected from a working driver; libcuda's exported symbol is the same function
        address = ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernel, ctypes.c_void_p).value or 0
    if not address:
        raise RuntimeError("cuLaunchKernel not found in the CUDA driver")
    return address
