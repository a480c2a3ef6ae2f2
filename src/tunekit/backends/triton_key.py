"""Triton's key of its own install (``triton_key()``), remembered between processes.

Triton keys its disk cache by a SHA-256 of its Python sources and its ~0.5 GB ``libtriton.so``,
computed once per process: 0.27-0.77 s on the H100 and H200 hosts, paid by every fresh process
before its first Triton kernel is found in the cache (a program's first Triton choice, each worker
of an offline tuning run). The key changes only when those files do, so tunekit stores it under a
fingerprint of their metadata (path, size, modification and change times, inode: stat calls,
milliseconds) and, when the fingerprint is known, installs the stored key the way Triton's own
warm-up pool hands the key to its workers (``triton.runtime.cache.triton_key = lambda: key``).

What the fingerprint trusts: a file rewritten in place gets a new modification and change time, a
file replaced (pip, conda, a rebuilt editable install) a new inode. A copy keeps neither its inode
nor its change time (``cp -a`` / ``rsync -a`` / an archive preserve modification times only), so a
different build copied to the same path is hashed again; so is everything after a change of
Triton's version (a stored key must begin with it, as Triton's does). Subpackages reached through
symlinks (Triton's editable installs link ``backends/nvidia`` into its source tree) are followed, as
``pkgutil`` follows them. Only a key that Triton's own function computed is stored.

The stored keys live in tunekit's private cache folder (``backends/cache.py``: ``triton-key``), one
small file per fingerprint, written atomically.
"""

from __future__ import annotations

import importlib.machinery
import os

from . import cache
from .env import SettingError

__all__ = ["fingerprint", "fingerprinted", "installed_key"]

#: what ``triton_key()`` reads, relative to the triton package: the modules of these packages (found as
#: ``pkgutil.walk_packages`` finds them: subfolders that are packages, files with a module's suffix)
#: and these files. Never a whole folder: Triton's ``backends/nvidia`` holds thousands of CUDA
#: headers and binaries, and stat-ing them all took 3.2 s on the H100 host, far more than the hash.
_PACKAGES = ("compiler", "backends", "language")
_FILES = ("__init__.py", os.path.join("runtime", "cache.py"), os.path.join("_C", "libtriton.so"))
_MODULE_SUFFIXES = tuple(sorted({".py", *importlib.machinery.EXTENSION_SUFFIXES}))


def _modules(package: str):
    """The module files of ``package`` and of its subpackages (symlinked ones too), in a stable order."""
    seen = set()
    for base, dirs, files in os.walk(package, followlinks=True):
        real = os.path.realpath(base)
        if real in seen or (base != package and "__init__.py" not in files):  # a loop, or not a package
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        yield from (os.path.join(base, f) for f in sorted(files) if f.endswith(_MODULE_SUFFIXES))


def fingerprinted(root: str) -> list[str]:
    """The files :func:`fingerprint` reads below the triton package folder ``root``."""
    paths = [os.path.join(root, name) for name in _FILES]
    for package in _PACKAGES:
        paths += _modules(os.path.join(root, package))
    return paths


def fingerprint(triton_dir: str | os.PathLike) -> str:
    """A hash of the path, size, modification and change times and inode of every file
    ``triton_key()`` reads (module docstring: what that trusts)."""
    root = os.path.realpath(triton_dir)
    return cache.files_fingerprint(root, fingerprinted(root))


#: stored keys kept (the newest): one per Triton install or build in use on this machine; a file
#: system whose inode numbers change between processes would otherwise add a file per process
KEPT = 8


def installed_key(triton_cache_module) -> str:
    """Triton's key for this process: the stored one where this install's fingerprint is known
    (installed into ``triton_cache_module``, Triton's ``triton.runtime.cache``), else Triton's own
    hash, then stored for the processes after this one (only when Triton's own function, not a
    replacement someone installed, computed it)."""
    original = triton_cache_module.triton_key
    installed = getattr(original, "tunekit_key", None)
    if installed is not None:  # this process installed it already
        return installed
    try:
        name = fingerprint(os.path.dirname(os.path.dirname(triton_cache_module.__file__))) + ".key"
        folder = cache.cache_dir("triton-key")
    except (OSError, SettingError):  # an unreadable install file, or TUNEKIT_CACHE set wrong
        return original()
    key = cache.read_kept(folder, name)
    version = str(getattr(triton_cache_module, "__version__", ""))
    if key is None or not key.startswith(version):
        key = original()
        if hasattr(original, "cache_info"):  # Triton's lru_cache'd function, not a stand-in
            cache.write_kept(folder, name, key, KEPT)
        return key

    def stored_key() -> str:
        return key

    stored_key.tunekit_key = key
    triton_cache_module.triton_key = stored_key
    return key
