"""A tunable op's cached call in C++ (``fast_call.cpp``): ``FastCall``, the fast path's lookup
(tunekit/tunable/fast_path.py), and ``Launcher``, a CUDA C kernel's runner (allocation and launch).

Why C++ against libtorch, not C: on a cached call of a small op host time is the whole cost, and
the bar is torch's own ``F.silu`` on the same tensor. Building the cache key reads six facts of the
tensor; read through torch's Python accessors (all a C extension has) they keep a cached call's
host time above ``F.silu``'s, while from the ``at::Tensor`` they are plain field reads. The runner
likewise allocates with ``at::empty_like`` and launches without a Python frame between them. The
host times: ``docs/measurements.md`` (host time of a cached call).

Built at first use, on a worker thread (:func:`make_fast_call`), like the C launch extension
(:mod:`tunekit.backends.extension`), with the C++ compiler (``$CXX``, else ``c++`` / ``g++`` / ``clang++``), torch's headers and libraries, and keyed by
torch's version and ABI too (~15 s the first time on a 2-core machine; cached after that). It
needs no CUDA headers: CI builds and tests it on the CPU (the launch through a stand-in driver entry
point). If it cannot be built, or ``TUNEKIT_FAST_CALL`` is off (0/false/no/off; any other value
raises :class:`~tunekit.backends.env.SettingError` at the first load), :func:`load` returns None,
:func:`unavailable` says why, and the Python fast path and runners are used instead: the same
results, more host time. Its ``Launcher`` works from any thread, as the C launch does (a context
bound after a refused launch, which is retried: ``set_context_hook``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import extension, thread_context
from .env import switch
from ..tunable import context
from ..tunable.fast_path import python_fast_call

__all__ = ["load", "loaded", "start_loading", "unavailable", "build", "make_fast_call"]

_MODULE = "tunekit_fast_call"
_loading: Future | None = None
_loading_lock = threading.Lock()


def _flags() -> tuple[str, ...]:
    """Compiler flags for libtorch: the include and library directories of the torch imported here.

    Why not ``torch.utils.cpp_extension.include_paths()``: importing ``cpp_extension`` (setuptools
    and friends) costs a noticeable fraction of a second in every fresh process, even with the
    extension built, and offline tuning pays it again in every worker. The directories are fixed
    parts of torch's install, the same two ``cpp_extension`` names for a CPU or CUDA build."""
    root = os.path.dirname(torch.__file__)
    include = os.path.join(root, "include")
    lib = os.path.join(root, "lib")
    return (f"-I{include}", f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}", "-std=c++17", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-DTUNEKIT_TORCH={torch.__version__}",
            f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10")


def build(directory: str | os.PathLike | None = None, rebuild: bool = False) -> str:
    """Compile the extension (or find it already built); return the shared library's path.
    Raises RuntimeError with the compiler's output when it cannot be built; ``rebuild`` replaces a
    cached build (one that would not load)."""
    return extension.build("fast_call.cpp", _MODULE, cxx=True, flags=_flags(), directory=directory, rebuild=rebuild)


@extension.once
def _load():
    module, reason = extension.load_or_reason(build, _MODULE, "TUNEKIT_FAST_CALL")
    if module is not None:  # a thread with no current context: bound after its first refused launch
        module.set_context_hook(thread_context.launch_hook)
    return module, reason


def load():
    """The built extension module (``FastCall``, ``Launcher``), or None (see :func:`unavailable`)."""
    return _load()[0]


def unavailable() -> str | None:
    """None when the extension is in use, else why not."""
    return _load()[1]


def loaded():
    """The extension module if it is loaded already, else None: never waits for a build (a runner
    made meanwhile uses the C launch; the op's dispatcher switches when the build is done)."""
    return load() if _load.done() else None


def start_loading() -> None:
    """Start building and loading the extension on its own worker thread (once): what a candidate's
    preparation asks for, without waiting 12-14 s for a machine's first build."""
    _load_in_background()


def _load_in_background() -> Future:
    """:func:`load` on a worker thread, started once: the Future of the module (or None)."""
    global _loading
    with _loading_lock:
        if _loading is None:
            _loading = ThreadPoolExecutor(1, thread_name_prefix="tunekit-fast-call-build").submit(load)
        return _loading


def make_fast_call(runners: dict, install, differentiable: frozenset = frozenset(), *,
                   recorder: list | None = None) -> None:
    """``install`` a ``fast_call`` over ``runners`` (``{settings.cache_id: {cache key: runner}}``;
    ``differentiable``: those that may take a tensor requiring grad, ``tunable/fast_path.py``):
    the C++ ``FastCall`` once the extension is loaded, the runtime's Python one (the same steps)
    until then, and for good where it does not build. ``recorder``: a list whose item 0 becomes the
    C++ call giving any runner's result torch's autograd node (``ops/_shared/grad_call.py``), so
    that the C++ ``FastCall`` takes a tensor requiring grad too (the Python one leaves it to the op).

    Why on a worker: building takes seconds the first time on a machine (12-14 s measured on the
    H100 machine), and the call that caches an op's first runner must not wait for the compiler."""
    def install_for(module) -> None:
        install(python_fast_call(runners, differentiable) if module is None else
                module.FastCall(runners, context._current, context, torch.Tensor, differentiable,
                                **({} if recorder is None else {"recorder": recorder})))

    if _load.done() or not switch("TUNEKIT_FAST_CALL"):  # a bad value raises SettingError here
        install_for(load())
        return
    install_for(None)

    def when_loaded(done: Future) -> None:  # on the worker; nothing to replace if it did not build
        if done.exception() is None and done.result() is not None:
            install_for(done.result())
    _load_in_background().add_done_callback(when_loaded)
