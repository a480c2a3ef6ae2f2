"""Build a small CPython extension from a source shipped in this package, at first use, the way
Triton builds its launcher: the system compiler and Python's headers, into the cache next to the
cubins, keyed by everything the binary depends on (source, flags, compiler, Python ABI). Used by
:mod:`tunekit.backends.fast_launch` (C) and :mod:`tunekit.backends.fast_call` (C++ against libtorch).

A built extension is code this process will run, so the cache is checked before anything is loaded
from it (:mod:`tunekit.backends.cache`: a private folder, entries owned by this user and writable by
nobody else), and every built ``.so`` has its SHA-256 in a side file (``<name>.so.sha256``) that
must match before it is loaded. An entry that fails either check, or fails to load (a torn or
corrupt file), is rebuilt once. Builds go to a temporary folder, then are renamed into place under an
exclusive lock per extension in the cache folder, so concurrent first uses (threads or processes) never
see a torn file and build once, while different extensions build side by side.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from types import SimpleNamespace
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from . import cache
from .env import SettingError, switch

try:
    import fcntl
except ImportError:  # not POSIX: builders in other processes are not excluded (renames stay atomic)
    fcntl = None

__all__ = ["compiler", "build", "load", "verify", "load_or_reason", "once", "when_loaded_by", "built_at_first_use",
           "exclusive"]

_HASH_SUFFIX = ".sha256"


def compiler(cxx: bool) -> str | None:
    """``$CXX`` / ``$CC``, else the first of the usual names on PATH."""
    configured = os.environ.get("CXX" if cxx else "CC")
    if configured:
        return configured
    for name in ("c++", "g++", "clang++") if cxx else ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def build(source: str, module: str, *, cxx: bool = False, flags: tuple[str, ...] = (),
          directory: str | os.PathLike | None = None, rebuild: bool = False) -> str:
    """Compile ``tunekit/backends/<source>`` into the extension ``module`` (or find it built and
    verified); its path. ``flags`` go to the compiler after the source (include paths, libraries);
    ``rebuild`` replaces an entry that verified but would not load. Raises RuntimeError with the
    compiler's output when it cannot be built, UntrustedCache for a folder others can write."""
    code = resources.files("tunekit.backends").joinpath(source).read_text()
    cc = compiler(cxx)
    if cc is None:
        raise RuntimeError(f"no {'C++' if cxx else 'C'} compiler found (set {'CXX' if cxx else 'CC'})")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python headers not found in {include}")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join((code, suffix, include, cc, *flags)).encode()).hexdigest()[:16]
    base = cache.private_dir(directory if directory is not None else cache.cache_dir("launch"))
    path = os.path.join(base, f"{module}-{key}{suffix}")
    if not rebuild and verify(path) is None:
        return path
    with exclusive(base, module):
        if not rebuild and verify(path) is None:  # built by whoever held the lock before us
            return path
        _compile(code, source, [*cc.split(), "-O2", "-shared", "-fPIC", f"-I{include}"], list(flags), base, path)
    return path


