"""rms_norm's params: the input, the weight (normalized_shape's size, the input's dtype), eps (None:
torch's default, the dtype's machine epsilon), and the gradient's ``dy``, ``dx`` and ``dweight``."""

from __future__ import annotations

import math

import torch

from ...tunable.params import OpParams, tensor_key, tensor_signature, with_arguments

__all__ = ["RmsNormParams", "RmsNormBackwardParams", "epsilon", "row_count"]


def epsilon(x: torch.Tensor, eps: float | None) -> float:
    """The eps torch uses: the given one, else ``torch.finfo(x.dtype).eps``."""
    return torch.finfo(x.dtype).eps if eps is None else float(eps)


def row_count(x: torch.Tensor, normalized_shape) -> int:
    """How many rows of ``prod(normalized_shape)`` elements ``x`` holds."""
    n = math.prod(normalized_shape)
    return x.numel() // n if n else 0


class RmsNormParams(OpParams):
    op_name = "rms_norm"
    inputs = ("x", "weight")
    outputs = ("out",)

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, normalized_shape, eps: float | None = None,
                 out: torch.Tensor | None = None):
        self.x, self.weight, self.normalized_shape, self.eps, self.out = x, weight, tuple(normalized_shape), eps, out

    def cache_key(self):
        return (tensor_key(self.x), tensor_key(self.weight), self.normalized_shape, tensor_key(self.out))

    def signature(self) -> str:
        dest = "new" if self.out is None else tensor_signature(self.out)
        return (f"x={tensor_signature(self.x)} w={tensor_signature(self.weight)} "
                f"norm={list(self.normalized_shape)} out={dest} {self.x.device.type}")

    def new_outputs(self):
        return {"out": torch.empty_like(self.x, memory_format=torch.contiguous_format)}

    def spec(self):
        return with_arguments(super().spec(), normalized_shape=list(self.normalized_shape), eps=self.eps)


class RmsNormBackwardParams(OpParams):
    """``dy`` and ``x`` share a shape; ``out`` is dx, ``dweight`` the weight's gradient."""

    op_name = "rms_norm_backward"
    inputs = ("dy", "x", "weight")
    outputs = ("out", "dweight")

    def __init__(self, dy, x, weight, normalized_shape, eps: float | None = None, out=None, dweight=None):
        self.dy, self.x, self.weight = dy, x, weight
        self.normalized_shape, self.eps, self.out, self.dweight = tuple(normalized_shape), eps, out, dweight

    def cache_key(self):
        return (tensor_key(self.dy), tensor_key(self.x), tensor_key(self.weight), self.normalized_shape)

    def signature(self) -> str:
        return (f"dy={tensor_signature(self.dy)} x={tensor_signature(self.x)} w={tensor_signature(self.weight)} "
                f"norm={list(self.normalized_shape)} {self.x.device.type}")

    def new_outputs(self):
        return {"out": torch.empty_like(self.x, memory_format=torch.contiguous_format),
                "dweight": torch.empty_like(self.weight, memory_format=torch.contiguous_format)}

    def spec(self):
        return with_arguments(super().spec(), normalized_shape=list(self.normalized_shape), eps=self.eps)
