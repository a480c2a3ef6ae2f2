"""Build a small CPython extension from a source shipped in this package, at first use, the way
Triton builds its launcher: the system compiler and Python's headers, into the cache next to the
cubins, keyed by everything the binary depends on (source, flags, compiler, Python ABI), written to
a temporary name and renamed, so concurrent first uses never see a torn file. Used by
:mod:`tunekit.backends.fast_launch` (C) and :mod:`tunekit.backends.fast_call` (C++ against libtorch).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from importlib import resources

from .cache import cache_dir

__all__ = ["compiler", "build", "load", "disabled", "load_or_reason"]


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
          directory: str | os.PathLike | None = None) -> str:
    """Compile ``tunekit/backends/<source>`` into the extension ``module`` (or find it built); its
    path. ``flags`` go to the compiler after the source (include paths, libraries). Raises
    RuntimeError with the compiler's output when it cannot be built."""
    code = resources.files("tunekit.backends").joinpath(source).read_text()
    cc = compiler(cxx)
    if cc is None:
        raise RuntimeError(f"no {'C++' if cxx else 'C'} compiler found (set {'CXX' if cxx else 'CC'})")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python headers not found in {include}")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join((code, suffix, include, cc, *flags)).encode()).hexdigest()[:16]
    base = os.fspath(directory) if directory is not None else os.fspath(cache_dir("launch"))
    path = os.path.join(base, f"{module}-{key}{suffix}")
    if os.path.exists(path):
        return path
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = os.path.join(tmp, source)
        with open(src, "w") as f:
            f.write(code)
        out = os.path.join(tmp, os.path.basename(path))
        cmd = [*cc.split(), "-O2", "-shared", "-fPIC", f"-I{include}", src, *flags, "-o", out]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"compiling {source} failed ({' '.join(cmd)}):\n{run.stderr.strip()[-4000:]}")
        os.replace(out, path)  # atomic: a concurrent builder's identical file or ours, never a torn one
    return path


def load(path: str, module: str):
    """Import the extension ``module`` built at ``path``."""
    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def disabled(variable: str) -> bool:
    """Whether the environment variable turns an extension off (0, false, no, off)."""
    return os.environ.get(variable, "1").strip().lower() in ("0", "false", "no", "off")


def load_or_reason(build_fn, module: str, variable: str):
    """(the extension ``module`` built by ``build_fn()``, None), or (None, why not): turned off by
    the environment ``variable``, or it could not be built (no compiler, no headers)."""
    if disabled(variable):
        return None, f"disabled by {variable}=0"
    try:
        return load(build_fn(), module), None
    except Exception as exc:  # the callers have a slower path that still works
        return None, str(exc)
