"""CUDA C sources compiled with NVRTC: the ``.cu`` files of ``tunekit/kernels/cuda`` turned into
machine code for the running GPU's architecture, cached on disk.

- No GPU is needed, so CI compile-checks every source. NVRTC comes through ``cuda-bindings``, and
  the fp16/bf16 headers from the ``nvidia-cuda-runtime`` wheel or a CUDA toolkit. A compile error
  raises :class:`CompileError` carrying NVRTC's log; the candidate using it is rejected by tuning
  and the op carries on.
- The cubin cache (:func:`tunekit.backends.cache.cache_dir`) is keyed by a hash of the source,
  architecture, options, NVRTC version and fp16/bf16 headers' text, and written to a temporary file then renamed, so two
  processes compiling at once never leave a torn file. It is used only while private
  (:mod:`tunekit.backends.cache`); a cached file that is not private or not an ELF image is compiled
  again, and one that fails to load is replaced (``refresh=True``, from :mod:`tunekit.backends.cuda`).
  On a miss, a cubin shipped with the package under the same name is used
  (:mod:`tunekit.backends.shipped_kernels`: the builds of the shipped pre-tuned choices).
- A kernel can also be compiled alone (:mod:`tunekit.backends.kernel_units` builds its translation
  unit): a fraction of a second where a whole file takes seconds.
- Local ``#include "x.cuh"`` lines are inlined (:func:`source`), so NVRTC needs no include path for
  them and the source hash changes when a shared header does. Every header also has
  ``#pragma once``, so the same files compile with plain ``nvcc`` too.

Loading and launching the compiled kernels is :mod:`tunekit.backends.cuda`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pathlib
import re
import tempfile
import threading
from collections.abc import Callable
from importlib import resources

import torch

from .. import _version
from ..tunable.installed import installed_version
from ..tunable.preparations import NeedsCompiler, compilers_allowed
from .cache import (UntrustedCache, cache_dir, entry_problem, files_fingerprint, private_dir, read_kept, warn_once,
                    write_kept)
from .env import SettingError
from .driver import NvrtcUnavailable, bindings, check
from .shipped_kernels import shipped_cubin

__all__ = ["CompileError", "NvrtcUnavailable", "available", "compile_cubin", "source", "include_dirs", "arch_of",
           "nvrtc_version", "cubin_dir", "cubin_name", "headers_digest"]


class CompileError(RuntimeError):
    def __init__(self, name: str, log: str):
        self.log = log
        super().__init__(f"NVRTC could not compile {name}:\n{log}")


def available() -> str | None:
    """None when NVRTC can be used, else why not. Where NVRTC comes from a pip wheel and cuda-bindings
    is installed, that is the answer, read from their metadata without loading them: loading them
    (cuda-bindings' import) took 66-92 ms of a shipped stand-in's preparation on the H100, for kernels
    whose cubins ship and need no compiler (a compile that then fails raises, as any compile error
    does, and tuning rejects the candidate with it)."""
    if _installed():
        return None
    try:
        bindings()
        nvrtc_version()
    except Exception as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def _installed() -> bool:
    """An NVRTC wheel and cuda-bindings are installed (their metadata only: nothing loaded)."""
    try:
        if importlib.util.find_spec("cuda.bindings") is None:
            return False
    except (ImportError, ValueError):
        return False
    return _wheel_release() is not None


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    _, nvrtc = bindings()
    err, major, minor = nvrtc.nvrtcVersion()
    check(err, "nvrtcVersion")
    return major, minor


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
    replaced by those files' text, each header once (a later include of it is dropped, as its
    ``#pragma once`` would): NVRTC needs no include path for them, and the source hash (the cubin
    cache key, the tuning validators) changes when a shared header does."""
    return _expand(filename, set())


_PRAGMA_ONCE = re.compile(r"^#pragma once[ \t]*\n", re.MULTILINE)


def _expand(filename: str, seen: set[str]) -> str:
    text = resources.files("tunekit.kernels.cuda").joinpath(filename).read_text()
    if seen:  # an inlined header: its guard is this function's job in one translation unit
        text = _PRAGMA_ONCE.sub("", text)

    def inline(m: re.Match) -> str:
        header = m.group(1)
        if header in seen:
            return f"// ---- {header} (included above) ----"
        seen.add(header)
        return f"// ---- {header} ----\n{_expand(header, seen)}"

    return _LOCAL_INCLUDE.sub(inline, text)


def cubin_dir() -> pathlib.Path:
    return cache_dir("cubin")


_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(key, threading.Lock())


def compile_cubin(code: str | Callable[[], str], name: str, arch: str, options: tuple[str, ...] = (), *,
                  identity: str | None = None, use_cache: bool = True, refresh: bool = False) -> bytes:
    """Machine code for ``arch`` (e.g. "sm_90") of the CUDA C source ``code``; ``name`` names it in
    errors and in the cache. ``code`` may be a function that makes the source, called only to
    compile, with ``identity`` (text that determines the source) naming the cache entry in its place:
    a kernel's own unit takes 60 ms of preprocessing to make, which a cache hit then skips.
    ``refresh`` compiles again and replaces the cached file (one that would not load). Threads asking
    for the same cubin at once compile it once. Inside ``preparations.builds_only()`` a cubin neither
    cached nor shipped raises NeedsCompiler instead of compiling."""
    if callable(code) and identity is None:
        raise TypeError("compile_cubin: a source made on demand needs an identity")
    opts = (f"--gpu-architecture={arch}", "-std=c++17", *options)
    filename = cubin_name(code if identity is None else identity, name, arch, options)
    folder = _usable_cache() if use_cache else None
    path = None if folder is None else folder / filename
    with _lock(filename):
        cubin = None if path is None or refresh else _read(path)
        if cubin is None and use_cache and not refresh:
            cubin = shipped_cubin(filename)
        if cubin is None:
            if not compilers_allowed():  # a stand-in loads kept builds only: NVRTC would take 0.1-0.4 s
                raise NeedsCompiler(f"{name}: no cached or shipped cubin for {arch}")
            text = code() if callable(code) else code
            cubin = _nvrtc_compile(text, name, (*opts, *(f"-I{d}" for d in include_dirs())))
            if path is not None:
                _write(path, cubin)
    return cubin


#: the pip wheels NVRTC comes in (cuda-bindings finds them before a toolkit)
_NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")


@functools.lru_cache(maxsize=None)
def nvrtc_release() -> str:
    """Which NVRTC compiles here, for cubin names: the pip wheel's release when NVRTC comes from one
    (read from its metadata, without loading cuda-bindings and NVRTC: 100 ms of a process's first
    call on the H100, where a cached or shipped cubin needs neither), else NVRTC's own version. It
    assumes cuda-bindings loads the wheel's NVRTC when one is installed (as it does, before a
    toolkit's): where it loads another, a changed NVRTC keeps the names, and cubins of the other
    compiler are used (valid code for the architecture; one that does not load is compiled again)."""
    return _wheel_release() or "nvrtc " + ".".join(map(str, nvrtc_version()))


def _wheel_release() -> str | None:
    """The NVRTC wheel's name and version, or None when NVRTC does not come from one."""
    for wheel in _NVRTC_WHEELS:
        version = installed_version(wheel)
        if version is not None:
            return f"{wheel} {version}"
    return None


def cubin_name(code: str, name: str, arch: str, options: tuple[str, ...] = ()) -> str:
    """The cache file name of a cubin: ``name``, ``arch`` and a hash of everything NVRTC's output
    depends on (source, architecture, options, NVRTC release, the fp16/bf16 headers' text), and not
    of where things are installed, so the same build has the same name on every machine."""
    opts = (f"--gpu-architecture={arch}", "-std=c++17", *options)
    key = hashlib.sha256("\0".join((code, arch, *opts, nvrtc_release(), headers_digest())).encode()).hexdigest()[:32]
    return f"{_SAFE.sub('_', name)}-{arch}-{key}.cubin"


@functools.lru_cache(maxsize=None)
def headers_digest() -> str:
    """A hash of the fp16/bf16 headers NVRTC will include (the first folder of
    :func:`include_dirs`): part of the cubin key in place of the folder's path, so the same headers
    give the same key on every machine (shipped cubins, :mod:`tunekit.backends.shipped_kernels`).
    Kept in the cache folder under a fingerprint of the headers' metadata (``cache.files_fingerprint``:
    rewritten or replaced, they are hashed again) and tunekit's version (a release may digest them another
    way); a kept text that is not a digest is computed again. Reading and hashing their ~0.7 MB took 0.70 ms of a
    process's first CUDA C choice on the H100 host, kept 0.10 ms."""
    folder = include_dirs()[0] if include_dirs() else ""
    headers = [os.path.join(folder, h) for h in _HEADERS if folder and os.path.isfile(os.path.join(folder, h))]
    try:
        name = f"{files_fingerprint(folder, headers)}-{_version.__version__}.digest"
        kept = cache_dir("headers-digest")
    except (OSError, SettingError):
        return _headers_digest(folder)
    digest = read_kept(kept, name)
    if digest is None or not _DIGEST.fullmatch(digest):
        digest = _headers_digest(folder)
        write_kept(kept, name, digest, keep=4)
    return digest


_DIGEST = re.compile(r"[0-9a-f]{16}")


_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp")


def _headers_digest(folder: str) -> str:
    digest = hashlib.sha256()
    for header in _HEADERS:
        p = pathlib.Path(folder) / header if folder else None
        digest.update(header.encode() + b"\0" + (p.read_bytes() if p is not None and p.is_file() else b"-"))
    return digest.hexdigest()[:16]


_SAFE = re.compile(r"[^\w.+-]")


def _usable_cache() -> pathlib.Path | None:
    """The cubin folder, created private; None (warned once) when others could write it."""
    folder = cubin_dir()
    try:
        return private_dir(folder)
    except UntrustedCache as exc:
        warn_once(f"cubin:{folder}", f"tunekit: compiling CUDA C without the cubin cache ({exc})")
    except OSError:  # an unwritable location only costs recompilation
        pass
    return None


def _read(path: pathlib.Path) -> bytes | None:
    """The cached cubin at ``path`` if it is there, private and an ELF image, else None."""
    try:
        with open(path, "rb") as f:
            if entry_problem(os.fstat(f.fileno()), path):
                return None  # replaced by the compile that follows (the folder is ours)
            cubin = f.read()
    except OSError:
        return None
    return cubin if cubin[:4] == b"\x7fELF" else None


def _write(path: pathlib.Path, cubin: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")  # mode 0o600
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: readers see the old file, no file, or the whole new one
    except OSError:
        pass  # an unwritable cache only costs a recompilation


def _nvrtc_compile(code: str, name: str, opts: tuple[str, ...]) -> bytes:
    _, nvrtc = bindings()
    err, prog = nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], [])
    check(err, "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        # NVRTC writes into the buffers it is given: fresh bytearrays, never bytes (b" " * 1 is
        # the interpreter's shared one-byte object, and writing into it changes b" " everywhere)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        if int(result) != 0:
            raise CompileError(name, log.decode(errors="replace").rstrip("\0 \n"))
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        check(err, "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        check(err, "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def arch_of(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"
