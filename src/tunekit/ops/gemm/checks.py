"""Which GEMM calls tunekit computes itself: the forms where its result is torch's (up to the tuned
kernel's rounding, checked when tuning) and its errors cannot differ, because it raises none.

Every other call goes to torch's own function, unchanged, so shape mismatches ("mat1 and mat2
shapes cannot be multiplied"), dtype and device mismatches, float64, integer and complex dtypes,
sparse layouts, tensor subclasses, autocast, ``out=`` tensors of another shape (which torch resizes)
and anything else unusual get torch's result or torch's exception.

An operand tunekit takes is a plain ``torch.Tensor`` or ``nn.Parameter`` (the weights of every
module), strided, float32 / float16 / bfloat16, on the CPU or a CUDA device, with the other
operands' dtype and device. Each check is a few attribute reads: they run on every call.
"""

from __future__ import annotations

import torch

from .._shared.routing import transformed
from ...tunable.dtypes import KERNEL_DTYPES
from ...tunable.params import overlaps

__all__ = ["plain", "pair", "broadcastable", "out_ok", "scalar", "needs_grad", "self_overlapping"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DTYPES = frozenset(KERNEL_DTYPES)
_strided = torch.strided
_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled


def plain(t) -> bool:
    """A tensor tunekit's GEMMs take (module docstring)."""
    return type(t) in _PLAIN and t.dtype in _DTYPES and t.layout is _strided and (t.is_cuda or t.is_cpu)


def pair(a, b) -> bool:
    """Two operands tunekit multiplies as torch does: both :func:`plain`, one dtype, one device, no
    autocast (which would cast them first: torch's function applies its lists), and no forward-mode
    AD or torch.func transform (``routing.transformed``: tunekit's kernels compute values only)."""
    return (plain(a) and plain(b) and a.dtype is b.dtype and a.device == b.device and not _any_autocast()
            and not transformed())


def broadcastable(c: torch.Tensor, shape) -> bool:
    """Whether ``c`` broadcasts to ``shape`` (addmm's and baddbmm's ``input``)."""
    if c.dim() > len(shape):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(c.shape), reversed(shape)))


def self_overlapping(t: torch.Tensor) -> bool:
    """An expanded tensor (a stride of 0 over more than one element): it cannot be written."""
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def out_ok(out, shape, like: torch.Tensor, *inputs) -> bool:
    """An ``out=`` tunekit writes as torch would: a plain tensor of exactly the result's shape,
    dtype and device, writable, overlapping none of ``inputs`` (torch resizes, refuses or orders
    such writes in its own way: those calls go to torch)."""
    return (type(out) is torch.Tensor and out.dtype is like.dtype and out.device == like.device
            and tuple(out.shape) == tuple(shape) and not self_overlapping(out)
            and not any(t is not None and overlaps(out, t) for t in inputs))


def scalar(value) -> bool:
    """alpha / beta tunekit takes: a Python int or float (bools, complex numbers and tensors go to torch)."""
    return type(value) in (int, float)


def needs_grad(*tensors) -> bool:
    """Whether autograd must record this call."""
    return _grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
