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

_extension = extension.built_at_first_use("fast_grad.cpp", "tunekit_fast_grad", flags=_flags,
                                          thread_name="tunekit-fast-grad-build")
#: see extension.built_at_first_use: build, load (``GradCall`` and the recorders), loaded, when_loaded
build, _load, load, loaded, when_loaded = (_extension.build, _extension._load, _extension.load, _extension.loaded,
                                           _extension.when_loaded)
