"""Argument checks shared by the ops: clear errors for bad input, the same in eager calls and while
torch.compile traces."""

from __future__ import annotations

import torch

from ...tunable.params import overlaps

__all__ = ["check_float_tensor", "check_gradient_pair", "check_approximate", "elementwise_destination",
           "check_traced_out"]


def check_float_tensor(op: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tunekit.{op}: x must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"tunekit.{op}: x must be a floating-point tensor, got {x.dtype}")


def check_gradient_pair(op: str, dy, x) -> None:
    """A backward op's ``dy`` and ``x``: floating-point tensors of one shape on one device."""
    check_float_tensor(op, x)
    if not isinstance(dy, torch.Tensor) or not dy.is_floating_point():
        raise TypeError(f"tunekit.{op}: dy must be a floating-point tensor, got "
                        f"{dy.dtype if isinstance(dy, torch.Tensor) else type(dy).__name__}")
    if dy.shape != x.shape or dy.device != x.device:
        raise ValueError(f"tunekit.{op}: dy and x must have one shape and device: dy is {list(dy.shape)} on "
                         f"{dy.device}, x is {list(x.shape)} on {x.device}")


def check_approximate(op: str, approximate) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tunekit.{op}: approximate must be 'none' or 'tanh', got {approximate!r}")


def _expanded(t: torch.Tensor) -> bool:
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def elementwise_destination(op: str, x: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor | None:
    """Where an elementwise op writes: None (allocate), ``x`` itself (in place), or a checked ``out``."""
    if inplace:
        if out is not None:
            raise ValueError(f"tunekit.{op}: pass either out= or inplace=True, not both")
        if _expanded(x):
            raise ValueError(f"tunekit.{op}: cannot work in place on an expanded tensor (overlapping elements)")
        return x
    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"tunekit.{op}: out must be a tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"tunekit.{op}: out must match x in shape, dtype and device: x is {x.dtype}{list(x.shape)} "
                         f"on {x.device}, out is {out.dtype}{list(out.shape)} on {out.device}")
    if _expanded(out):
        raise ValueError(f"tunekit.{op}: out has overlapping elements (an expanded tensor) and cannot be written")
    if out.numel() and out.data_ptr() == x.data_ptr() and out.stride() == x.stride():
        return x  # the same memory, element for element: an in-place call
    if overlaps(x, out):
        raise ValueError(f"tunekit.{op}: out partially overlaps x; pass inplace=True or a separate tensor")
    return out


def check_traced_out(op: str, x: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> None:
    """:func:`elementwise_destination`'s checks that tracing can make (not the data-pointer overlap)."""
    if inplace and out is not None:
        raise ValueError(f"tunekit.{op}: pass either out= or inplace=True, not both")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"tunekit.{op}: out must match x in shape, dtype and device")
