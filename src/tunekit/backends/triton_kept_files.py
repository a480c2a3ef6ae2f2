"""Where kept Triton kernels live (:mod:`tunekit.backends.triton_static`): the launch recipe, its
files, tunekit's cache folder (``triton-static/``, private as every cache folder:
``backends/cache.py``) and the shipped bundles (``static/`` members: ``backends/shipped_kernels.py``).

Two kinds of file. ``<key hash>.kernel``: a call key's recipe, one JSON line, naming its cubin by
the SHA-256 of its bytes; ``<sha256>.cubin``: the cubin, stored once however many keys (shapes)
launch it (a key holds exact scalar values, so a program of many shapes makes many keys of few
cubins), and checked against its name when read.

A key file's name hashes the call's key with everything the cubin depends on besides it: Triton's
version, the GPU architecture, the text of every file of ``tunekit/kernels/triton/`` (a kernel's
helpers live beside it) and the process's environment variables that change what Triton compiles
(``TRITON_*``, ``MLIR_*``, ``LLVM_*``, ``DISABLE_*``, ``NVPTX_*``, ``USE_IR_LOC``: a superset of
Triton's own cache-invalidating list, read once per process; settings made through
``triton.knobs`` in Python are not seen). So a key file is found only where Triton would have built
the same cubin for the same call, with one exception: ``TRITON_PTXAS_PATH`` naming torch's own ptxas,
which any torch.compile sets where torch ships one (a cubin of Triton's ptxas is then used: the same
program, another assembler's machine code).
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
           "cubin_name", "find", "cubin", "keep"]

STATIC_DIR_KIND = "triton-static"
SHIPPED_PREFIX = "static/"
KERNELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "kernels" / "triton"
FORMAT = 2
#: the environment variables hashed into every key file's name (see the module), and the exceptions
_CODEGEN_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "DISABLE_", "NVPTX_", "USE_IR_LOC", "AMDGCN_", "PTXAS_")
#: settings that do not change what Triton compiles (left out of the environment's hash)
_NOT_CODEGEN = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_INTERPRET",
                "TRITON_PRINT_AUTOTUNING", "TRITON_CACHE_MANAGER")


def _torch_ptxas() -> tuple[str, ...]:
    """The paths a torch.compile points TRITON_PTXAS_PATH at, where torch ships a ptxas: ``<torch>/bin/ptxas``
    (torch 2.11, read on the device) and ``<torch>/_inductor/bin/ptxas`` (``_inductor/runtime/compile_tasks.py``
    of later releases). The variable is left out of the hash when it names one of them. Counted, it made every
    kept and shipped build miss after a torch.compile in the process, so a shipped choice compiled at its first
    use (``benchmarks/results/first_use_after_torch_compile-*``); another assembler the user names still counts."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return ()
    root = pathlib.Path(spec.origin).parent
    return str(root / "bin" / "ptxas"), str(root / "_inductor" / "bin" / "ptxas")


def _counted(name: str, value: str) -> bool:
    """Whether environment variable ``name`` = ``value`` goes into the build identity."""
    if not name.startswith(_CODEGEN_PREFIXES) or name in _NOT_CODEGEN:
        return False
    if name != "TRITON_PTXAS_PATH":
        return True
    return os.path.realpath(value) not in {os.path.realpath(p) for p in _torch_ptxas()}  # links, relative paths


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a launch of one compiled kernel needs besides its arguments. ``passed``: per kernel
    parameter in order, the call's positional index (int) or keyword (str) it comes from;
    ``sizes``: each one's bytes; ``scratch``: global scratch bytes per program (0: none);
    ``cubin``: the SHA-256 of the cubin's bytes (its file's name)."""

    symbol: str
    num_warps: int
    shared: int
    scratch: int
    passed: tuple
    sizes: tuple
    cubin: str = ""

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **dataclasses.asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Recipe":
        d = json.loads(text)
        if d.pop("format") != FORMAT:
            raise ValueError("another recipe format")
        return cls(d["symbol"], int(d["num_warps"]), int(d["shared"]), int(d["scratch"]), tuple(d["passed"]),
                   tuple(int(s) for s in d["sizes"]), str(d["cubin"]))


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
        if _counted(k, os.environ[k]):
            h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()


def file_name(module: str, name: str, key: tuple, arch: str) -> str:
    text = f"{_build_identity()}|{arch}|{module}|{name}|{_stable(key)}"
    return hashlib.sha256(text.encode()).hexdigest()[:40] + ".kernel"


def cubin_name(cubin: bytes) -> str:
    return hashlib.sha256(cubin).hexdigest()


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


def _write(folder: pathlib.Path, fname: str, data: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=fname, suffix=".tmp")  # mode 0o600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / fname)  # atomic: readers see no file or the whole one
    except OSError:
        pass  # an unwritable cache only costs Triton's launch in later processes


def keep(fname: str, recipe: Recipe, cubin: bytes) -> None:
    """Keep a call key's recipe and its cubin (written once per content) in tunekit's cache,
    atomically; nothing where the folder cannot be used. ``recipe.cubin`` must name ``cubin``."""
    folder = _folder()
    if folder is None:
        return
    if not (folder / f"{recipe.cubin}.cubin").is_file():
        _write(folder, f"{recipe.cubin}.cubin", cubin)
    _write(folder, fname, recipe.to_json().encode())


def _read(fname: str):
    """A kept file's bytes from tunekit's cache, else the shipped bundles, each as found."""
    yield _read_kept(fname)
    yield shipped_static(SHIPPED_PREFIX + fname)


def find(fname: str) -> Recipe | None:
    """A key file's recipe (tunekit's cache first, then the shipped bundles); None if neither has a
    readable one of this format."""
    for data in _read(fname):
        if not data:
            continue
        try:
            return Recipe.from_json(data.decode())
        except (ValueError, KeyError, TypeError):
            continue
    return None


def cubin(name: str) -> bytes | None:
    """The cubin whose SHA-256 is ``name``, from tunekit's cache or the shipped bundles; None if
    neither holds an ELF image of exactly that content."""
    for data in _read(f"{name}.cubin"):
        if data and data[:4] == b"\x7fELF" and cubin_name(data) == name:
            return data
    return None
