"""logsumexp as ``torch.logsumexp(x, dim, keepdim)``, fused into one pass per row, and its gradient.

``torch.logsumexp`` is a composite (amax, subtract, exp, sum, log, add: several kernels and a
full-size temporary); the candidates here read the input once. Layouts: see ``_rows.py`` (a
contiguous input reduced over adjacent dims is (outer, R, inner); rows: inner = 1; columns: > 1).

``logsumexp``
- ``torch_logsumexp`` (default): runs any input (every dim, tuples of dims, strides, dtypes).
- CUDA C (``kernels/cuda/logsumexp.cu``), ``_vec``: 16-byte loads:
  ``logsumexp_{rows8,warp,block}_<dtype>[_vec]`` (8 threads per row for rows of 64 and fewer, a
  warp, a block per row), ``logsumexp_block_split_<dtype>[_vec]`` (several blocks per row, then a
  combine pass: 4 x 16M), ``logsumexp_chunks{32,64}k_<dtype>`` (one block per 32 or 64 KB chunk of a
  row, the grid every chunk), ``logsumexp_rowblock{128,256}_<dtype>_vec`` (a block of 128 or 256
  threads per row, the grid every row: 1024 rows of 32768 16-bit elements in one wave),
  ``logsumexp_columns_<dtype>[_vec]`` (reduce a non-last dim in place).
- Triton (``kernels/triton/logsumexp.py``): ``logsumexp_triton_*``.

``logsumexp_backward`` (``dx = dy * exp(x - lse)``, one pass over x): ``torch_logsumexp_backward``
(default, torch's composite), CUDA C ``logsumexp_backward_{rows8,warp,block,columns}_<dtype>[_vec]``
(``kernels/cuda/logsumexp_backward.cu``) and Triton.

Autograd: :func:`logsumexp` on a tensor that requires grad records :class:`LogsumexpFunction`.
"""

from __future__ import annotations

import torch

from ._arguments import check_float_tensor
from ._elementwise import with_arguments
from ._rows import cuda_backward_candidates, cuda_candidates
from ._triton_rows import triton_logsumexp_backward_candidates, triton_logsumexp_candidates
from ..tunable.params import OpParams, tensor_key, tensor_signature
from ..tunable.context import captured, inherited
from ..tunable.registry import register
from ..tunable.tunable_op import TunableOp

__all__ = ["LogsumexpParams", "LogsumexpBackwardParams", "LogsumexpFunction", "logsumexp", "logsumexp_backward",
           "logsumexp_op", "logsumexp_backward_op"]

