"""quack's Hopper GEMM kernels (``quack-kernels``: CuTe DSL, Tri Dao) with their fused epilogues, for
tunekit's GEMM candidates (``ops/gemm/quack_candidates.py``), run without importing quack.

Why: a linear + bias + gelu tanh runs cuBLASLt's bias + GELU algorithms at 1.03-1.05x the time of its
plain ones on an H100, Triton's epilogues at 1.13x: the activation's arithmetic follows each tile's
main loop. quack's ping-pong kernels give each SM two consumer warp groups whose epilogues overlap
the other's main loop (bias + gelu tanh 0.5% over its plain GEMM, which ran within 2% of cuBLAS at
8192^3 and 4096 x 4096 x 14336; ``benchmarks/results/quack_gemm_probe-*``).

Why not in-process: importing quack froze every other thread of the process for 13-16 s and a
compile held the interpreter 2-2.7 s at once (``benchmarks/results/quack_gil_probe-*``). So a child
process builds each kernel (``quack_build.py``: quack's plan compiled into its TVM-FFI object, linked
into ``kernel.so``, with the recipe of its launch arguments) into tunekit's cache (``quack/<key>``),
and this process loads it through ``tvm_ffi`` (0.12 s for tvm_ffi's import, then 2.5 ms a kernel)
and calls it with the recipe's arguments; the kernel runs on torch's current stream (TVM-FFI's
environment stream), in CUDA graphs too (``benchmarks/experiments/quack_tvm_ffi_probe.py``). A
kernel serves every shape of its class (dtype, operand majors, bias, activation, configuration): the
kernels take M, N and K at run time. The key holds the versions of quack, the CuTe DSL and tvm_ffi,
and the GPU model (the launch's cluster count).

A kernel built for a shipped choice travels in the GPU model's kernels bundle (``shipped_kernels.py``): where
its key matches (the same versions, GPU model, Python and builder), it is unpacked into the cache instead of
built, so the shipped choice runs from a process's first call instead of after a child's 15-20 s build. Its
``libs.json`` names the runtime libraries where they lay on the machine that built it; a path that does not
exist here is looked up by name among the installed packages' files (the key pins their versions).

Optional: ``pip install quack-kernels`` (it brings ``nvidia-cutlass-dsl`` and ``apache-tvm-ffi``), a C
compiler for the link; without them, or off compute capability 9.0, :func:`unavailable` says why.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

import torch

from . import cache, extension, shipped_kernels
from ..tunable.preparations import NeedsCompiler, compilers_allowed

__all__ = ["ACTIVATIONS", "unavailable", "version", "major", "spec_for", "kernel_for", "build", "QuackKernel",
           "arguments"]

#: tunekit's epilogue activations that quack's epilogue library computes, by quack's name
ACTIVATIONS = {"none": None, "relu": "relu", "silu": "silu", "gelu_tanh": "gelu_tanh_approx"}
#: the longest a child may take to build its kernels (quack's import 5-16 s, each compile 2-7 s)
BUILD_TIMEOUT_S = 900
_BUILDER = pathlib.Path(__file__).with_name("quack_build.py")

#: the runtime libraries a built kernel may name (``libs.json``): the CuTe DSL's and tvm_ffi's
RUNTIME_LIBRARIES = ("libcute_dsl_runtime.so", "libtvm_ffi.so")
#: the distributions whose files hold them (the CuTe DSL's libraries come in per-CUDA packages)
_LIBRARY_DISTRIBUTIONS = ("nvidia-cutlass-dsl-libs-cu13", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl",
                          "apache-tvm-ffi")
#: a built kernel's files, as its folder and the kernels bundle hold them
KERNEL_FILES = ("kernel.so", "recipe.json", "libs.json")

_lock = threading.Lock()
_kernels: dict[tuple, "QuackKernel"] = {}  # by the tensors' class, configuration and device
_failed: dict[str, str] = {}  # key -> why its build or load failed in this process (not tried again)
_children: set = set()
_libraries: dict[str, ctypes.CDLL] = {}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def version() -> str | None:
    """The installed quack-kernels version (without importing it), or None."""
    return _dist_version("quack-kernels")


def _compiler() -> str | None:
    cc = shlex.split(os.environ.get("CC") or "")
    return shutil.which(cc[0]) if cc else shutil.which("gcc") or shutil.which("cc")


@functools.lru_cache(maxsize=None)
def unavailable(device_index: int) -> str | None:
    """Why quack's kernels cannot run on CUDA device ``device_index``, or None."""
    if version() is None or importlib.util.find_spec("quack") is None:
        return "quack-kernels is not installed (optional: pip install quack-kernels)"
    if importlib.util.find_spec("tvm_ffi") is None:
        return "apache-tvm-ffi is not installed (quack-kernels' dependency: it loads the built kernels)"
    if _compiler() is None:
        return "no C compiler (gcc or $CC) to link quack's kernels"
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return "quack's SM90 kernels: compute capability 9.0 (H100, H200) only"
    return None


