"""The GEMM family's public functions, with torch's signatures and semantics: ``tunekit.mm``, ``addmm``,
``addmm_``, ``bmm``, ``baddbmm``, ``matmul``, ``linear`` and the fused ``linear_act``.

Each takes the forms :mod:`~tunekit.ops.gemm.checks` accepts (plain float tensors of one dtype and
device, matching shapes, an exact ``out=``) and hands every other call to torch's own function, so
torch's errors and results stay torch's. A call tunekit takes builds its params and goes through
the tuned op (``op.call(params)``: the cached choice on a hit), or through
:class:`~tunekit.ops.gemm.autograd.GemmFunction` when autograd records it. Before all that, a call
whose layout tunekit answers with torch's own kernels goes straight to torch's function
(``routes.py``: host time and autograd as torch's); the general path teaches the routes. Under
torch.compile each hands over to the custom ops (``custom_ops.py``).
"""

from __future__ import annotations

import torch

from . import custom_ops as compiled
from . import routes
from .autograd import GemmFunction
from .checks import broadcastable, needs_grad, out_ok, pair, plain, scalar, self_overlapping
from .op import addmm_op, mm_op
from .params import ACTIVATIONS, AddmmParams, GemmParams, folded
from .torch_candidates import activation_function
from ...tunable.params import overlaps

_increment_version = torch.autograd.graph.increment_version

__all__ = ["mm", "addmm", "addmm_", "bmm", "baddbmm", "matmul", "linear", "linear_act", "check_activation",
           "linear_form", "linear_taken", "learnt_linear", "matmul_form", "matmul_taken", "learnt_matmul"]

_mm_call, _addmm_call = mm_op.call, addmm_op.call
_is_compiling = torch.compiler.is_compiling
#: torch's own functions, bound before any tunekit.patch(): a patched one is never met here
_torch_linear, _torch_matmul = torch._C._nn.linear, torch.matmul