def _compile(code: str, source: str, command: list[str], flags: list[str], base, path: str) -> None:
    """Compile into a temporary folder of ``base``; publish the hash, then the library, by rename."""
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = os.path.join(tmp, source)  # absolute: no path here can read as a compiler option
        with open(src, "w") as f:
            f.write(code)
        out = os.path.join(tmp, os.path.basename(path))
        cmd = [*command, src, *flags, "-o", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"compiling {source} failed ({' '.join(cmd)}):\n{run.stderr.strip()[-4000:]}")
        os.chmod(out, 0o700)  # whatever the umask: writable by this user only
        with open(out, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        side = out + _HASH_SUFFIX
        with open(side, "w") as f:  # mkdtemp's folder is 0o700 and this file is new: the umask rules
            f.write(digest + "\n")
        os.chmod(side, 0o600)
        os.replace(side, path + _HASH_SUFFIX)  # readers seeing the new hash with the old library
        os.replace(out, path)  # take the lock, and find both new once we release it


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_lock = threading.Lock()


@contextlib.contextmanager
def exclusive(folder, module: str):
    """This process's threads, and other processes, one at a time for ``module`` in ``folder`` (flock on
    ``.<module>.lock`` there). Per module, not per folder: with one lock for the folder, the C launcher's
    1 s build waited behind the C++ extensions' 12-14 s builds on a fresh machine, and every CUDA C
    candidate's preparation with it."""
    with _thread_locks_lock:
        lock = _thread_locks.setdefault(module, threading.Lock())
    with lock:
        if fcntl is None:
            yield
            return
        fd = os.open(os.path.join(folder, f".{module}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def verify(path: str | os.PathLike) -> str | None:
    """Why the built extension at ``path`` must not be loaded (missing, not private, its folder not
    private, its recorded SHA-256 missing or different), or None."""
    path = os.fspath(path)
    problem = cache.folder_problem(os.path.dirname(os.path.abspath(path)))
    if problem:
        return problem
    try:
        with open(path, "rb") as f:
            problem = cache.entry_problem(os.fstat(f.fileno()), path)
            digest = None if problem else hashlib.sha256(f.read()).hexdigest()
        with open(path + _HASH_SUFFIX, "rb") as f:
            problem = problem or cache.entry_problem(os.fstat(f.fileno()), path + _HASH_SUFFIX)
            recorded = f.read(200).decode(errors="replace").strip()
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if problem:
        return problem
    if recorded != digest:
        return f"{path} does not match its recorded SHA-256 (a torn or altered file)"
    return None


def load(path: str, module: str):
    """Import the extension ``module`` built at ``path``, after :func:`verify`; UntrustedCache
    when it does not verify, ImportError / OSError when it does not load."""
    problem = verify(path)
    if problem:
        raise cache.UntrustedCache(problem)
    return _import(path, module)


def _import(path: str, module: str):
    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load_or_reason(build_fn, module: str, variable: str):
    """(the extension ``module`` built by ``build_fn(rebuild=False)``, None), or (None, why not):
    turned off by the environment ``variable``, or it could not be built (no compiler, no headers,
    a cache others can write: warned once). An entry that does not verify or load is rebuilt once.
    A ``variable`` or ``TUNEKIT_CACHE`` tunekit cannot read raises SettingError. The path ``build_fn`` gives
    is verified already (:func:`build`), so it is imported without a second :func:`verify`: each read and
    hashed the library again, 2.5-3 ms on the H100 host (``fast_call_load_cost-*``), and in a private folder nobody
    but this user can have changed it since."""
    if not switch(variable):
        return None, f"disabled by {variable}={os.environ[variable].strip()}"
    try:
        path = build_fn()
        try:
            return _import(path, module), None
        except (ImportError, OSError, cache.UntrustedCache):
            return load(build_fn(rebuild=True), module), None
    except SettingError:
        raise
    except cache.UntrustedCache as exc:
        cache.warn_once(f"extension:{exc}", f"tunekit: not loading {module} from the cache ({exc}); "
                        f"the slower launch path runs instead")
        return None, str(exc)
    except Exception as exc:  # the callers have a slower path that still works
        return None, str(exc)


def once(fn):
    """``fn()`` computed once, by one thread while the others wait (the extensions are loaded from a
    preparing worker thread and from the caller's: both must get the one module, imported once). An
    exception is not kept: the next call tries again. ``done()``: whether the value is there;
    ``cache_clear()`` forgets it (tests)."""
    lock = threading.Lock()
    value = []

    @functools.wraps(fn)
    def memo():
        if not value:
            with lock:
                if not value:
                    value.append(fn())
        return value[0]

    memo.cache_clear = value.clear
    memo.done = lambda: bool(value)
    return memo


def when_loaded_by(loader, thread_name: str):
    """``when_loaded(install)`` for the extension ``loader`` (a :func:`once` function giving
    ``(module, why not)``): ``install(module)`` now if it is loaded, else from one worker thread of its
    own (named ``thread_name``) that builds and loads it; never when it cannot be built. Calls never
    wait for a build; ``when_loaded.settle()`` waits for the installs already asked for."""
    started, pool = threading.Lock(), []

    def when_loaded(install) -> None:
        if loader.done():
            module = loader()[0]
            if module is not None:
                install(module)
            return
        with started:
            if not pool:
                pool.append(ThreadPoolExecutor(1, thread_name_prefix=thread_name))

        def build_then_install():
            module = loader()[0]
            if module is not None:
                install(module)
        pool[0].submit(build_then_install)

    def settle() -> None:
        """Wait until every install asked for so far has run (or its build was refused): the worker
        runs its jobs in order."""
        if pool:
            pool[0].submit(lambda: None).result()

    when_loaded.settle = settle
    return when_loaded


def built_at_first_use(source: str, module: str, *, flags, thread_name: str, variable: str = "TUNEKIT_FAST_CALL"):
    """What a C++ extension's module offers (``fast_grad``, ``fast_gemm``, ``fast_route``), as a namespace:

    - ``build(directory=None, rebuild=False)``: compile ``source`` (or find it built); its path;
      RuntimeError when it cannot be built (``flags()``: the compiler flags, asked at build time);
    - ``_load()``: the :func:`once` loader, ``(module, why not)``; off when ``variable`` says so;
    - ``load()``: the module, or None when it is off or cannot be built (may build: seconds);
    - ``loaded()``: the module if it is loaded already, else None (never waits for a build);
    - ``unavailable()``: None when the extension is in use, else why not;
    - ``when_loaded(install)``: :func:`when_loaded_by` on a worker thread named ``thread_name``."""
    def build_it(directory=None, rebuild: bool = False) -> str:
        return build(source, module, cxx=True, flags=flags(), directory=directory, rebuild=rebuild)

    @once
    def _load():
        return load_or_reason(build_it, module, variable)

    def load_it():
        return _load()[0]

    return SimpleNamespace(build=build_it, _load=_load, load=load_it,
                           loaded=lambda: load_it() if _load.done() else None,
                           unavailable=lambda: _load()[1], when_loaded=when_loaded_by(_load, thread_name))
