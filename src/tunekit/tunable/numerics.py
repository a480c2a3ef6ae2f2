"""Numerical agreement between a candidate's output and the default's, with dtype-aware tolerances.

A candidate passes when, element by element, ``|actual - expected| <= atol + rtol * |expected|``,
NaN sits exactly where the reference has NaN, and infinities match in place and sign. Tolerances,
one table for the whole project (tests use it too):

==========  ========  =========  ===========================================================
dtype       rtol      atol       why
==========  ========  =========  ===========================================================
float64     1e-9      1e-12      different summation orders and libm calls
float32     2e-5      1e-6       two fp32 paths (fused vs composite, other exp/erf) differ by
                                 a few ulp (2^-23 = 1.2e-7) and more through cancellation
float16     2e-3      2e-5       fp32 math rounded to fp16 once vs twice: 2 ulp (2^-10 each);
                                 atol covers fp16 subnormals (6e-8 spacing) near zero
bfloat16    1.6e-2    1e-5       2 ulp of bf16 (2^-7 each)
==========  ========  =========  ===========================================================

An op may pass its own (rtol, atol) when its candidates differ more (e.g. long reductions).
"""

from __future__ import annotations

import torch

__all__ = ["TOLERANCES", "tolerance", "compare", "compare_all", "warm_compare"]

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (2e-5, 1e-6),
    torch.float16: (2e-3, 2e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for ``dtype``; exact equality for non-float dtypes."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def compare(actual: torch.Tensor, expected: torch.Tensor, tol: tuple[float, float] | None = None) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise a short reason naming the worst element."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if actual.numel() == 0:
        return None
    rtol, atol = tol if tol is not None else tolerance(expected.dtype)
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        bad = actual != expected
        count = int(bad.sum())
        return None if count == 0 else f"{count} of {expected.numel()} elements differ"
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    unwritten = int((a_nan & ~e_nan).sum())
    if unwritten:
        return f"{unwritten} of {e.numel()} elements are NaN where the reference is not (unwritten or invalid)"
    missing_nan = int((e_nan & ~a_nan).sum())
    if missing_nan:
        return f"{missing_nan} of {e.numel()} elements are not NaN where the reference is NaN"
    a_inf, e_inf = torch.isinf(a), torch.isinf(e)
    inf_mismatch = (a_inf | e_inf) & ~(a_inf & e_inf & (a == e))
    count = int(inf_mismatch.sum())
    if count:
        return f"{count} of {e.numel()} elements differ in infinities"
    finite = ~(e_nan | e_inf)
    err = (a - e).abs().masked_fill(~finite, 0.0)
    allowed = atol + rtol * e.abs().masked_fill(~finite, 0.0)
    excess = err - allowed
    worst = int(torch.argmax(excess))
    if float(excess.flatten()[worst]) <= 0.0:
        return None
    count = int((excess > 0).sum())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), e.shape))
    return (f"{count} of {e.numel()} elements outside rtol={rtol:g} atol={atol:g}; worst at {idx}: "
            f"{float(a[idx]):.7g} vs {float(e[idx]):.7g}")


def compare_all(tol: tuple[float, float]):
    """``check(outputs, expected)``: None when each output agrees with its expected one within
    ``tol`` (:func:`compare`), else why the first that does not."""
    def check(got, expected):
        return next((p for p in (compare(g, r, tol) for g, r in zip(got, expected)) if p), None)
    return check


_warmed: set[tuple[torch.device, torch.dtype]] = set()


def warm_compare(params) -> None:
    """:func:`compare` once on a few elements of each dtype ``params``' tensors have, on their CUDA
    device, once per process (``TunableOp.warm_numerics``' default: run off the tuning budget, on
    a worker in an online session). Why: its dozen kernels load lazily at a process's first check,
    150-220 ms on the H100, which one call that resumed tuning paid. Nothing on the CPU."""
    tensors = [t for t in (getattr(params, name, None) for name in params.inputs + params.outputs)
               if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
    for key in dict.fromkeys((t.device, t.dtype) for t in tensors):
        if key in _warmed:
            continue
        device, dtype = key
        x = torch.arange(64, device=device).to(dtype)  # no random stream touched
        compare(x, x.clone(), tolerance(dtype))
        _warmed.add(key)