def normalize_dims(dim, ndim: int) -> tuple[int, ...]:
    """``dim`` (an int or a sequence) as sorted non-negative dims; ValueError as torch would refuse."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    rank = max(ndim, 1)  # a 0-d tensor takes dim 0 or -1
    out = []
    for d in dims:
        if not isinstance(d, int) or not -rank <= d < rank:
            raise ValueError(f"dim {d!r} out of range for a tensor of {ndim} dimensions")
        out.append(d % rank)
    if len(set(out)) != len(out):
        raise ValueError(f"dim {dim!r} names a dimension twice")
    return tuple(sorted(out))


def reduced_shape(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> list[int]:
    if x.dim() == 0:
        return []
    return [1 if i in dims else s for i, s in enumerate(x.shape) if keepdim or i not in dims]


class LogsumexpParams(OpParams):
    op_name = "logsumexp"
    inputs = ("x",)
    outputs = ("out",)

    def __init__(self, x: torch.Tensor, dims: tuple[int, ...], keepdim: bool = False, out: torch.Tensor | None = None):
        self.x, self.dims, self.keepdim, self.out = x, dims, keepdim, out

    def cache_key(self):
        return (tensor_key(self.x), self.dims, self.keepdim, tensor_key(self.out))

    def signature(self) -> str:
        dest = "new" if self.out is None else tensor_signature(self.out)
        return f"x={tensor_signature(self.x)} dim={list(self.dims)} keepdim={self.keepdim} out={dest} {self.x.device.type}"

    def new_outputs(self):
        x = self.x
        return {"out": torch.empty(reduced_shape(x, self.dims, self.keepdim), dtype=x.dtype, device=x.device)}

    def spec(self):
        return with_arguments(super().spec(), dim=list(self.dims), keepdim=self.keepdim)


class LogsumexpBackwardParams(OpParams):
    """``dy`` and ``lse`` have the forward output's shape; ``x`` the input's; ``out`` is dx."""

    op_name = "logsumexp_backward"
    inputs = ("dy", "x", "lse")
    outputs = ("out",)

    def __init__(self, dy, x, lse, dims: tuple[int, ...], keepdim: bool = False, out=None):
        self.dy, self.x, self.lse, self.dims, self.keepdim, self.out = dy, x, lse, dims, keepdim, out

    def cache_key(self):
        return (tensor_key(self.dy), tensor_key(self.x), tensor_key(self.lse), self.dims, self.keepdim,
                tensor_key(self.out))

    def signature(self) -> str:
        return (f"dy={tensor_signature(self.dy)} x={tensor_signature(self.x)} lse={tensor_signature(self.lse)} "
                f"dim={list(self.dims)} keepdim={self.keepdim} {self.x.device.type}")

    def new_outputs(self):
        return {"out": torch.empty_like(self.x, memory_format=torch.contiguous_format)}

    def spec(self):
        return with_arguments(super().spec(), dim=list(self.dims), keepdim=self.keepdim)


# -- forward --------------------------------------------------------------------------------------
def torch_logsumexp(p: LogsumexpParams) -> torch.Tensor:
    """PyTorch's composite."""
    if p.out is None:
        return torch.logsumexp(p.x, p.dims, p.keepdim)
    return torch.logsumexp(p.x, p.dims, p.keepdim, out=p.out)


def make_params(x: torch.Tensor, dim, keepdim: bool = False) -> LogsumexpParams:
    check_float_tensor("logsumexp", x)
    return LogsumexpParams(x, normalize_dims(dim, x.dim()), bool(keepdim))


def make_example(shape, dtype=torch.float32, device="cpu", dim=-1, keepdim=False) -> LogsumexpParams:
    x = torch.randn(shape, dtype=dtype, device=device) * 3
    return LogsumexpParams(x, normalize_dims(dim, x.dim()), keepdim)


logsumexp_op = register(TunableOp("logsumexp", LogsumexpParams, make_params=make_params, make_example=make_example))
logsumexp_op.add(torch_logsumexp, default=True)
for _c in cuda_candidates():
    logsumexp_op.add(_c)
for _c in triton_logsumexp_candidates():
    logsumexp_op.add(_c)


# -- backward -------------------------------------------------------------------------------------
def _unsqueezed(t: torch.Tensor, dims, keepdim: bool, ndim: int) -> torch.Tensor:
    """``t`` (shaped as the forward's result) with the reduced dims of an ``ndim``-d input put back
    as size 1, so it broadcasts against that input. A 0-d input's "dim 0" is no dimension: nothing
    to put back (unsqueezing made the gradient of a 0-d input 1-d)."""
    if not keepdim and ndim > 0:
        for d in dims:
            t = t.unsqueeze(d)
    return t


def torch_logsumexp_backward(p: LogsumexpBackwardParams) -> torch.Tensor:
    """``dy * exp(x - lse)`` with torch ops (autograd's formula for torch.logsumexp), in float32 for
    16-bit inputs: in bfloat16, ``x - lse`` alone rounds by up to 3% of the gradient (lse ~ 10),
    and this result is the reference every other candidate is checked against. Writes ``out``
    in place when given (tuning times it so, and no extra copy should count against it)."""
    x = p.x
    dy, lse = _unsqueezed(p.dy, p.dims, p.keepdim, x.dim()), _unsqueezed(p.lse, p.dims, p.keepdim, x.dim())
    if x.dtype in (torch.float16, torch.bfloat16):
        dx = torch.exp(x.float() - lse.float()).mul_(dy.float())
        return dx.to(x.dtype) if p.out is None else p.out.copy_(dx)
    if p.out is None:
        return dy * torch.exp(x - lse)
    torch.sub(x, lse, out=p.out)
    return p.out.exp_().mul_(dy)


