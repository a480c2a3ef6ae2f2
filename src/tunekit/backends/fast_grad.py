"""Activations' differentiable cached call in C++ (``fast_grad.cpp``: ``GradCall``).

Why C++: through a Python ``torch.autograd.Function``, a tunekit activation and its backward cost
37 us more host time per call than ``F.gelu`` (CPU host, 8 x 256 float32): the Function's own
machinery (``apply``, ``ctx``, the Python node in backward) and tunekit's settings capture. A
training step that is host-bound paid that on every activation: a GPT-2-style step with the default
``tunekit.patch()`` ran 0.92x torch's (``benchmarks/results/model_step-NVIDIA_H200.md`` of
2026-11-24). ``GradCall`` runs the forward through the op's fast call (the cached runner) and gives
the result torch's own autograd node (``fast_grad.cpp`` says why torch's and not one of tunekit's).

Built like :mod:`tunekit.backends.fast_call` (the same compiler, flags, cache and ``TUNEKIT_FAST_CALL``
switch: off, or not buildable, and the Python Function runs, with the same results), on a worker
thread at an op's first differentiable call, never waited for.
"""

from __future__ import annotations

from . import extension
from .fast_call import _flags

__all__ = ["build", "load", "loaded", "when_loaded"]

_MODULE = "tunekit_fast_grad"


def build(directory=None, rebuild: bool = False) -> str:
    """Compile the extension (or find it built); its path. RuntimeError when it cannot be built."""
    return extension.build("fast_grad.cpp", _MODULE, cxx=True, flags=_flags(), directory=directory, rebuild=rebuild)


@extension.once
def _load():
    return extension.load_or_reason(build, _MODULE, "TUNEKIT_FAST_CALL")


def load():
    """The built extension module (``GradCall``), or None when it is off or cannot be built. May build: seconds."""
    return _load()[0]


def loaded():
    """The module if it is loaded already, else None: never waits for a build."""
    return load() if _load.done() else None


#: ``when_loaded(install)``: ``install(module)`` once the extension is loaded: now if it is, else from this
#: module's one worker thread, which builds it; never when it cannot be built
when_loaded = extension.when_loaded_by(_load, "tunekit-fast-grad-build")