def check_activation(activation) -> str:
    if activation is None:
        return "none"
    if activation not in ACTIVATIONS:
        raise ValueError(f"tunekit.linear_act: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def _product(c, a, b, alpha, beta, out, activation: str, weight: bool = False):
    """The tuned GEMM of operands the caller checked: recorded by autograd when it must be."""
    if needs_grad(c, a, b):
        return GemmFunction.apply(c, a, b, alpha, beta, activation, weight)
    if weight:
        b = b.t()
    y = (_mm_call(GemmParams(a, b, out, activation)) if c is None
         else _addmm_call(AddmmParams(c, a, b, alpha, beta, out, activation)))
    if out is not None:
        _increment_version(out)  # as torch's out= does: autograd sees the write, whichever kernel made it
    return y


def _ones(beta, alpha) -> bool:
    """alpha = beta = 1 as Python ints (the torch functions' defaults): the only scalars routed."""
    return type(beta) is int and type(alpha) is int and beta == 1 and alpha == 1


def _learnt(route, operands: tuple, routable: bool, y: torch.Tensor, c) -> torch.Tensor:
    """``y``, after teaching ``route`` about the call when it is ``routable`` (no ``out=``, alpha =
    beta = 1). ``operands`` are the call's (``c`` its C term or None), ``y`` their product."""
    if routable:
        a, b = operands[-2:]
        routes.learn(route, operands, lambda: routes.products(c, a, b, y), y)
    return y


def _matrices(a, b, dims: int) -> bool:
    """Operands of ``dims`` dimensions each, one dtype and device, inner sizes that match (batch too)."""
    return (pair(a, b) and a.dim() == dims and b.dim() == dims and a.shape[-1] == b.shape[-2]
            and (dims == 2 or a.shape[0] == b.shape[0]))


def _takes_out(out, shape, like, *inputs) -> bool:
    return out is None or (out_ok(out, shape, like, *inputs) and not needs_grad(out, *inputs))


def mm(input: torch.Tensor, mat2: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.mm``: ``input @ mat2`` for 2-D tensors, by the fastest correct candidate."""
    if _is_compiling():
        return compiled.compiled_mm(input, mat2, out=out)
    if out is None:
        y = routes.mm(input, mat2)
        if y is not None:
            return y
    if _matrices(input, mat2, 2):
        shape = (input.shape[0], mat2.shape[1])
        if _takes_out(out, shape, input, input, mat2):
            return _learnt(routes.mm, (input, mat2), out is None, _product(None, input, mat2, 1, 1, out, "none"), None)
    return torch.mm(input, mat2) if out is None else torch.mm(input, mat2, out=out)


def bmm(input: torch.Tensor, mat2: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.bmm``: batched ``input @ mat2`` ([b, n, m] @ [b, m, p])."""
    if _is_compiling():
        return compiled.compiled_bmm(input, mat2, out=out)
    if out is None:
        y = routes.bmm(input, mat2)
        if y is not None:
            return y
    if _matrices(input, mat2, 3):
        shape = (input.shape[0], input.shape[1], mat2.shape[2])
        if _takes_out(out, shape, input, input, mat2):
            return _learnt(routes.bmm, (input, mat2), out is None, _product(None, input, mat2, 1, 1, out, "none"), None)
    return torch.bmm(input, mat2) if out is None else torch.bmm(input, mat2, out=out)


def _addmm_form(input, a, b, beta, alpha, out, dims: int) -> bool:
    if not (_matrices(a, b, dims) and plain(input) and input.dtype is a.dtype and input.device == a.device
            and scalar(beta) and scalar(alpha)):
        return False
    shape = (*a.shape[:-1], b.shape[-1])
    return broadcastable(input, shape) and _takes_out(out, shape, a, input, a, b)


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1, alpha=1,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.addmm``: ``beta * input + alpha * (mat1 @ mat2)``, ``input`` broadcast; with beta = 0,
    ``input`` is not read (its NaN and infinities do not propagate)."""
    if _is_compiling():
        return compiled.compiled_addmm(input, mat1, mat2, beta=beta, alpha=alpha, out=out)
    plain_scalars = out is None and _ones(beta, alpha)
    if plain_scalars:
        y = routes.addmm(input, mat1, mat2)
        if y is not None:
            return y
    if _addmm_form(input, mat1, mat2, beta, alpha, out, 2):
        y = _product(input, mat1, mat2, alpha, beta, out, "none")
        return _learnt(routes.addmm, (input, mat1, mat2), plain_scalars, y, input)
    if out is None:
        return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha, out=out)


def baddbmm(input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta=1, alpha=1,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.baddbmm``: ``beta * input + alpha * (batch1 @ batch2)`` per batch entry, ``input`` broadcast."""
    if _is_compiling():
        return compiled.compiled_baddbmm(input, batch1, batch2, beta=beta, alpha=alpha, out=out)
    plain_scalars = out is None and _ones(beta, alpha)
    if plain_scalars:
        y = routes.baddbmm(input, batch1, batch2)
        if y is not None:
            return y
    if _addmm_form(input, batch1, batch2, beta, alpha, out, 3):
        y = _product(input, batch1, batch2, alpha, beta, out, "none")
        return _learnt(routes.baddbmm, (input, batch1, batch2), plain_scalars, y, input)
    if out is None:
        return torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha)
    return torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha, out=out)


