"""Compiled kernels shipped with the package: what compiling the shipped pre-tuned choices produced.

Shipped pre-tuned results (:mod:`tunekit.tunable.shipped`) give a process's first call the tuned
choice, but a choice that must be compiled still cost its compile with an empty cache: 0.1-0.4 s of
NVRTC for a CUDA C kernel, 0.2-1.7 s of Triton (H100), a tenth to a half of a program that calls a
20 us op 10,000 times. So ``benchmarks/pretune.py`` also ships, per GPU model, the build outputs of
the chosen candidates: ``tunekit/pretuned/<GPU model>.kernels.zip`` holding

- ``cubin/<name>-<arch>-<key>.cubin``: NVRTC output under its cubin-cache name
  (:mod:`tunekit.backends.nvrtc`), whose key hashes the source, architecture, options, NVRTC release
  and the fp16/bf16 headers' text: a shipped cubin is used exactly where NVRTC would make the same one;
- ``triton/<folder>/<kernel>.json`` and ``.cubin``: Triton cache entries (metadata and binary) of the
  chosen Triton kernels. The folder is Triton's own cache key (its version, the kernel's source and
  options, the target), so an entry is found only where Triton would compile the same kernel; they
  are copied into the user's Triton cache, through Triton's cache manager, before the first Triton
  warm-up of a process, and only when the installed Triton is the version that made them
  (``triton/VERSION``);
- ``static/<key>.kernel`` and ``static/<sha256>.cubin``: the same Triton kernels as
  :mod:`tunekit.backends.triton_static` keeps them (launch recipes under names that hash the call's
  key, Triton's version, the architecture and the kernels' text; cubins under their content's
  hash), which launch without importing Triton;
- ``quack/<key>/kernel.so``, ``recipe.json``, ``libs.json``: quack's kernels as :mod:`tunekit.backends.quack`
  builds them (a child process, 15-20 s each), under the key that hashes their spec and the versions of
  quack, the CuTe DSL and tvm_ffi, the GPU model, Python's version and the builder's source: used exactly
  where that build would run.

Neither changes what runs, only when it is ready; a kernel with no shipped build compiles as before.
Off, as the shipped results are, with ``TUNEKIT_USE_SHIPPED=0``. Trust: the files are part of the
installed package, as its Python code is.
"""

from __future__ import annotations

import functools
import os
import pathlib
import threading
import zipfile
import zlib

from .cache import warn_once

__all__ = ["PRETUNED_DIR", "enabled", "shipped_cubin", "shipped_static", "shipped_quack", "seed_triton_cache",
           "write_bundle", "bundle_for", "forget"]

PRETUNED_DIR = pathlib.Path(__file__).resolve().parents[1] / "pretuned"
_SUFFIX = ".kernels.zip"


def enabled() -> bool:
    """Whether shipped builds are used: with the shipped results (``use_shipped``)."""
    from ..tunable import context  # the settings live in the runtime; read at call time, never at import

    return context.current().use_shipped


def bundle_for(table: pathlib.Path) -> pathlib.Path:
    """The kernels bundle beside a shipped results file: ``X.csv`` -> ``X.kernels.zip``."""
    return table.with_name(table.stem + _SUFFIX)


_opened: dict[pathlib.Path, tuple[zipfile.ZipFile, threading.Lock] | None] = {}
_opened_lock = threading.Lock()


def _after_fork() -> None:
    """A forked child opens the bundles again: an inherited file shares its offset with the parent's
    reads, and a lock held by another thread at the fork would never be released in the child."""
    global _opened_lock
    _opened.clear()  # the parent's objects: left to the parent
    _opened_lock = threading.Lock()
    _index.cache_clear()
    _names.cache_clear()


def _open(bundle: pathlib.Path) -> tuple[zipfile.ZipFile, threading.Lock] | None:
    """The bundle, opened once per process (reading a zip's directory of ~500 members took 1-2 ms,
    paid again by every member read before: a process's first calls read several), and the lock its
    reads share; None where it cannot be read (one TunekitWarning)."""
    with _opened_lock:
        if bundle not in _opened:
            try:
                _opened[bundle] = zipfile.ZipFile(bundle), threading.Lock()
            except (OSError, zipfile.BadZipFile) as exc:
                _opened[bundle] = None
                warn_once(f"bundle:{bundle}", f"tunekit: shipped kernel builds not used ({bundle}: {exc})")
        return _opened[bundle]