def major(t: torch.Tensor) -> str | None:
    """"row" (the last dim contiguous), "col" (the first), or None for a 2-D operand neither dense
    row- nor column-major."""
    rows, cols = t.shape
    sr, sc = t.stride()
    if sc == 1 and (sr == cols or rows == 1):
        return "row"
    if sr == 1 and (sc == rows or cols == 1):
        return "col"
    return None


@functools.lru_cache(maxsize=None)
def _environment(device_index: int) -> str:
    """What a built kernel depends on besides its spec: the versions of what built and loads it, the GPU
    model, the builder's source."""
    versions = [_dist_version(n) for n in ("quack-kernels", "nvidia-cutlass-dsl", "apache-tvm-ffi")]
    return json.dumps([versions, torch.cuda.get_device_name(device_index), sys.version_info[:2],
                       hashlib.sha256(_BUILDER.read_bytes()).hexdigest()])


def spec_for(a, b, bias, activation: str, config: tuple) -> dict:
    """The build spec of the kernel for ``act(a @ b + bias)`` in ``config`` (tile_m, tile_n, pingpong,
    cluster_m, cluster_n); its ``key`` names the kernel's cache folder."""
    index = a.device.index or 0  # a CUDA tensor's device always has its index
    spec = {"dtype": str(a.dtype).removeprefix("torch."), "a_major": major(a), "b_major": major(b),
            "bias": bias is not None, "activation": activation, "quack_activation": ACTIVATIONS[activation],
            "config": list(config)}
    spec["key"] = hashlib.sha256((json.dumps(spec, sort_keys=True) + _environment(index)).encode()).hexdigest()[:40]
    spec["device"] = index
    return spec


def _root() -> pathlib.Path:
    return cache.private_dir(cache.cache_dir("quack"))


def _child(root: pathlib.Path, specs: list[dict]) -> tuple[dict, str]:
    """Build ``specs`` in one child process: ({key: its error}, why the child failed where it did)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the parent's imports
    child = subprocess.Popen([sys.executable, str(_BUILDER), str(root)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with _lock:
        _children.add(child)
    try:
        stdout, stderr = child.communicate(json.dumps(specs), timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {}, f"building took over {BUILD_TIMEOUT_S} s"
    finally:
        with _lock:
            _children.discard(child)
    errors = {}
    for line in stdout.splitlines():  # the builder's lines among whatever quack prints
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("error"):
            errors[row.get("key")] = row["error"]
    return errors, f"no kernel (exit {child.returncode}: {stderr.strip()[-600:]})"


def _stop_children() -> None:
    """At exit: a preparation waiting on a child would hold the interpreter's exit for the whole build."""
    with _lock:
        for child in _children:
            child.kill()


# before the preparation workers are joined at exit (threading's exit hooks run last registered first)
threading._register_atexit(_stop_children)


def build(specs: list[dict], processes: int = 1) -> None:
    """Build every spec of ``specs`` not built yet, in ``processes`` child processes side by side (quack
    imported once in each); a RuntimeError names each that failed, with the child's reason."""
    root = _root()
    todo = [s for s in specs if not (root / s["key"] / "kernel.so").exists()]
    if not todo:
        return
    chunks = [todo[i::processes] for i in range(min(processes, len(todo)))]
    with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
        outcomes = list(pool.map(functools.partial(_child, root), chunks))
    whys = []
    for chunk, (errors, failure) in zip(chunks, outcomes):
        whys += [errors.get(s["key"], failure) for s in chunk if not (root / s["key"] / "kernel.so").exists()]
    if whys:
        raise RuntimeError(f"quack's build failed: {'; '.join(whys)}")


def kernel_for(a, b, bias, activation: str, config: tuple) -> "QuackKernel":
    """The loaded kernel for ``act(a @ b + bias)`` in ``config``: from this process, else from the cache,
    else built (a child process: seconds; one build per kernel across threads and processes). Inside
    ``preparations.builds_only()`` a kernel not built yet raises NeedsCompiler. A failure is remembered:
    the process does not build that kernel again."""
    loaded = (a.dtype, major(a), major(b), bias is not None, activation, config, a.device.index)
    kernel = _kernels.get(loaded)  # a call's path: no spec, no hash
    if kernel is not None:
        return kernel
    spec = spec_for(a, b, bias, activation, config)
    key = spec["key"]
    if key in _failed:
        raise RuntimeError(_failed[key])
    root = _root()
    if not (root / key / "kernel.so").exists() and not compilers_allowed() and shipped_kernels.shipped_quack(key) is None:
        raise NeedsCompiler("a quack kernel is built by a child process on first use")
    try:
        with extension.exclusive(root, f"quack-{key}"):  # other configurations build side by side
            kernel = _kernels.get(loaded) or _built_and_loaded(spec, root / key)
    except cache.UntrustedCache:
        raise
    except Exception as exc:
        if compilers_allowed():  # kept builds only: a later preparation may still build it
            _failed[key] = f"{type(exc).__name__}: {exc}"
        raise
    _kernels[loaded] = kernel
    return kernel


