"""The GEMM family's route to torch's own functions in C++ (``fast_gemm.cpp``: ``GemmRoute``).

Why C++: a GEMM call that tunekit answers with torch's own kernel should cost what torch's call
costs. Deciding that takes the call's layout (each operand's sizes, strides, alignment, whether it
requires grad): read through torch's Python accessors it costs more host time than torch's whole
call, while from the ``at::Tensor`` it is a few field reads, and torch's function is then called
without a Python frame (``at::linear``: torch's result and torch's own autograd node).
``tunekit/ops/gemm/routes.py`` decides which layouts are routed; form 6 does the same for rms_norm
(``at::rms_norm``, ``tunekit/ops/rms_norm/route.py``).

Built like :mod:`tunekit.backends.fast_call` (the same compiler, flags, cache and ``TUNEKIT_FAST_CALL``
switch: off, or not buildable, and no call is routed: the general path runs, with the same results),
on a worker thread at the first GEMM call, never waited for.
"""

from __future__ import annotations

import threading

from . import extension
from .fast_call import _flags

__all__ = ["build", "load", "loaded", "unavailable", "when_loaded", "Installer"]

_extension = extension.built_at_first_use("fast_gemm.cpp", "tunekit_fast_gemm", flags=_flags,
                                          thread_name="tunekit-fast-gemm-build")
#: see extension.built_at_first_use: build, load (``GemmRoute``), loaded, unavailable, when_loaded
build, _load, load, loaded, unavailable, when_loaded = (
    _extension.build, _extension._load, _extension.load, _extension.loaded, _extension.unavailable,
    _extension.when_loaded)


class Installer:
    """A route module's ``install(module)``: :meth:`start` asks for it once the extension is loaded (built
    on the worker, the first time only), :meth:`ready` builds and installs now, waiting (tests and
    benchmarks, which must not depend on when a build ends), and says whether it is in place."""

    def __init__(self, install):
        self.install, self.started, self._lock = install, False, threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.started:
                return
            self.started = True
        when_loaded(self.install)

    def ready(self) -> bool:
        with self._lock:
            self.started = True
        module = load()
        if module is not None:
            self.install(module)
        return module is not None
