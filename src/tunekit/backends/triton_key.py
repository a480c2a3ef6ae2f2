"""Triton's key of its own install (``triton_key()``), remembered between processes.

Triton keys its disk cache by a SHA-256 of its Python sources and its ~0.5 GB ``libtriton.so``,
computed once per process: 0.27-0.49 s on the H100 and H200 hosts, paid by every fresh process
before its first Triton kernel is found in the cache (a program's first Triton choice, each worker
of an offline tuning run). The key changes only when those files do, so tunekit stores it under a
fingerprint of their paths, sizes and modification times (stat calls: milliseconds) and, when the
fingerprint is known, installs the stored key the way Triton's own warm-up pool hands the key to
its workers (``triton.runtime.cache.triton_key = lambda: key``). An install changed in place keeps
neither size nor modification time of the files it rewrote: its fingerprint is new, and the key is
hashed again (as ccache's direct mode or make trust modification times).

The stored keys live in tunekit's private cache folder (``backends/cache.py``: ``triton-key``), one
small file per fingerprint, written atomically.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import pathlib
import tempfile

from . import cache
from .env import SettingError

__all__ = ["fingerprint", "installed_key"]

#: what ``triton_key()`` reads, relative to the triton package: the modules of these packages (found as
#: ``pkgutil.walk_packages`` finds them: subfolders that are packages, files with a module's suffix)
#: and these files. Never a whole folder: Triton's ``backends/nvidia`` holds thousands of CUDA
#: headers and binaries, and stat-ing them all took 3.2 s on the H100 host, far more than the hash.
_PACKAGES = ("compiler", "backends", "language")
_FILES = ("__init__.py", os.path.join("runtime", "cache.py"), os.path.join("_C", "libtriton.so"))
_MODULE_SUFFIXES = tuple(sorted({".py", *importlib.machinery.EXTENSION_SUFFIXES}))


def _modules(package: str):
    """The module files of ``package`` and of its subpackages, in a stable order."""
    for base, dirs, files in os.walk(package):
        if base != package and "__init__.py" not in files:  # not a package: pkgutil does not enter it
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        yield from (os.path.join(base, f) for f in sorted(files) if f.endswith(_MODULE_SUFFIXES))


def fingerprint(triton_dir: str | os.PathLike) -> str:
    """A hash of the path, size and modification time of every file ``triton_key()`` reads."""
    root = os.path.realpath(triton_dir)
    h = hashlib.sha256(root.encode())
    paths = [os.path.join(root, name) for name in _FILES]
    for package in _PACKAGES:
        paths += _modules(os.path.join(root, package))
    for path in paths:
        st = os.stat(path)
        h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _stored(folder: pathlib.Path, name: str) -> str | None:
    """The key stored under ``name``, or None (none, or a file that others could have written)."""
    try:
        with open(folder / name) as f:
            if cache.entry_problem(os.fstat(f.fileno()), folder / name) or cache.folder_problem(folder):
                return None
            return f.read().strip() or None
    except OSError:
        return None


def _store(folder: pathlib.Path, name: str, key: str) -> None:
    try:
        folder = cache.private_dir(folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, prefix=".tmp-") as f:
            f.write(key)
        os.replace(f.name, folder / name)
    except (OSError, cache.UntrustedCache):  # not stored: the next process hashes again
        pass


def installed_key(triton_cache_module) -> str:
    """Triton's key for this process: the stored one where this install's fingerprint is known
    (installed into ``triton_cache_module``, Triton's ``triton.runtime.cache``), else Triton's own
    hash, then stored for the processes after this one."""
    original = triton_cache_module.triton_key
    installed = getattr(original, "tunekit_key", None)
    if installed is not None:  # this process installed it already
        return installed
    try:
        name = fingerprint(os.path.dirname(os.path.dirname(triton_cache_module.__file__))) + ".key"
        folder = cache.cache_dir("triton-key")
    except (OSError, SettingError):  # an unreadable install file, or TUNEKIT_CACHE set wrong
        return original()
    key = _stored(folder, name)
    if key is None:
        key = original()
        _store(folder, name, key)
        return key

    def stored_key() -> str:
        return key

    stored_key.tunekit_key = key
    triton_cache_module.triton_key = stored_key
    return key
