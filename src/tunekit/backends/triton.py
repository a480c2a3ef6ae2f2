"""Triton kernels at run time: the kernel modules of ``tunekit/kernels/triton`` imported at first use,
and the checks every Triton candidate shares.

Why lazily: ``import tunekit`` never imports Triton (it costs time and is an optional extra), and
tests can set ``TRITON_INTERPRET=1`` (run the kernels on CPU tensors in Triton's interpreter) before
a kernels module is imported and its kernels decorated. A kernel is named by a :class:`KernelRef`
(its module and name, read from the module's text): a launch that finds the kernel kept for its
arguments (:mod:`tunekit.backends.triton_static`) never imports Triton; the others resolve the
reference and launch through Triton, which then keeps what it built.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import threading

import torch

from . import thread_context, triton_compile, triton_static
from .shipped_kernels import seed_triton_cache
from ..tunable.preparations import NeedsCompiler, compilers_allowed

__all__ = ["NO_TRITON", "KernelRef", "kernel", "interpreted", "device_problem", "on_device", "launch", "warming"]

NO_TRITON = "needs triton (pip install 'tunekit[triton]')"


@functools.lru_cache(maxsize=None)
def _installed() -> bool:
    return importlib.util.find_spec("triton") is not None


#: a ``@triton.jit`` (or ``@jit``, with or without arguments on its line) function's name, below any
#: further one-line decorators
_JIT_DEF = re.compile(r"^@(?:triton\.)?jit\b[^\n]*\n(?:@[^\n]*\n)*def[ \t]+(\w+)", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def _jit_names(module: str) -> frozenset[str]:
    """The ``@triton.jit`` functions of ``tunekit/kernels/triton/<module>.py``, read from its text (no
    import) with a regular expression: ``ast.parse`` of the module took 3-5 ms of a process's first
    call (H100 host); the tests hold both readings equal on every kernels module."""
    return frozenset(_JIT_DEF.findall((triton_static.KERNELS_DIR / f"{module}.py").read_text()))


@functools.lru_cache(maxsize=None)
def _literals(module: str) -> dict:
    """The module's top-level constants written as literals, read from its text (a GEMM launch reads
    ``ACTIVATIONS``: importing the module for it would import Triton)."""
    tree = ast.parse((triton_static.KERNELS_DIR / f"{module}.py").read_text())
    literals = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                literals[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return literals


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """A ``@triton.jit`` kernel of ``tunekit.kernels.triton.<module>`` by name: what :func:`launch`
    takes. :meth:`resolve` imports Triton and the module (only where a kept kernel will not do)."""

    module: str
    name: str

    def resolve(self):
        module = _module(self.module)
        if module is None:
            raise RuntimeError(f"{self.name}: Triton is installed but cannot be imported")
        return getattr(module, self.name)


@functools.lru_cache(maxsize=None)
def _module(name: str):
    """``tunekit.kernels.triton.<name>``, or None without Triton. A broken kernels module raises:
    it must not read as "no triton"."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    module = importlib.import_module(f"tunekit.kernels.triton.{name}")
    triton_compile.hash_triton_key()  # Triton's first cache lookup needs it: hashed from now, beside the rest
    return module


@functools.lru_cache(maxsize=None)
def kernel(module: str, name: str):
    """``name`` of ``tunekit.kernels.triton.<module>``: a :class:`KernelRef` for a ``@triton.jit``
    function, a constant written as a literal (neither imports anything), else the module's
    attribute (Triton imported); None without Triton."""
    if not _installed():
        return None
    if name in _jit_names(module):
        return KernelRef(module, name)
    literals = _literals(module)
    if name in literals:
        return literals[name]
    found = _module(module)
    return None if found is None else getattr(found, name)


def interpreted(fn) -> bool:
    """True when ``fn`` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    if isinstance(fn, KernelRef):
        fn = fn.resolve()
    return type(fn).__name__ == "InterpretedFunction"


def device_problem(device: torch.device, fn=None) -> str | None:
    """Why a Triton kernel cannot run on ``device`` (None when it can): a CUDA device, or the CPU in
    Triton's interpreter; ``fn`` (the kernel, if already loaded) must have been decorated for it."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not (device.type == "cpu" and interpreting):
        return "needs a CUDA device (or TRITON_INTERPRET=1 for CPU tensors)"
    if device.type == "cpu" and fn is not None and not interpreted(fn):
        return "Triton kernels were compiled for the GPU (TRITON_INTERPRET=1 set after they loaded)"
    return None


