"""logsumexp's params: the input, the reduced dims (sorted, non-negative) and ``keepdim``, and the
gradient's ``dy`` and ``lse`` (shaped as the forward's result)."""

from __future__ import annotations

import torch

from ...tunable.params import OpParams, tensor_key, tensor_signature, with_arguments

__all__ = ["LogsumexpParams", "LogsumexpBackwardParams", "normalize_dims", "reduced_shape", "unsqueezed"]


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


def unsqueezed(t: torch.Tensor, dims, keepdim: bool, ndim: int) -> torch.Tensor:
    """``t`` (shaped as the forward's result) with the reduced dims of an ``ndim``-d input put back
    as size 1, so it broadcasts against that input. A 0-d input's "dim 0" is no dimension: nothing
    to put back (unsqueezing made the gradient of a 0-d input 1-d)."""
    if not keepdim and ndim > 0:
        for d in dims:
            t = t.unsqueeze(d)
    return t
