"""``routing.takes``'s checks in C++ (``fast_route.cpp``: ``takes``).

Why C++: a patched ``F.silu`` / ``F.gelu`` (and a drop-in module's forward) asks
:func:`tunekit.ops._shared.routing.takes` on every call whether tunekit may take it: about ten
checks, each a C call or attribute read behind a Python frame, about 1 us a call on a 2-core CPU
host, the whole difference between a patched ``F.silu`` and ``tunekit.silu``. In C++ they are field
reads. ``torch.compiler.is_compiling()`` stays in Python, first: dynamo folds it and never meets
the C++ function.

Built like :mod:`tunekit.backends.fast_call` (the same compiler, flags, cache and ``TUNEKIT_FAST_CALL``
switch: off, or not buildable, and the Python checks run, with the same answers), on a worker
thread at the first routing question, never waited for.
"""

from __future__ import annotations

from . import extension
from .fast_call import _flags

__all__ = ["build", "load", "loaded", "unavailable", "when_loaded"]

_extension = extension.built_at_first_use("fast_route.cpp", "tunekit_fast_route", flags=_flags,
                                          thread_name="tunekit-fast-route-build")
#: see extension.built_at_first_use: build, load (``configure``, ``takes``), loaded, unavailable, when_loaded
build, _load, load, loaded, unavailable, when_loaded = (
    _extension.build, _extension._load, _extension.load, _extension.loaded, _extension.unavailable,
    _extension.when_loaded)
