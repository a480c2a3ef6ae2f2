"""The host side of a kernel launch, kept short: a ~60-line CPython extension (``fast_launch.c``)
that packs the arguments and calls the driver's ``cuLaunchKernel`` directly.

Why: on a cached signature most of a small op's time is host time, and the issue's bar is torch's
own ``F.silu`` (~5 us per call on an H200 host). Measured there (benchmarks/launch_overhead.py):
the driver call through cuda-bindings costs ~2.8-3.0 us with everything pre-built and ~3.8 us with
the argument packing done in Python; a ctypes call was slower still (3.3 us). A METH_FASTCALL C
function leaves only the driver's own cost.

The extension is compiled at first use, the way Triton builds its launcher: the system C compiler
(``$CC``, else ``cc`` / ``gcc`` / ``clang``) and Python's headers, into the cache next to the cubins
(keyed by the source, the Python ABI and the compiler), written to a temporary name and renamed, so
concurrent first uses never see a torn file. Nothing here needs CUDA headers or a GPU, so CI builds
and tests it (through a stand-in entry point with cuLaunchKernel's signature).

If it cannot be built (no compiler, no Python headers) or ``TUNEKIT_FAST_LAUNCH=0``, :func:`load`
returns None, :func:`unavailable` says why, and kernels launch through cuda-bindings instead:
slower on the host, the same on the device.
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

__all__ = ["load", "unavailable", "build", "driver_entry_point"]

_MODULE = "tunekit_fast_launch"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return cc
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def build(directory: str | os.PathLike | None = None) -> str:
    """Compile the extension (or find it already built); return the shared library's path.
    Raises RuntimeError with the compiler's output when it cannot be built."""
    code = resources.files("tunekit.backends").joinpath("fast_launch.c").read_text()
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python headers not found in {include}")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join((code, suffix, include, cc)).encode()).hexdigest()[:16]
    base = os.fspath(directory) if directory is not None else os.fspath(nvrtc.cache_dir().parent / "launch")
    path = os.path.join(base, f"{_MODULE}-{key}{suffix}")
    if os.path.exists(path):
        return path
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = os.path.join(tmp, "fast_launch.c")
        with open(src, "w") as f:
            f.write(code)
        out = os.path.join(tmp, os.path.basename(path))
        cmd = [*cc.split(), "-O2", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{include}", src, "-o", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"compiling the launch extension failed ({' '.join(cmd)}):\n{run.stderr.strip()}")
        os.replace(out, path)  # atomic: a concurrent builder's identical file or ours, never a torn one
    return path


def _import(path: str):
    loader = importlib.machinery.ExtensionFileLoader(_MODULE, path)
    spec = importlib.util.spec_from_file_location(_MODULE, path, loader=loader)
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
