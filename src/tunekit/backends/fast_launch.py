"""The host side of a kernel launch, kept short: a ~60-line CPython extension (``fast_launch.c``)
that packs the arguments and calls the driver's ``cuLaunchKernel`` directly.

Why: on a cached signature most of a small op's time is host time, and the bar is torch's own
``F.silu`` on the same tensor. The driver call through cuda-bindings pays for Python-level argument
objects on every call, more again with the argument packing done in Python, and a ctypes call
more still; a METH_FASTCALL C function leaves only the driver's own cost. The host time of each
path (``benchmarks/suites/launch_overhead.py``): ``docs/measurements.md``.

The extension is compiled at first use (:mod:`tunekit.backends.extension`: the system C compiler,
``$CC`` else ``cc`` / ``gcc`` / ``clang``, and Python's headers, cached next to the cubins). Nothing
here needs CUDA headers or a GPU, so CI builds and tests it (through a stand-in entry point with
cuLaunchKernel's signature).

If it cannot be built (no compiler, no Python headers, a cache folder others can write) or
``TUNEKIT_FAST_LAUNCH`` is off (0/false/no/off; any other value raises
:class:`~tunekit.backends.env.SettingError` at the first load), :func:`load` returns None,
:func:`unavailable` says why, and kernels launch through cuda-bindings instead: slower on the host,
the same on the device. A thread whose first CUDA work is a launch gets the device's primary
context bound after the driver refuses it, and the launch retried (``set_context_hook``).
"""

from __future__ import annotations

import os

from . import extension, thread_context
from .driver import entry_point

__all__ = ["load", "unavailable", "build", "driver_entry_point", "when_loaded"]

_MODULE = "tunekit_fast_launch"


def build(directory: str | os.PathLike | None = None, rebuild: bool = False) -> str:
    """Compile the extension (or find it already built); return the shared library's path.
    Raises RuntimeError with the compiler's output when it cannot be built; ``rebuild`` replaces a
    cached build (one that would not load)."""
    return extension.build("fast_launch.c", _MODULE, flags=("-Wall", "-Werror"), directory=directory, rebuild=rebuild)


@extension.once
def _load():
    module, reason = extension.load_or_reason(build, _MODULE, "TUNEKIT_FAST_LAUNCH")
    if module is not None:  # a thread with no current context: bound after its first refused launch
        module.set_context_hook(thread_context.launch_hook)
    return module, reason


def load():
    """The built extension module (its ``launch`` function), or None (see :func:`unavailable`)."""
    return _load()[0]


#: ``when_loaded(install)``: ``install(module)`` once the extension is loaded, built on a worker of its
#: own meanwhile (kept Triton launches go through ctypes until then: ``backends/triton_static.py``)
when_loaded = extension.when_loaded_by(_load, "tunekit-fast-launch")


def unavailable() -> str | None:
    """None when the extension is in use, else why not."""
    return _load()[1]


def driver_entry_point(symbol: str = "cuLaunchKernel") -> int:
    """The driver's ``symbol`` the extension calls (:func:`tunekit.backends.driver.entry_point`)."""
    return entry_point(symbol)