@functools.lru_cache(maxsize=None)
def _index(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """Member name -> the bundle holding it, over every readable bundle in ``directory``; a damaged
    one is left out with one TunekitWarning (its kernels compile as they would without it)."""
    found: dict[str, pathlib.Path] = {}
    for bundle in sorted(directory.glob("*" + _SUFFIX)):
        opened = _open(bundle)
        for name in () if opened is None else opened[0].namelist():
            found.setdefault(name, bundle)
    return found


def forget() -> None:
    """Drop the open bundles and their index (a bundle rewritten in place: pretune, tests)."""
    with _opened_lock:
        for opened in _opened.values():
            if opened is not None:
                with opened[1]:
                    opened[0].close()
        _opened.clear()
    _index.cache_clear()
    _names.cache_clear()


@functools.lru_cache(maxsize=None)
def _names(bundle: pathlib.Path) -> frozenset[str]:
    opened = _open(bundle)
    return frozenset() if opened is None else frozenset(opened[0].namelist())


def _own_bundle(directory: pathlib.Path) -> pathlib.Path | None:
    """The bundle of this process's GPU model in ``directory`` (it holds the builds of that model's
    shipped choices), or None before CUDA is initialised."""
    import torch

    from ..tunable import shipped  # the runtime names the shipped files: read at call time

    if not torch.cuda.is_initialized():
        return None
    return bundle_for(shipped.file_for(torch.cuda.get_device_name(torch.cuda.current_device()), directory))


def _read(directory: pathlib.Path, member: str) -> bytes | None:
    """A member of the bundles in ``directory``, or None (absent, or its bundle cannot be read). This
    GPU model's bundle is looked in first: opening every bundle (two of ~500 members, 2-3 ms each on
    the H100 host) cost a process's first shipped CUDA C choice 6 ms; the others open on a miss."""
    own = _own_bundle(directory)
    bundle = own if own is not None and own.is_file() and member in _names(own) else _index(directory).get(member)
    opened = None if bundle is None else _open(bundle)
    if opened is None:
        return None
    for attempt in range(2):
        z, lock = opened
        try:
            with lock:  # one open file: its position is shared by the reads
                return z.read(member)
        except ValueError:  # closed by forget() in another thread since _open gave it: open it again
            opened = _open(bundle) if attempt == 0 else None
            if opened is None:
                return None
        except (OSError, zipfile.BadZipFile, KeyError, zlib.error) as exc:
            warn_once(f"bundle:{bundle}", f"tunekit: shipped kernel builds not used ({bundle}: {exc})")
            return None
    return None


def shipped_cubin(filename: str, directory: pathlib.Path | None = None) -> bytes | None:
    """The shipped cubin named ``filename`` (its cubin-cache name) in ``directory`` (default:
    :data:`PRETUNED_DIR`), or None (none, not an ELF image, or shipped builds off)."""
    if not enabled():
        return None
    data = _read(PRETUNED_DIR if directory is None else directory, f"cubin/{filename}")
    return data if data is not None and data[:4] == b"\x7fELF" else None


def shipped_static(member: str, directory: pathlib.Path | None = None) -> bytes | None:
    """The shipped member ``static/<file>`` (a kept Triton kernel), or None (none, or shipped builds off)."""
    if not enabled():
        return None
    return _read(PRETUNED_DIR if directory is None else directory, member)


#: a quack kernel's files (backends/quack.py's KERNEL_FILES; not imported: quack.py imports this module)
_QUACK_FILES = ("kernel.so", "recipe.json", "libs.json")


def shipped_quack(key: str, directory: pathlib.Path | None = None) -> dict[str, bytes] | None:
    """The shipped files of quack kernel ``key`` ({file name: bytes}), or None (not all of them, not an ELF
    library, or shipped builds off)."""
    if not enabled():
        return None
    directory = PRETUNED_DIR if directory is None else directory
    files = {name: _read(directory, f"quack/{key}/{name}") for name in _QUACK_FILES}
    if any(data is None for data in files.values()) or files["kernel.so"][:4] != b"\x7fELF":
        return None
    return files


_seeded: dict[pathlib.Path, int] = {}
_seed_lock = threading.Lock()


def seed_triton_cache(directory: pathlib.Path | None = None) -> int:
    """Copy the shipped Triton cache entries (of the bundles in ``directory``, default
    :data:`PRETUNED_DIR`) this Triton can use into its cache, once per process;
    how many were copied (entries already there are left alone). A failure only costs compiles: one
    TunekitWarning says why."""
    if not enabled():
        return 0
    directory = PRETUNED_DIR if directory is None else directory
    with _seed_lock:
        if directory not in _seeded:
            try:
                _seeded[directory] = _seed(directory)
            except Exception as exc:  # noqa: BLE001 - Triton internals moved: compile as before
                _seeded[directory] = 0
                warn_once(f"triton-seed:{directory}", f"tunekit: shipped Triton kernels not used ({exc!r})")
        return _seeded[directory]


def _seed(directory: pathlib.Path) -> int:
    import triton
    from triton.runtime import cache as triton_cache

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and getattr(knobs.cache, "manager_class", None) is not None:
        return 0  # a custom (remote) cache manager: its keys and storage are its own
    copied = 0
    for bundle in sorted(directory.glob("*" + _SUFFIX)):
        with zipfile.ZipFile(bundle) as z:
            names = set(z.namelist())
            if "triton/VERSION" not in names or z.read("triton/VERSION").decode().strip() != triton.__version__:
                continue  # another Triton: its cache keys differ, the entries would never be found
            for member in sorted(n for n in names if n.startswith("triton/") and n.endswith(".json")):
                _, folder, name = member.split("/")
                manager = triton_cache.FileCacheManager(folder)
                if manager.get_group(name) is not None:
                    continue
                binary = f"triton/{folder}/{name[:-len('.json')]}.cubin"
                if binary not in names:
                    continue  # a metadata file alone would be a cache hit without a kernel
                paths = {f.rsplit("/", 1)[1]: manager.put(z.read(f), f.rsplit("/", 1)[1]) for f in (member, binary)}
                manager.put_group(name, paths)
                copied += 1
    return copied


def write_bundle(path: pathlib.Path, cubin_dir: pathlib.Path, triton_dir: pathlib.Path | None,
                 triton_version: str | None, static_dir: pathlib.Path | None = None,
                 quack_dir: pathlib.Path | None = None) -> tuple[int, int, int, int]:
    """Write the bundle ``path`` from a fresh cubin cache folder, a fresh Triton cache folder, a
    fresh folder of kept Triton kernels and a fresh quack cache folder (the builds of the shipped choices only);
    (cubins, Triton kernels, kept files: recipes and their cubins, quack kernels) written. Triton's launcher
    libraries and intermediate files are left out: only kernels' metadata and binaries travel."""
    cubins = sorted(cubin_dir.glob("*.cubin")) if cubin_dir.is_dir() else []
    kept = sorted([*static_dir.glob("*.kernel"), *static_dir.glob("*.cubin")]) if static_dir and static_dir.is_dir() else []
    quacks = sorted(d for d in quack_dir.iterdir() if all((d / n).is_file() for n in _QUACK_FILES)) \
        if quack_dir is not None and quack_dir.is_dir() else []
    kernels = []
    if triton_dir is not None and triton_dir.is_dir():
        for meta in sorted(triton_dir.glob("*/*.json")):
            binary = meta.with_suffix(".cubin")
            if not meta.name.startswith("__grp__") and binary.is_file():
                kernels.append((meta, binary))
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for cubin in cubins:
            z.write(cubin, f"cubin/{cubin.name}")
        for meta, binary in kernels:
            for f in (meta, binary):
                z.write(f, f"triton/{f.parent.name}/{f.name}")
        if kernels:
            z.writestr("triton/VERSION", str(triton_version))
        for f in kept:
            z.write(f, f"static/{f.name}")
        for folder in quacks:
            for name in _QUACK_FILES:
                z.write(folder / name, f"quack/{folder.name}/{name}")
    forget()  # this process's handle on the old file first (replacing an open file fails on Windows)
    tmp.replace(path)
    forget()
    return len(cubins), len(kernels), len(kept), len(quacks)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
