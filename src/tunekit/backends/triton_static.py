"""Triton kernels launched without Triton: the cubin Triton built, kept with what its launch needs.

Why: Triton's launcher is Python (its binder, cache lookup and a C launcher compiled per kernel),
15-20 us of host time per call (a logsumexp call with a Triton choice took 34-41 us, 22-24 kept,
H100); and a process's first Triton kernel waited for Triton's import and start, so a shipped
Triton choice ran torch's or a stand-in's kernel for its first 0.3-1 s.

So the first time Triton compiles or launches a tunekit kernel for some arguments, :func:`record`
keeps what that launch needs (:class:`~tunekit.backends.triton_kept_files.Recipe`: the kernel's
symbol, warps, shared memory, global scratch, and which of the call's arguments are its
parameters) with the cubin, in memory and in tunekit's cache; the shipped kernel bundles hold the
same files for the shipped choices (``backends/triton_kept_files.py``). Later calls with the same
key launch the cubin through the C extension's ``launch_grid`` (:mod:`tunekit.backends.fast_launch`;
through ctypes while the extension builds) and never reach Triton; a later process finds the file
and loads the cubin with the driver: no Triton import.

The key is finer than Triton's specialization, so a kept cubin runs only where Triton would have
run that very cubin (but for the assembler torch.compile names: ``backends/triton_kept_files.py``):
every scalar argument by type and exact value (Triton bakes constexprs and values of 1 into the
code), every tensor by dtype and whether its address is 16-byte aligned; a call with any other kind
of argument is never kept.

Loading checks the cubin against its recipe through the driver (``cuFuncGetParamInfo``: the count
and size of every parameter, Triton's scratch pointers included), so a recipe that does not fit
its cubin is never launched. A driver without that call (before CUDA 12.4), an unreadable Triton
version, ``TUNEKIT_TRITON_STATIC=0`` or Triton's interpreter leave every launch to Triton, as do
kernels Triton launches with clusters, dependent launch, cooperative grids, profile scratch or
host tensor descriptors.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import struct
import threading

import torch

from . import fast_launch, thread_context
from .cache import warn_once
from .device import raw_stream
from .driver import entry_point, libcuda
from .env import switch
from .triton_kept_files import KERNELS_DIR, Recipe, cubin, cubin_name, file_name, find, keep, triton_version

__all__ = ["NotStatic", "enabled", "call_key", "launch", "load", "record", "recipe_of", "recording", "is_recording",
           "record_launch", "SCRATCH",
           "KERNELS_DIR"]

#: bytes of each Triton parameter type a launch packs (pointers: 8)
_SIZES = {"i32": 4, "u32": 4, "i64": 8, "u64": 8, "fp32": 4}
#: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; dynamic shared memory allowed without it
_MAX_DYNAMIC_SHARED, _DEFAULT_SHARED = 8, 49152


class NotStatic(Exception):
    """A call argument a key cannot describe (a tensor descriptor, a tuple...): Triton launches it."""


@dataclasses.dataclass(frozen=True)
class _Loaded:
    function: int
    recipe: Recipe
    block: int
    extras: int  # Triton's trailing scratch pointers (global, then profile): null or a scratch buffer


_functions: dict = {}  # (device index, cubin name, symbol) -> CUfunction: one module per cubin and device
_MISSING = object()  # looked for and not there: Triton launches (and records it)
_REFUSED = object()  # recorded as a kernel only Triton can launch
_table: dict = {}  # (device index, module, name, key) -> _Loaded | _MISSING | _REFUSED
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def enabled() -> bool:
    """Whether kept kernels are used: the switch, Triton's version known, a driver that can check them."""
    if not switch("TUNEKIT_TRITON_STATIC") or os.environ.get("TRITON_INTERPRET") == "1" or triton_version() is None:
        return False
    try:
        return getattr(libcuda()._lib, "cuFuncGetParamInfo", None) is not None
    except RuntimeError:  # no driver
        return False


_SCALARS = frozenset((int, float, bool, str, type(None)))