def _built_and_loaded(spec: dict, folder: pathlib.Path) -> "QuackKernel":
    """Under the kernel's lock: unpacked from the kernels bundle, else built, if missing; one rebuild where a kernel
    built or shipped before does not load (a damaged file, another machine's build), never where it is not private."""
    if not (folder / "kernel.so").exists() and not _unpacked(spec["key"], folder):
        build([spec])
        return QuackKernel(folder)
    try:
        return QuackKernel(folder)
    except cache.UntrustedCache:
        raise
    except Exception:  # noqa: BLE001 - built again once; a second failure raises
        if not compilers_allowed():
            raise
        shutil.rmtree(folder)
        build([spec])
        return QuackKernel(folder)


def _unpacked(key: str, folder: pathlib.Path) -> bool:
    """The bundle's build of kernel ``key`` written into ``folder`` (private files, renamed into place); False
    where the bundle has none."""
    files = shipped_kernels.shipped_quack(key)
    if files is None:
        return False
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}.", dir=folder.parent))  # mode 0o700
    try:
        for name in KERNEL_FILES:
            fd = os.open(work / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)  # whatever the umask
                f.write(files[name])
        if folder.exists():  # a build that ended half-way: no kernel.so (the caller looked, under the kernel's lock)
            shutil.rmtree(folder)
        os.rename(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True


@functools.lru_cache(maxsize=None)
def _installed_libraries() -> dict[str, str]:
    """Each of RUNTIME_LIBRARIES found among the installed packages' files (not their stubs), by file name."""
    found = {}
    for dist in _LIBRARY_DISTRIBUTIONS:
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name in RUNTIME_LIBRARIES and "stubs" not in f.parts and f.name not in found:
                found[f.name] = str(f.locate())
    return found


def _library(recorded: str) -> str:
    """A runtime library ``libs.json`` names: where the build found it, else the installed packages' file."""
    if os.path.isfile(recorded):
        return recorded
    here = _installed_libraries().get(os.path.basename(recorded))
    if here is None:
        raise FileNotFoundError(f"{os.path.basename(recorded)} is not among the installed packages' files")
    return here


def _rebuilder(leaf):
    """A recipe leaf as (True, constant) or (False, a function of the call's tensors)."""
    if "t" in leaf:
        name = leaf["t"]
        return (False, (lambda v: v[name].mT) if leaf.get("mT") else (lambda v: v[name]))
    if "v" in leaf:
        return True, leaf["v"]
    if "tuple" in leaf:
        parts = [_rebuilder(x) for x in leaf["tuple"]]
        if all(const for const, _ in parts):
            return True, tuple(p for _, p in parts)
        return False, lambda v: tuple(p if const else p(v) for const, p in parts)
    raise ValueError(f"a quack launch recipe leaf tunekit cannot rebuild: {leaf}")


def arguments(recipe: list):
    """A function of the call's tensors ({"a", "b", "bias", "out"}) giving the launch's arguments."""
    parts = [_rebuilder(leaf) for leaf in recipe]
    return lambda v: [p if const else p(v) for const, p in parts]


class QuackKernel:
    """One built quack kernel, loaded: ``kernel(a, b, bias, out)`` computes ``out = act(a @ b + bias)``
    on the current stream."""

    def __init__(self, folder: pathlib.Path):
        problem = cache.folder_problem(folder)
        texts = {}
        for name in ("kernel.so", "recipe.json", "libs.json"):
            with open(folder / name, "rb") as f:
                problem = problem or cache.entry_problem(os.fstat(f.fileno()), folder / name)
                texts[name] = f.read() if name != "kernel.so" else b""
        if problem:
            raise cache.UntrustedCache(f"tunekit will not load the quack kernel in {folder}: {problem}")
        libs = json.loads(texts["libs.json"])
        if not all(os.path.basename(lib) in RUNTIME_LIBRARIES for lib in libs):
            raise ValueError(f"{folder}/libs.json names libraries other than {RUNTIME_LIBRARIES}: {libs}")
        self._arguments = arguments(json.loads(texts["recipe.json"]))
        import tvm_ffi  # 0.12 s once; quack and the CuTe DSL are never imported here

        for lib in libs:  # kernel.so names them by soname: loaded first, they are the ones it binds to
            if os.path.basename(lib) != "libtvm_ffi.so" and lib not in _libraries:  # tvm_ffi loaded its own
                _libraries[lib] = ctypes.CDLL(_library(lib), mode=ctypes.RTLD_GLOBAL)
        self._fn = tvm_ffi.load_module(str(folder / "kernel.so"))["func"]

    def __call__(self, a, b, bias, out):
        self._fn(*self._arguments({"a": a, "b": b, "bias": bias, "out": out}))
        return out
