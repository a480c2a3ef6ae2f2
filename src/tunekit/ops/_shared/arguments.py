"""The public functions' arguments: which calls tunekit computes itself, and which it hands to torch's
own function unchanged, so that torch gives its result, its warning or its exception type.

A tunekit public function stands for a torch function (``tunekit.silu`` for ``F.silu``, ...): it
takes torch's arguments and must accept what torch accepts and reject what torch rejects. tunekit's
candidates compute the common forms; for every other form (a non-float or complex dtype, a tensor
subclass with ``__torch_function__``, a meta or other non-CPU/CUDA device, an ``out=`` torch would
resize, cast, refuse or check for overlap, an invalid argument) the op calls torch's function with
the same arguments: :func:`computes` and :func:`elementwise_target` say which.

``make_params`` (the arguments of ``tunekit.explain`` and offline tuning) has no torch function to
fall back on: there :func:`check_float_tensor` and :func:`elementwise_destination` raise instead.
"""

from __future__ import annotations

import torch

from .routing import TUNEKIT_DTYPES, transformed
from ...tunable.params import overlaps

__all__ = ["TORCH", "computes", "transformed", "traced_computes", "elementwise_target", "elementwise_destination",
           "writable_out",
           "check_float_tensor", "check_gradient_pair", "check_approximate", "APPROXIMATIONS"]

#: :func:`elementwise_target`'s answer for a form only torch's own function runs
TORCH = object()

#: gelu's ``approximate`` values tunekit computes (torch raises for any other)
APPROXIMATIONS = ("none", "tanh")

_Tensor = torch.Tensor
_strided = torch.strided
_Parameter = torch.nn.Parameter
_DTYPES = tuple(TUNEKIT_DTYPES)  # a tuple: Dynamo folds ``in`` over it


def computes(x) -> bool:
    """Whether tunekit's candidates compute an op of ``x``: a strided float16 / bfloat16 / float32 /
    float64 ``torch.Tensor`` or ``nn.Parameter`` on the CPU or a CUDA device, and no forward-mode AD
    level or torch.func transform active (:func:`transformed`). Other types (subclasses, FakeTensor,
    DTensor, ``__torch_function__`` types) get torch's function, which dispatches them. Not a check
    of modes: ``with torch.device(...)`` around an explicit tunekit call keeps tunekit."""
    return ((type(x) is _Tensor or type(x) is _Parameter) and x.dtype in TUNEKIT_DTYPES and x.layout is _strided
            and (x.is_cuda or x.is_cpu) and not transformed())


def traced_computes(x) -> bool:
    """:func:`computes` as torch.compile traces it (Dynamo's tensors are fakes of the real type)."""
    return isinstance(x, _Tensor) and x.dtype in _DTYPES and x.layout == _strided and x.device.type in ("cpu", "cuda")


def _expanded(t: torch.Tensor) -> bool:
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def _out_problem(out, x: torch.Tensor, shape: torch.Size) -> str | None:
    """Why tunekit cannot write a result of ``shape`` into ``out`` itself (None: it can)."""
    if type(out) is not _Tensor:
        return f"out must be a torch.Tensor, got {type(out).__name__}"
    if out.shape != shape or out.dtype != x.dtype or out.device != x.device:
        return (f"out must be {x.dtype}{list(shape)} on {x.device} (x's dtype and device, the result's shape), "
                f"got {out.dtype}{list(out.shape)} on {out.device}")
    if _expanded(out):
        return "out has overlapping elements (an expanded tensor)"
    if out.requires_grad and torch.is_grad_enabled():
        return "out requires grad"
    return None


def _target(x: torch.Tensor, out, inplace) -> tuple[object, str]:
    """(where to write, why not when it is TORCH)."""
    if inplace:
        if out is not None:
            raise ValueError("pass either out= or inplace=True, not both")
        return (TORCH, "cannot work in place on an expanded tensor") if _expanded(x) else (x, "")
    if out is None:
        return None, ""
    why = _out_problem(out, x, x.shape)
    if why is not None:
        return TORCH, why
    if out.numel() and out.data_ptr() == x.data_ptr() and out.stride() == x.stride():
        return x, ""  # the same memory, element for element: an in-place call
    if overlaps(x, out):
        return TORCH, "out partially overlaps x"
    return out, ""


def writable_out(out, x: torch.Tensor, shape) -> bool:
    """Whether tunekit writes an op's result of ``shape`` into ``out`` itself: a ``torch.Tensor`` of
    ``x``'s dtype and device, exactly that shape, without overlapping elements, not requiring grad,
    sharing no memory with ``x``. Any other ``out`` is torch's function's to resize, cast or refuse."""
    return _out_problem(out, x, torch.Size(shape)) is None and not overlaps(x, out)


def elementwise_target(x: torch.Tensor, out, inplace) -> torch.Tensor | None | object:
    """Where an elementwise op of ``x`` (:func:`computes` is true) writes: None (a new tensor), ``x``
    itself (in place: ``inplace``, or ``out`` that is ``x``'s memory element for element), ``out``,
    or :data:`TORCH` for a form torch's own function must run: an ``out`` of another shape (torch
    resizes it, with a warning when it was not empty), dtype or device, an expanded or partially
    overlapping ``out``, one that requires grad, in place on an expanded ``x`` (torch raises).
    ``out=`` with ``inplace=True`` is tunekit's own conflict: ValueError."""
    return _target(x, out, inplace)[0]


def elementwise_destination(op: str, x: torch.Tensor, out, inplace) -> torch.Tensor | None:
    """:func:`elementwise_target` for ``make_params``: ValueError where the public function runs torch's."""
    try:
        where, why = _target(x, out, inplace)
    except ValueError as e:
        raise ValueError(f"tunekit.{op}: {e}") from None
    if where is TORCH:
        raise ValueError(f"tunekit.{op}: {why}")
    return where


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
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"tunekit.{op}: approximate must be 'none' or 'tanh', got {approximate!r}")