def _arg_key(a):
    t = type(a)
    if t is float:  # by its bits' text: -0.0 is not 0.0 (a constexpr of either compiles apart), nan is nan
        return (t, a.hex())
    if t in _SCALARS:
        return (t, a)  # the type too: 1, 1.0 and True are equal keys otherwise
    if isinstance(a, torch.Tensor):
        if not a.is_cuda:
            raise NotStatic("a tensor not on a CUDA device")
        return (a.dtype, a.data_ptr() % 16 == 0)
    raise NotStatic(t.__name__)


def call_key(args: tuple, kwargs: dict) -> tuple:
    """What a kept cubin is for: each argument by type and value, tensors by dtype and alignment."""
    return tuple([_arg_key(a) for a in args]), tuple([(k, _arg_key(v)) for k, v in kwargs.items()])


@functools.lru_cache(maxsize=None)
def _arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


# -- loading and checking ----------------------------------------------------------------------------
def _param_sizes(function: int) -> list[int] | None:
    """The size of each of the kernel's parameters, from the driver; None if it cannot say."""
    driver, sizes = libcuda(), []
    while len(sizes) < 256:
        err, _, size = driver.cuFuncGetParamInfo(function, len(sizes))
        if err == 1:  # CUDA_ERROR_INVALID_VALUE: past the last parameter
            return sizes
        if err:
            return None
        sizes.append(size)
    return None


def _fit(function: int, recipe: Recipe) -> _Loaded | None:
    """The launch of ``recipe`` on ``function`` when the cubin's parameters are the recipe's, followed
    by one or two pointers (Triton's global and profile scratch); else None."""
    sizes = _param_sizes(function)
    if sizes is None or sizes[:len(recipe.sizes)] != list(recipe.sizes):
        return None
    extras = sizes[len(recipe.sizes):]
    if len(extras) not in (1, 2) or any(s != 8 for s in extras):
        return None
    return _Loaded(function, recipe, 32 * recipe.num_warps, len(extras))


def _function(index: int, recipe: Recipe) -> int | None:
    """The recipe's kernel on device ``index`` (the caller made it current): loaded once per cubin
    and device however many keys launch it; None where the cubin is not found or not loaded."""
    key = (index, recipe.cubin, recipe.symbol)
    function = _functions.get(key)
    if function is not None:
        return function
    image = cubin(recipe.cubin)
    if image is None:
        return None
    driver = libcuda()
    thread_context.bind(index)
    with thread_context.capture_relaxed():  # a user's graph capture neither refuses it nor breaks
        err, module = driver.cuModuleLoadData(image)
    if err:
        return None
    err, function = driver.cuModuleGetFunction(module, recipe.symbol.encode())
    if err:
        return None
    if recipe.shared > _DEFAULT_SHARED:
        (err,) = driver.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED, recipe.shared)
        if err:
            return None
    _functions[key] = function
    return function


def load(module: str, name: str, args: tuple, kwargs: dict, index: int | None = None):
    """The kept kernel for this call on device ``index`` (default: the current one, which it must
    be), loaded from memory, tunekit's cache or the shipped bundles; None when Triton must launch
    it. NotStatic for arguments a key cannot hold."""
    index = torch.cuda.current_device() if index is None else index
    full = (index, module, name, call_key(args, kwargs))
    found = _table.get(full)
    if found is None:
        with _lock:
            found = _table.get(full)
            if found is None:
                recipe = find(file_name(module, name, full[3], _arch(index)))
                function = _function(index, recipe) if recipe is not None else None
                found = (_fit(function, recipe) if function else None) or _MISSING
                _table[full] = found
    return None if found is _MISSING or found is _REFUSED else found


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_c_launch = None  # the C extension's launch_grid bound to the driver, once it is loaded
_asked = threading.Event()


def _install(module) -> None:
    global _c_launch
    _c_launch = functools.partial(module.launch_grid, entry_point("cuLaunchKernel"))


