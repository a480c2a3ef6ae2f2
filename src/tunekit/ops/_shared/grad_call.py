"""An elementwise op's differentiable call through C++ (``backends/fast_grad.cpp``): the cached
forward runner on the input, and a C++ autograd node whose backward calls the op's backward
function. It stands in front of the op's Python ``torch.autograd.Function`` and gives None where it
does not take the call (the extension not built yet or not buildable, no runner cached for the
input, a forward-mode tangent), so the Function still runs every other call, with the same results.

``backends/fast_grad.py`` says why (the Function's host time). The extension is built on a worker at
the op's first differentiable call; until it is in place every call takes the Function.
"""

from __future__ import annotations

from typing import Callable

from ...backends import fast_grad
from ...tunable import context

__all__ = ["GradCall"]


def _not_taken(*args):
    return None


class GradCall:
    """``grad_call(x[, extra])``: ``y`` with its C++ grad_fn (named ``name``), or None.

    ``op``: the tunable op of the forward (its ``fast_call`` is looked up on each call: it is replaced
    when its own extension is installed); ``backward(dy, x[, extra])``: the op's backward function."""

    def __init__(self, op, backward: Callable, name: str):
        self.op, self.backward, self.name = op, backward, name
        self.call = self._first

    def __call__(self, x, *extra):
        return self.call(x, *extra)

    def _first(self, x, *extra):
        self.call = _not_taken
        fast_grad.when_loaded(self._install)
        return self.call(x, *extra)

    def _install(self, module) -> None:
        op = self.op

        def forward(x, *extra):
            return op.fast_call(x, *extra)
        self.call = module.GradCall(forward, self.backward, context._current, self.name)
