"""Where kept Triton kernels live (:mod:`tunekit.backends.triton_static`): the launch recipe, the
file format (the recipe as one JSON line, then the cubin), file names, tunekit's cache folder
(``triton-static/``, private as every cache folder: ``backends/cache.py``) and the shipped bundles
(``static/`` members: ``backends/shipped_kernels.py``).

A file's name hashes the call's key with everything the cubin depends on besides it: Triton's
version, the GPU architecture, the text of every file of ``tunekit/kernels/triton/`` (a kernel's
helpers live beside it) and the process's ``TRITON_*`` / ``MLIR_*`` / ``LLVM_*`` settings (those
that change what Triton compiles). So a file is found only where Triton would have built the same
cubin for the same call.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import tempfile

from .cache import UntrustedCache, cache_dir, entry_problem, private_dir, warn_once
from .shipped_kernels import shipped_static

__all__ = ["Recipe", "FORMAT", "KERNELS_DIR", "STATIC_DIR_KIND", "SHIPPED_PREFIX", "triton_version", "file_name",
           "encode", "decode", "find", "keep"]

STATIC_DIR_KIND = "triton-static"
SHIPPED_PREFIX = "static/"
KERNELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "kernels" / "triton"
FORMAT = 1
#: settings that do not change what Triton compiles (left out of the environment's hash)
_NOT_CODEGEN = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_INTERPRET",
                "TRITON_PRINT_AUTOTUNING", "TRITON_CACHE_MANAGER")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a launch of one compiled kernel needs besides its arguments. ``passed``: per kernel
    parameter in order, the call's positional index (int) or keyword (str) it comes from;
    ``sizes``: each one's bytes; ``scratch``: global scratch bytes per program (0: none)."""

    symbol: str
    num_warps: int
    shared: int
    scratch: int
    passed: tuple
    sizes: tuple

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **dataclasses.asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Recipe":
        d = json.loads(text)
        if d.pop("format") != FORMAT:
            raise ValueError("another recipe format")
        return cls(d["symbol"], int(d["num_warps"]), int(d["shared"]), int(d["scratch"]), tuple(d["passed"]),
                   tuple(int(s) for s in d["sizes"]))


def _stable(part) -> str:
    """``call_key``'s text for a file name: the same in every process."""
    if isinstance(part, tuple):
        return "(" + ",".join(map(_stable, part)) + ")"
    if isinstance(part, type):
        return part.__name__
    return repr(part)


@functools.lru_cache(maxsize=None)
def triton_version() -> str | None:
    """The installed Triton's ``__version__``, read from its ``__init__.py`` (no import; a
    distribution's metadata scan took 26 ms on a first call); None when it cannot be read."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return None
    try:
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", pathlib.Path(spec.origin).read_text(), re.M)
    except OSError:
        return None
    return found.group(1) if found else None


@functools.lru_cache(maxsize=None)
def _build_identity() -> str:
    """What every kept file depends on besides its key: Triton's version, the kernels' text, the
    Triton settings that change compiles."""
    h = hashlib.sha256(f"{FORMAT}|{triton_version()}|".encode())
    for f in sorted(KERNELS_DIR.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for k in sorted(os.environ):
        if k.startswith(("TRITON_", "MLIR_", "LLVM_")) and k not in _NOT_CODEGEN:
            h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()


def file_name(module: str, name: str, key: tuple, arch: str) -> str:
    text = f"{_build_identity()}|{arch}|{module}|{name}|{_stable(key)}"
    return hashlib.sha256(text.encode()).hexdigest()[:40] + ".kernel"


def encode(recipe: Recipe, cubin: bytes) -> bytes:
    return recipe.to_json().encode() + b"\n" + cubin


def decode(data: bytes) -> tuple[Recipe, bytes] | None:
    head, sep, cubin = data.partition(b"\n")
    if not sep or cubin[:4] != b"\x7fELF":
        return None
    try:
        return Recipe.from_json(head.decode()), cubin
    except (ValueError, KeyError, TypeError):
        return None


def _folder() -> pathlib.Path | None:
    """The kept kernels' folder, created private; None (warned once) when it cannot be used."""
    folder = cache_dir(STATIC_DIR_KIND)
    try:
        return private_dir(folder)
    except UntrustedCache as exc:
        warn_once(f"static:{folder}", f"tunekit: Triton kernels not kept between processes ({exc})")
    except OSError:
        pass
    return None


def _read_kept(fname: str) -> bytes | None:
    folder = _folder()
    if folder is None:
        return None
    path = folder / fname
    try:
        with open(path, "rb") as f:
            if entry_problem(os.fstat(f.fileno()), path):
                return None
            return f.read()
    except OSError:
        return None


def keep(fname: str, data: bytes) -> None:
    """Write a kept file into tunekit's cache (atomically; nothing where the folder cannot be used)."""
    folder = _folder()
    if folder is None:
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=fname, suffix=".tmp")  # mode 0o600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / fname)  # atomic: readers see no file or the whole one
    except OSError:
        pass  # an unwritable cache only costs Triton's launch in later processes


def find(fname: str) -> tuple[Recipe, bytes] | None:
    """A kept file (tunekit's cache first, then the shipped bundles), decoded; None if neither has it."""
    for data in (_read_kept(fname), shipped_static(SHIPPED_PREFIX + fname)):
        found = decode(data) if data else None
        if found is not None:
            return found
    return None