def _launcher():
    """The C extension's ``launch_grid`` once loaded; until then :func:`ctypes_launch` (its first
    build takes ~0.2 s of a compiler, on a worker: no call waits for it)."""
    if _c_launch is not None:
        return _c_launch
    if not _asked.is_set():
        _asked.set()
        fast_launch.when_loaded(_install)
    return ctypes_launch


def _slot(v) -> int:
    if v is None:
        return 0
    if type(v) is float:
        return struct.unpack("<I", struct.pack("<f", v))[0]
    return v & 0xFFFFFFFFFFFFFFFF if type(v) is int else v.data_ptr()


@functools.lru_cache(maxsize=None)
def _driver_launch():
    return _LAUNCH(entry_point("cuLaunchKernel"))


def ctypes_launch(function, gx, gy, gz, block, shared, stream, *values, entry=None) -> None:
    """``launch_grid``'s launch through ctypes (``entry``: a cuLaunchKernel stand-in, for tests)."""
    n = len(values)
    slots = (ctypes.c_uint64 * max(n, 1))(*map(_slot, values))
    base = ctypes.addressof(slots)
    params = (ctypes.c_void_p * max(n, 1))(*[base + 8 * i for i in range(n)])
    launch_fn = entry or _driver_launch()
    err = launch_fn(function, gx, gy, gz, block, 1, 1, shared, stream, params, None)
    if err and thread_context.launch_hook():  # no context was current in this thread: now one is
        err = launch_fn(function, gx, gy, gz, block, 1, 1, shared, stream, params, None)
    if err:
        raise RuntimeError(f"cuLaunchKernel failed: CUresult {err}")


class _Recording(threading.local):
    launches: list | None = None


_recording = _Recording()
#: a launch's scratch buffer in a recorded launch's values (allocated per call by whoever replays it)
SCRATCH = object()


@contextlib.contextmanager
def recording():
    """A block in which this thread's launches through :func:`launch` are recorded, not made: yields
    the list that collects them, each ``(function, (gx, gy, gz), block, shared, scratch bytes, values)``
    with :data:`SCRATCH` where the scratch buffer goes (a replay allocates it). A launch only Triton
    could make raises NotStatic: what was recorded is then not the whole sequence
    (``tunekit/ops/gemm/launch_plans.py`` replays recorded sequences from C++)."""
    before, _recording.launches = _recording.launches, []
    try:
        yield _recording.launches
    finally:
        _recording.launches = before


def is_recording() -> bool:
    """Whether this thread is inside :func:`recording` (a launch Triton would make must refuse)."""
    return _recording.launches is not None


def record_launch(function: int, grid: int, block: int, args: tuple) -> bool:
    """Inside :func:`recording`, record a CUDA C kernel's launch (``function`` a CUfunction handle, a 1-D
    grid, no dynamic shared memory, ``args`` tensors and ints as ``CudaKernel.launch`` takes them) and
    return True; elsewhere False, and the caller launches it (``ops/gemm/cuda_decode.py``)."""
    recorded = _recording.launches
    if recorded is None:
        return False
    recorded.append((function, (grid, 1, 1), block, 0, 0, list(args)))
    return True


def launch(module: str, name: str, grid: tuple, args: tuple, kwargs: dict) -> bool:
    """Launch ``name`` of ``tunekit.kernels.triton.<module>`` on the current device's current stream
    as Triton would for ``kernel[grid](*args, **kwargs)``, when a kept kernel fits; False when Triton
    must launch it. Inside :func:`recording`, record it instead."""
    recorded = _recording.launches
    found = None
    if not callable(grid):
        index = torch.cuda.current_device()
        try:
            found = load(module, name, args, kwargs, index)
        except NotStatic:
            pass
    if found is None:
        if recorded is not None:
            raise NotStatic(f"{name}: no kept kernel for these arguments (Triton would launch it)")
        return False
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    if gx * gy * gz == 0:  # Triton launches nothing for an empty grid
        return True
    r = found.recipe
    values = [args[p] if type(p) is int else kwargs[p] for p in r.passed]
    if recorded is not None:
        extras = (SCRATCH if r.scratch else None, None)[:found.extras]
        recorded.append((found.function, (gx, gy, gz), found.block, r.shared, gx * gy * gz * r.scratch, [*values, *extras]))
        return True
    scratch = None
    if r.scratch:  # per program, as Triton's launcher allocates it; freed in stream order
        scratch = torch.empty(gx * gy * gz * r.scratch, dtype=torch.uint8, device=index)
    extras = (scratch, None)[:found.extras]
    _launcher()(found.function, gx, gy, gz, found.block, r.shared, raw_stream(index), *values, *extras)
    return True


