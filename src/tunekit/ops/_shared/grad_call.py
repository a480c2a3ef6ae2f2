"""An op's differentiable call through C++ (``backends/fast_grad.cpp``): the tuned forward on the
input, and torch's own autograd node for it (``SiluBackward0`` / ``GeluBackward0`` /
``LogsumexpBackward0``: torch's backward, at torch's host cost, known to double backward and compiled
autograd). It stands in front of the op's Python ``torch.autograd.Function`` and gives None where it
does not take the call (the extension not built yet or not buildable, a forward-mode tangent, a
result that is not a fresh tensor), so the Function, with tunekit's tuned backward, runs every other
call. The ops' forwards take the cached runner, else their general call (a Triton choice has no
runner: with the Function instead, its Python host cost took a LLaMA-style step to 0.90x).

``backends/fast_grad.py`` says why (the Function's host time). The extension is built on a worker at
the op's first differentiable call; until it is in place every call takes the Function.

Once it is, silu's and gelu's C++ fast calls take a tensor requiring grad themselves (their
:func:`recorder_slot` filled with the extension's ``silu_call`` / ``gelu_call``): the cached runner
and torch's node in one C++ call, without the op's Python function, this call and its Python forward
around it (with a CUDA C choice, gelu tanh's forward + backward cost 1.051x F.gelu's host time that
way on the H100 host).
"""

from __future__ import annotations

from ...backends import fast_grad

__all__ = ["GradCall", "recorder_slot"]

#: per kind, the list a fast call reads its recorder from (``backends/fast_call.cpp``): [None] until
#: the extension is installed
_RECORDERS = {"silu": [None], "gelu": [None]}


def recorder_slot(kind: str) -> list:
    """The recorder slot of ``kind`` ("silu" or "gelu") for the op's fast calls (``make_fast_call``)."""
    return _RECORDERS[kind]


def _not_taken(*args):
    return None


class GradCall:
    """``grad_call.call(x, *extra)``: ``y`` with torch's grad_fn, or None. ``forward(x, *extra)``: the
    forward on ``x`` (detached) giving ``y`` or None, e.g. ``lambda x: op.fast_call(x)`` (looked up on
    each call: the fast call is replaced once its own extension is installed); ``kind``: "silu",
    "gelu" (extra: approximate) or "logsumexp" (extra: the normalized dims as a tuple, keepdim), the
    torch node to record; ``backward_op``: the op whose tuning sessions the Function's backward may have
    started before the extension was in place (dropped then: no call returns to them, and each held
    copies of its inputs: 46 MB for a LLaMA-style step's silu backward)."""

    def __init__(self, forward, kind: str, backward_op=None):
        self.forward, self.kind, self.backward_op = forward, kind, backward_op
        self.call = self._first

    def _first(self, x, *extra):
        self.call = _not_taken
        fast_grad.when_loaded(self._install)
        return self.call(x, *extra)

    def _install(self, module) -> None:
        self.call = module.GradCall(self.forward, self.kind)
        if self.kind in _RECORDERS:
            _RECORDERS[self.kind][0] = getattr(module, f"{self.kind}_call")
        if self.backward_op is not None:
            self.backward_op.forget(sessions_only=True)