def addmm_(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """``Tensor.addmm_``: ``input`` becomes ``beta * input + alpha * (mat1 @ mat2)``, in place. Tuning
    runs every trial on copies, so ``input`` receives exactly one update."""
    if (_matrices(mat1, mat2, 2) and plain(input) and input.dtype is mat1.dtype and input.device == mat1.device
            and scalar(beta) and scalar(alpha) and tuple(input.shape) == (mat1.shape[0], mat2.shape[1])
            and not needs_grad(input, mat1, mat2) and not self_overlapping(input)
            and not overlaps(input, mat1) and not overlaps(input, mat2)):
        _addmm_call(AddmmParams(input, mat1, mat2, alpha, beta, input))
        _increment_version(input)  # an in-place write autograd must see (a tensor saved for a backward)
        return input
    return input.addmm_(mat1, mat2, beta=beta, alpha=alpha)


def matmul_form(input, other) -> str | None:
    """"fold" (2-D or N-D @ 2-D), "batch" (3-D @ 3-D of one batch size) or None (torch.matmul's). A
    batch broadcast from 1 is torch's: the gradient of the broadcast operand is then one GEMM over
    the folded batch in torch, rounded once, where per-batch products summed after rounding missed
    torch's bfloat16 gradient by 5% (torch's OpInfo sample [5, 5, 5] @ [1, 5, 5])."""
    if not (pair(input, other) and input.dim() >= 2 and other.dim() >= 2 and input.shape[-1] == other.shape[-2]):
        return None
    if other.dim() == 2:
        return "fold"
    if input.dim() == 3 and other.dim() == 3 and input.shape[0] == other.shape[0]:
        return "batch"
    return None


def matmul_taken(input, other, form: str) -> torch.Tensor:
    """The tuned matmul of a form :func:`matmul_form` named."""
    if form == "fold":
        if input.dim() == 2:
            return _product(None, input, other, 1, 1, None, "none")
        flat = _product(None, folded(input), other, 1, 1, None, "none")
        return flat.view(*input.shape[:-1], other.shape[-1])
    return _product(None, input, other, 1, 1, None, "none")


def learnt_matmul(input, other, form: str, y: torch.Tensor) -> torch.Tensor:
    """``y`` (the tuned matmul's result) after teaching the matmul route about the call: 2-D or
    folded N-D @ 2-D, and batches of one size."""
    if form == "fold":
        a = input if input.dim() == 2 else folded(input)
        routes.learn(routes.matmul, (input, other), lambda: routes.products(None, a, other, folded(y)), y)
    else:
        routes.learn(routes.matmul, (input, other), lambda: routes.products(None, input, other, y), y)
    return y


def matmul(input: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.matmul`` for the forms tunekit takes: 2-D @ 2-D, N-D @ 2-D (the leading dims folded
    into M, copied only where no view can fold them), 3-D @ 3-D of one batch size. Every other form
    (vectors, 4-D or broadcast batches, ``out=``) is torch.matmul's."""
    if _is_compiling():
        return compiled.compiled_matmul(input, other, out=out)
    if out is not None:
        return _torch_matmul(input, other, out=out)
    y = routes.matmul(input, other)
    if y is not None:
        return y
    form = matmul_form(input, other)
    if form is not None:
        return learnt_matmul(input, other, form, matmul_taken(input, other, form))
    return _torch_matmul(input, other)


def linear_form(input, weight, bias) -> bool:
    return (pair(input, weight) and input.dim() >= 2 and weight.dim() == 2 and input.shape[-1] == weight.shape[1]
            and (bias is None or (plain(bias) and bias.dim() == 1 and bias.shape[0] == weight.shape[0]
                                  and bias.dtype is input.dtype and bias.device == input.device)))


def linear_taken(input, weight, bias, activation: str) -> torch.Tensor:
    """The tuned linear of checked operands: leading dims folded (a view where one can fold them)."""
    x = input if input.dim() == 2 else folded(input)
    y = _product(bias, x, weight, 1, 1, None, activation, weight=True)
    return y if input.dim() == 2 else y.view(*input.shape[:-1], weight.shape[0])


def learnt_linear(input, weight, bias, y: torch.Tensor) -> torch.Tensor:
    """``y`` (the tuned linear's result) after teaching the linear route about the call."""
    x = input if input.dim() == 2 else folded(input)
    routes.learn(routes.linear, (input, weight, bias),
                 lambda: routes.products(bias, x, weight, folded(y), weight=True), y)
    return y


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear``: ``input @ weight.T + bias`` over the last dim of ``input``."""
    if _is_compiling():
        return compiled.compiled_linear(input, weight, bias, "none")
    y = routes.linear(input, weight, bias)
    if y is not None:
        return y
    if linear_form(input, weight, bias):
        return learnt_linear(input, weight, bias, linear_taken(input, weight, bias, "none"))
    return _torch_linear(input, weight, bias)


def linear_act(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "gelu") -> torch.Tensor:
    """``ACT(linear(input, weight, bias))`` with the activation fused into the GEMM's epilogue:
    ``activation`` is "relu", "silu", "gelu", "gelu_tanh" or "none". The default candidate (and
    every form tunekit does not take) is torch's linear followed by torch's activation."""
    activation = check_activation(activation)
    if _is_compiling():
        return compiled.compiled_linear(input, weight, bias, activation)
    if linear_form(input, weight, bias):
        return linear_taken(input, weight, bias, activation)
    return activation_function(activation)(_torch_linear(input, weight, bias))