# -- recording what Triton built -----------------------------------------------------------------------
def _packs_as(value, ty: str) -> bool:
    """Whether ``launch_grid`` packs ``value`` as Triton passes a parameter of type ``ty``."""
    if ty.startswith("*"):
        return isinstance(value, torch.Tensor)
    if ty == "fp32":
        return type(value) is float
    return type(value) is int


def recipe_of(arg_names, compiled, args: tuple, kwargs: dict) -> Recipe | str:
    """The recipe of a Triton ``CompiledKernel`` built for ``fn(*args, **kwargs)`` (``arg_names``:
    the kernel's parameter names in order), or why it cannot be launched without Triton."""
    md = compiled.metadata
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_pdl", False) or getattr(md, "launch_cooperative_grid", False):
        return "launched with clusters, dependent launch or a cooperative grid"
    if getattr(md, "profile_scratch_size", 0) or getattr(md, "tensordesc_meta", None):
        return "profile scratch or host tensor descriptors"
    signature = compiled.src.signature
    if list(signature) != list(arg_names):
        return "parameters differ from the kernel's"
    passed, sizes = [], []
    for i, pname in enumerate(arg_names):
        ty = signature[pname]
        if ty == "constexpr":
            continue
        size = 8 if ty.startswith("*") else _SIZES.get(ty)
        if size is None:
            return f"parameter {pname} of type {ty}"
        if i < len(args):
            passed.append(i)
            value = args[i]
        elif pname in kwargs:
            passed.append(pname)
            value = kwargs[pname]
        else:
            return f"parameter {pname} left to its default"
        if not _packs_as(value, ty):
            return f"parameter {pname} of type {ty} given a {type(value).__name__}"
        sizes.append(size)
    return Recipe(md.name, int(md.num_warps), int(md.shared), int(getattr(md, "global_scratch_size", 0) or 0),
                  tuple(passed), tuple(sizes), cubin_name(compiled.asm["cubin"]))


def record(module: str, name: str, arg_names, compiled, args: tuple, kwargs: dict) -> None:
    """Keep what Triton just built and loaded for this call (``compiled``, its handles initialised)
    so later calls and processes launch it without Triton; a kernel that cannot be is remembered
    as such. Never raises: keeping is an optimisation."""
    try:
        key = call_key(args, kwargs)
    except NotStatic:  # arguments no key describes: Triton launches every such call
        return
    try:
        index = torch.cuda.current_device()
        full = (index, module, name, key)
        if _table.get(full, _MISSING) is not _MISSING:
            return
        recipe = recipe_of(arg_names, compiled, args, kwargs)
        function = int(getattr(compiled, "function", 0) or 0)
        loaded = _fit(function, recipe) if isinstance(recipe, Recipe) and function else None
        with _lock:
            _table[full] = loaded or _REFUSED
            if loaded is not None:
                _functions.setdefault((index, recipe.cubin, recipe.symbol), function)
        if loaded is not None:
            keep(file_name(module, name, key, _arch(index)), recipe, compiled.asm["cubin"])
    except Exception as exc:  # noqa: BLE001 - Triton's objects moved: Triton keeps launching
        warn_once("static-record", f"tunekit: Triton kernels keep launching through Triton ({exc!r})")


def forget() -> None:
    """Drop the loaded kernels' table (tests)."""
    with _lock:
        _table.clear()
        _functions.clear()
