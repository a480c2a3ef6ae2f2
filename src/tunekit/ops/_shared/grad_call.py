"""An activation's differentiable call through C++ (``backends/fast_grad.cpp``): the tuned forward
runner on the input, and torch's own autograd node for it (``SiluBackward0`` / ``GeluBackward0``:
torch's backward kernel, at torch's host cost, known to double backward and compiled autograd). It
stands in front of the op's Python ``torch.autograd.Function`` and gives None where it does not take
the call (the extension not built yet or not buildable, no runner cached for the input, a forward-mode
tangent), so the Function, with tunekit's tuned backward, runs every other call.

``backends/fast_grad.py`` says why (the Function's host time). The extension is built on a worker at
the op's first differentiable call; until it is in place every call takes the Function.
"""

from __future__ import annotations

from ...backends import fast_grad

__all__ = ["GradCall"]


def _not_taken(*args):
    return None


class GradCall:
    """``grad_call.call(x[, approximate])``: ``y`` with torch's grad_fn, or None. ``op``: the tunable op
    of the forward (its ``fast_call`` is looked up on each call: it is replaced once its own extension
    is installed); ``kind``: "silu" or "gelu", the torch node to record."""

    def __init__(self, op, kind: str):
        self.op, self.kind = op, kind
        self.call = self._first

    def _first(self, x, *extra):
        self.call = _not_taken
        fast_grad.when_loaded(self._install)
        return self.call(x, *extra)

    def _install(self, module) -> None:
        op = self.op

        def forward(x, *extra):
            return op.fast_call(x, *extra)
        self.call = module.GradCall(forward, self.kind)
