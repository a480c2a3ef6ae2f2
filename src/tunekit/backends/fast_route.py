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

__all__ = ["build", "load", "loaded", "when_loaded"]

_MODULE = "tunekit_fast_route"


def build(directory=None, rebuild: bool = False) -> str:
    """Compile the extension (or find it built); its path. RuntimeError when it cannot be built."""
    return extension.build("fast_route.cpp", _MODULE, cxx=True, flags=_flags(), directory=directory, rebuild=rebuild)


@extension.once
def _load():
    return extension.load_or_reason(build, _MODULE, "TUNEKIT_FAST_CALL")


def load():
    """The built extension module (``configure``, ``takes``), or None when it is off or cannot be built."""
    return _load()[0]


def loaded():
    """The module if it is loaded already, else None: never waits for a build."""
    return load() if _load.done() else None


#: ``when_loaded(install)``: ``install(module)`` once the extension is loaded (see fast_grad.when_loaded)
when_loaded = extension.when_loaded_by(_load, "tunekit-fast-route-build")