def make_backward_example(shape, dtype=torch.float32, device="cpu", dim=-1, keepdim=False) -> LogsumexpBackwardParams:
    fwd = make_example(shape, dtype, device, dim, keepdim)
    lse = torch.logsumexp(fwd.x, fwd.dims, keepdim)
    return LogsumexpBackwardParams(torch.randn_like(lse), fwd.x, lse, fwd.dims, keepdim)


logsumexp_backward_op = register(TunableOp("logsumexp_backward", LogsumexpBackwardParams,
                                           make_example=make_backward_example))
logsumexp_backward_op.add(torch_logsumexp_backward, default=True)
for _c in cuda_backward_candidates():
    logsumexp_backward_op.add(_c)
for _c in triton_logsumexp_backward_candidates():
    logsumexp_backward_op.add(_c)


# -- public functions -----------------------------------------------------------------------------
class LogsumexpFunction(torch.autograd.Function):
    """Autograd for :func:`logsumexp`: the tuned forward, the tuned fused backward."""

    @staticmethod
    def forward(ctx, x, dims, keepdim):
        lse = _logsumexp_call(LogsumexpParams(x, dims, keepdim))
        ctx.save_for_backward(x, lse)
        ctx.tuning = captured()  # the backward may run on autograd's thread
        ctx.dims, ctx.keepdim = dims, keepdim
        return lse

    @staticmethod
    def backward(ctx, dy):
        x, lse = ctx.saved_tensors
        # autograd often hands an expanded gradient (from .sum()); one value per result is small
        dy = dy.contiguous()
        with inherited(ctx.tuning):
            return logsumexp_backward(dy, x, lse, ctx.dims, ctx.keepdim), None, None


def logsumexp(x: torch.Tensor, dim, keepdim: bool = False) -> torch.Tensor:
    """``log(sum(exp(x), dim))`` computed stably, as ``torch.logsumexp``, by the fastest correct
    candidate. Integer inputs and invalid dims go to torch itself (its promotion, its errors)."""
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_logsumexp
        return compiled_logsumexp(x, dim, keepdim)
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return torch.logsumexp(x, dim, keepdim)
    try:
        dims = normalize_dims(dim, x.dim())
    except (ValueError, TypeError):
        return torch.logsumexp(x, dim, keepdim)
    if not dims:  # an empty dim list: torch's own meaning (an error or all dims, by keepdim), untuned
        return torch.logsumexp(x, dim, keepdim)
    if x.requires_grad and torch.is_grad_enabled():
        return LogsumexpFunction.apply(x, dims, bool(keepdim))
    return _logsumexp_call(LogsumexpParams(x, dims, bool(keepdim)))


def logsumexp_backward(dy, x, lse, dim, keepdim: bool = False) -> torch.Tensor:
    """The gradient of :func:`logsumexp`: ``dy * exp(x - lse)`` broadcast over the reduced dims.
    When the result must itself be differentiable (double backward), torch ops run."""
    if _is_compiling():  # torch.compile: the custom op (tunekit/library.py), no graph break
        from ..library import compiled_logsumexp_backward
        return compiled_logsumexp_backward(dy, x, lse, dim, keepdim)
    dims = normalize_dims(dim, x.dim())
    p = LogsumexpBackwardParams(dy, x, lse, dims, bool(keepdim))
    if torch.is_grad_enabled() and (dy.requires_grad or x.requires_grad or lse.requires_grad):
        return torch_logsumexp_backward(p)
    return _logsumexp_backward_call(p)


_logsumexp_call = logsumexp_op.call
_logsumexp_backward_call = logsumexp_backward_op.call
_is_compiling = torch.compiler.is_compiling
