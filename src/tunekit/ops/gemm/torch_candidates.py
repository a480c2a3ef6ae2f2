"""torch's own kernels as the GEMM ops' defaults: ``torch.mm`` / ``bmm`` / ``addmm`` / ``baddbmm`` (cuBLAS
on CUDA), then torch's activation in place for the fused linear. They run every valid input, and
their results are torch's: what every other candidate is checked against and what runs untuned.

One more candidate of torch's for the fused linear, ``torch_addmm_epilogue``: ``torch._addmm_activation``,
on CUDA cuBLASLt's GEMM with the bias and the activation in its epilogue (``GELU_BIAS``, the tanh form;
``RELU_BIAS``) where cuBLASLt takes the operands. The separate activation pass it saves cost 8-17% of
the linear's time (issue 23: bias + gelu tanh after a linear at 4096 and 128 x 14336 x 4096, H200).

A recorded signature rebuilt offline carries the TF32 mode it was met with (``params.tf32``); when
it differs from this process's, the default runs in the recorded mode (the switch is flipped for
that call only), so the reference and the timing are those of the program that recorded it.
"""

from __future__ import annotations

import contextlib

import torch

from .params import AddmmParams, GemmParams
from ...tunable.params import overlaps

__all__ = ["torch_mm", "torch_addmm", "torch_addmm_epilogue", "epilogue_support", "apply_activation",
           "activation_function"]

_mm, _bmm, _addmm, _baddbmm = torch.mm, torch.bmm, torch.addmm, torch.baddbmm
_addmm_activation = torch._addmm_activation
#: the activations torch._addmm_activation fuses: its use_gelu flag for each
_EPILOGUES = {"gelu_tanh": True, "relu": False}
_f32 = torch.float32
_get_tf32, _set_tf32 = torch._C._get_cublas_allow_tf32, torch._C._set_cublas_allow_tf32
#: in-place activations, torch's kernels without their Python wrappers (a patched F.silu is not met)
_IN_PLACE = {
    "relu": torch.relu_,
    "silu": torch._C._nn.silu_,
    "gelu": torch._C._nn.gelu_,
    "gelu_tanh": lambda y: torch._C._nn.gelu_(y, approximate="tanh"),
}
_OUT_OF_PLACE = {
    "relu": torch.relu,
    "silu": torch._C._nn.silu,
    "gelu": torch._C._nn.gelu,
    "gelu_tanh": lambda y: torch._C._nn.gelu(y, approximate="tanh"),
}


def apply_activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    """``y`` with torch's activation applied in place (``y`` is the GEMM's own result)."""
    return y if activation == "none" else _IN_PLACE[activation](y)


def activation_function(activation: str):
    """torch's activation ``activation`` as an out-of-place function (identity for "none")."""
    return _OUT_OF_PLACE.get(activation, lambda y: y)


def _tf32_mode(p: GemmParams):
    """The recorded TF32 mode for this call, when it is not the process's (offline rebuilds only)."""
    if p.a.dtype is not _f32 or p.tf32 == _get_tf32():
        return contextlib.nullcontext()
    return _Tf32(p.tf32)


class _Tf32:
    def __init__(self, value: bool):
        self.value = value

    def __enter__(self):
        self.saved = _get_tf32()
        _set_tf32(self.value)

    def __exit__(self, *exc):
        _set_tf32(self.saved)


def torch_mm(p: GemmParams) -> torch.Tensor:
    """``torch.mm`` (2-D) or ``torch.bmm`` (3-D), into ``p.out`` when given, then the activation."""
    a, b, out = p.a, p.b, p.out
    with _tf32_mode(p):
        if a.dim() == 2:
            y = _mm(a, b) if out is None else _mm(a, b, out=out)
        else:
            y = _bmm(a, b) if out is None else _bmm(a, b, out=out)
    return apply_activation(y, p.activation)


def torch_addmm(p: AddmmParams) -> torch.Tensor:
    """``torch.addmm`` / ``baddbmm`` (in place: ``c.addmm_`` / ``c.baddbmm_``), then the activation."""
    a, b, c, out = p.a, p.b, p.c, p.out
    alpha, beta = p.alpha, p.beta
    with _tf32_mode(p):
        if out is c:
            y = (c.addmm_ if a.dim() == 2 else c.baddbmm_)(a, b, beta=beta, alpha=alpha)
        elif a.dim() == 2:
            y = (_addmm(c, a, b, beta=beta, alpha=alpha) if out is None
                 else _addmm(c, a, b, beta=beta, alpha=alpha, out=out))
        else:
            y = (_baddbmm(c, a, b, beta=beta, alpha=alpha) if out is None
                 else _baddbmm(c, a, b, beta=beta, alpha=alpha, out=out))
    return apply_activation(y, p.activation)


def epilogue_support(p: AddmmParams) -> str | None:
    """Why ``torch_addmm_epilogue`` cannot run ``p`` (None: it can)."""
    if p.activation not in _EPILOGUES:
        return "cuBLASLt epilogue: gelu_tanh and relu only"
    if p.activation == "gelu_tanh" and p.a.device.type != "cuda":
        return "cuBLASLt epilogue: gelu_tanh on CUDA only (torch's CPU form of it is the erf GELU)"
    if p.activation == "gelu_tanh" and p.a.dtype is torch.float16:
        return "cuBLASLt epilogue: its float16 GELU measured 14x the error of torch's addmm + gelu (H200)"
    if p.a.dim() != 2:
        return "cuBLASLt epilogue: 2-D operands only (addmm)"
    if p.out is not None and (p.out is p.c or p.out.dtype is not p.a.dtype
                              or any(overlaps(t, p.out) for t in (p.a, p.b, p.c))):
        return "cuBLASLt epilogue: not in place, an out of the operands' dtype that overlaps none of them"
    return None


def torch_addmm_epilogue(p: AddmmParams) -> torch.Tensor:
    """``torch._addmm_activation``: the bias and the activation in cuBLASLt's epilogue (CUDA), else
    torch's addmm then the activation (what Inductor falls back to for the same pattern)."""
    use_gelu = _EPILOGUES[p.activation]
    with _tf32_mode(p):
        if p.out is None:
            return _addmm_activation(p.c, p.a, p.b, beta=p.beta, alpha=p.alpha, use_gelu=use_gelu)
        return _addmm_activation(p.c, p.a, p.b, beta=p.beta, alpha=p.alpha, use_gelu=use_gelu, out=p.out)
