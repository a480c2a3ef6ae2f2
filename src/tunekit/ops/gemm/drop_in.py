"""The GEMM family in code you did not write: ``tunekit.nn.Linear`` and the ``tunekit.patch()``
replacements of ``torch.nn.functional.linear``, ``torch.matmul`` and ``torch.nn.Linear.forward``.

A call is routed to tunekit only where tunekit computes what torch's function computes, with the
same kernel sequence when tuning is off (``ops/_shared/routing.py`` gives the general rule):

- linear: a 2-D input (torch: one addmm / mm); an input of more dims whose leading dims fold into
  rows without a copy, and, with a bias, a contiguous input (torch folds exactly those into one
  addmm / mm; other layouts it runs as a batched GEMM, or a GEMM and then an add, which stay torch's);
- matmul: 2-D @ 2-D, N-D @ 2-D that folds without a copy, 3-D @ 3-D of one batch size (torch's
  mm / bmm); vectors, broadcast batches, 4-D and more, and ``out=`` stay torch's;
- both only for plain float tensors of one dtype and device (``checks.py``), with the routing rule's
  conditions on the input (no compile / trace / mode / functorch / forward AD / "inside tunekit"),
  and not under autocast (torch's function casts first).

Before those checks, a call whose layout tunekit answers with torch's own kernels goes to torch's
function from C++ (``routes.py``): torch's result under every mode and transform, at torch's host
cost. ``torch.compiler.is_compiling()`` comes first, so dynamo never traces the C++ call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import routes
from .functions import learnt_linear, learnt_matmul, linear_form, linear_taken, matmul_form, matmul_taken
from .._shared import routing

_is_compiling = torch.compiler.is_compiling

__all__ = ["Linear", "routed_linear", "routed_matmul", "linear_routable", "patched_linear", "patched_matmul",
           "patched_linear_forward"]


def _folds(x: torch.Tensor) -> bool:
    """Whether ``x``'s leading dims fold into one without a copy (``x.view(-1, x.shape[-1])``)."""
    for i in range(x.dim() - 2):
        if x.stride(i) != x.stride(i + 1) * x.shape[i + 1]:
            return False
    return True


def linear_routable(x, weight, bias) -> bool:
    """F.linear(x, weight, bias) that tunekit computes as torch does (module docstring)."""
    if not (routing.takes(x) and linear_form(x, weight, bias)):
        return False
    if x.dim() == 2:
        return True
    return x.is_contiguous() if bias is not None else _folds(x)


def routed_linear(x, weight, bias) -> torch.Tensor:
    """The tuned linear for a call routed from torch's entry points, with the "inside tunekit" flag
    set so the torch functions tunekit calls reach torch while patched."""
    state = routing.state
    state.inside = True
    try:
        return learnt_linear(x, weight, bias, linear_taken(x, weight, bias, "none"))
    finally:
        state.inside = False


def _matmul_routable(x, other) -> str | None:
    if not routing.takes(x):
        return None
    form = matmul_form(x, other)
    if form == "fold":
        return form if _folds(x) else None
    if form == "batch" and x.shape[0] == other.shape[0]:
        return form
    return None


def routed_matmul(x, other, form: str) -> torch.Tensor:
    state = routing.state
    state.inside = True
    try:
        return learnt_matmul(x, other, form, matmul_taken(x, other, form))
    finally:
        state.inside = False


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward runs :func:`tunekit.linear` for the inputs where tunekit gives
    torch's results, torch's own forward for any other. A subclass: ``isinstance``, constructor,
    parameters, repr, state_dict and pickling are torch's."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if not _is_compiling():
            y = routes.linear(input, weight, bias)
            if y is not None:
                return y
        if linear_routable(input, weight, bias):
            return routed_linear(input, weight, bias)
        return super().forward(input)


def patched_linear(attr):
    """``torch.nn.functional.linear``'s replacement."""
    def linear(*args, **kwargs):
        if attr.users:
            if not kwargs and 2 <= len(args) <= 3:
                x, weight, bias = args[0], args[1], args[2] if len(args) == 3 else None
                y = None if _is_compiling() else routes.linear(x, weight, bias)
                if y is not None:
                    return y
            else:
                bound = routing.bind(args, kwargs, ("input", "weight", "bias"), defaults={"bias": None}) or {}
                x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
            if linear_routable(x, weight, bias):
                return routed_linear(x, weight, bias)
        return attr.original(*args, **kwargs)
    return linear


def patched_matmul(attr):
    """``torch.matmul``'s replacement (``out=`` and every form tunekit does not take: torch's)."""
    def matmul(*args, **kwargs):
        if attr.users and len(args) == 2 and not kwargs:
            y = None if _is_compiling() else routes.matmul(args[0], args[1])
            if y is not None:
                return y
            form = _matmul_routable(args[0], args[1])
            if form is not None:
                return routed_matmul(args[0], args[1], form)
        return attr.original(*args, **kwargs)
    return matmul


def patched_linear_forward(attr):
    """``torch.nn.Linear.forward``'s replacement."""
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs:
            weight, bias = self.weight, self.bias
            y = None if _is_compiling() else routes.linear(args[0], weight, bias)
            if y is not None:
                return y
            if linear_routable(args[0], weight, bias):
                return routed_linear(args[0], weight, bias)
        return attr.original(self, *args, **kwargs)
    return forward


PATCHES = ((F, "linear", patched_linear), (torch, "matmul", patched_matmul),
           (torch.nn.Linear, "forward", patched_linear_forward))