def on_device(device: torch.device):
    """A context in which launches go to ``device``: Triton launches on the current device's current
    stream, so another CUDA device is made current for the launch."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


class _Warming(threading.local):
    active = False


_warming = _Warming()
_compiling: dict[int, threading.Lock] = {}  # id(kernel) -> the lock its warm-up compiles hold
_compiling_lock = threading.Lock()


def launch(fn, grid, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)`` (``fn``: a :class:`KernelRef` or a ``@triton.jit`` function);
    inside :func:`warming`, compile and load for these arguments without launching.

    A reference whose kernel is kept for these arguments (:mod:`tunekit.backends.triton_static`)
    launches, or loads, without Triton; where none is and :func:`warming` was asked for kept
    builds only, NeedsCompiler. Otherwise Triton launches, or compiles (Triton's ``warmup``: the
    same specialization a launch would compile and cache), and what it built is kept. Warm-up
    compiles of one kernel function run one at a time (its cache of specializations is shared);
    different functions compile at once on several worker threads, each compile done by a worker
    process where it can be (:mod:`tunekit.backends.triton_compile`: a compile on a thread takes the
    GIL from the caller's calls). The warm-up also loads the compiled module onto the device
    (milliseconds per kernel that a first launch, inside a tuning check, would otherwise pay); a
    kernel the device cannot hold (shared memory) raises here."""
    ref = fn if type(fn) is KernelRef else None
    if ref is not None and not _warming.active:
        if triton_static.enabled() and triton_static.launch(ref.module, ref.name, grid, args, kwargs):
            return
    elif ref is not None:
        if triton_static.enabled() and _kept(ref, args, kwargs):
            return
        if not compilers_allowed():
            raise NeedsCompiler(f"{ref.name}: no kept build for these arguments")
    if triton_static.is_recording():  # a launch only Triton makes: no recorded sequence holds it
        raise triton_static.NotStatic("a launch through Triton while launches are recorded")
    jit = ref.resolve() if ref is not None else fn
    if not (_warming.active and not interpreted(jit)):
        compiled = jit[grid](*args, **kwargs)
    else:
        compiled = _warm_up(jit, grid, args, kwargs)
    if ref is not None and compiled is not None and not interpreted(jit) and triton_static.enabled():
        triton_static.record(ref.module, ref.name, jit.arg_names, compiled, args, kwargs)


def _kept(ref: KernelRef, args, kwargs) -> bool:
    try:
        return triton_static.load(ref.module, ref.name, args, kwargs) is not None
    except triton_static.NotStatic:
        return False


def _warm_up(fn, grid, args, kwargs):
    """Compile (or find) and load ``fn``'s kernel for these arguments; the CompiledKernel."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        seed_triton_cache()
    with _compiling_lock:
        lock = _compiling.setdefault(id(fn), threading.Lock())
    with lock:
        built = triton_compile.compile_elsewhere(fn, grid, args, kwargs)
        triton_compile.wait_for_key()
        compiled = fn.warmup(*args, grid=grid, **kwargs)
        triton_compile.confirm(fn, built, compiled)
    load = getattr(compiled, "_init_handles", None)  # Triton's own first-launch step (3.x)
    if load is not None:
        load()
    return compiled


@contextlib.contextmanager
def warming(device: torch.device | None = None):
    """A block in which this thread's Triton launches (through :func:`launch`) only compile and load:
    what a candidate's ``prepare`` runs on a worker thread, so a later launch finds its kernel ready.
    ``device`` is made current for the block (a worker thread starts on device 0). The shipped
    Triton builds are copied into Triton's cache first (once per process:
    :func:`tunekit.backends.shipped_kernels.seed_triton_cache`, at its first Triton compile), so a
    shipped kernel loads instead of compiling."""
    before, _warming.active = _warming.active, True
    try:  # capture_relaxed: its loads and allocations never break a user's CUDA graph capture
        with on_device(device) if device is not None else contextlib.nullcontext(), thread_context.capture_relaxed():
            yield
    finally:
        _warming.active = before
