"""The GEMM family's numerical check (``TunableOp(numerics=...)``): a candidate's error against an exact
reference, bounded by what a correct fp32-accumulating GEMM may do, or by 2x torch's own error.

Elementwise tolerances do not fit a GEMM: its error grows with K and is relative to the sum of the
products' magnitudes, not to the result (which can cancel to ~0). Per element of the result::

    bound = (eps_out + 8 eps32) |ref| + (2 sqrt(K) + 4) eps_acc * 1.2 * scale + tiny_out
    scale = |alpha| ||A_i|| ||B_j|| + |beta| |C_ij|        (Cauchy-Schwarz: >= sum_k |A_ik B_kj|)

- ``ref``: ACT(alpha * A @ B + beta * C) computed in float64 from the very inputs (already rounded
  to their dtype), once per check (the first candidate's) and kept on the params;
- ``eps_out |ref|``: the one rounding to out's dtype, plus a few fp32 ulps of the activation;
- ``eps_acc``: fp32 accumulation (float32 eps) for 16-bit inputs, whose products are exact in fp32,
  and for float32 without TF32; with TF32 the inputs are rounded to 10 mantissa bits: 2**-10;
- 1.2 bounds the activations' slope (gelu's largest is 1.13); ``tiny_out``: subnormal steps.

A candidate's error is ``max |got - ref| / bound`` over the elements where the default's result is
finite. It passes when that is at most ``max(1, 2 x the default's own error)``: within the bound
that any correct kernel meets, or no more than twice as far off as torch's kernel (cuBLAS with
reduced-precision reductions, TF32) is. NaN and infinities must sit exactly where the default's
result has them, with the same signs.
"""

from __future__ import annotations

import math

import torch

from .params import GemmParams

__all__ = ["check_gemm", "reference", "error_ratio", "warm_reference"]

_EPS32 = torch.finfo(torch.float32).eps
#: side of the square problem :func:`warm_reference` checks
WARM_SIZE = 512
_warmed: set = set()
_TF32_EPS = 2.0 ** -10
#: ATen's own functions, never tunekit.patch()'s: on the warm-up's worker thread a patched F.gelu was routed into
#: tunekit's gelu op (the routing's "inside a tunekit call" flag is per thread), which took the tuning lock there
_ACTS = {"none": lambda x: x, "relu": torch.relu, "silu": torch._C._nn.silu, "gelu": torch._C._nn.gelu,
         "gelu_tanh": lambda x: torch._C._nn.gelu(x, approximate="tanh")}


def reference(p) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 result, per-element bound) of params ``p`` (GemmParams or AddmmParams)."""
    a, b = p.a.double(), p.b.double()
    z = a @ b  # Tensor.__matmul__: never a patched torch.matmul
    alpha, c = getattr(p, "alpha", 1), getattr(p, "c", None)
    scale = a.norm(dim=-1).unsqueeze(-1) * b.norm(dim=-2).unsqueeze(-2)  # [.., M, 1] x [.., 1, N]
    if alpha != 1:
        z, scale = z * alpha, scale * abs(alpha)
    beta = getattr(p, "beta", 0)
    if c is not None and beta != 0:
        c64 = p.c_expanded().double()
        z, scale = z + beta * c64, scale + abs(beta) * c64.abs()
    ref = _ACTS[p.activation](z)
    fin = torch.finfo(p.a.dtype)
    eps_acc = _TF32_EPS if p.a.dtype is torch.float32 and p.tf32 else _EPS32
    K = p.a.shape[-1]
    bound = ((fin.eps + 8 * _EPS32) * ref.abs().nan_to_num(0.0, 0.0, 0.0)
             + ((2 * math.sqrt(K) + 4) * eps_acc * 1.2) * scale.nan_to_num(0.0, 0.0, 0.0)
             + fin.smallest_normal * fin.eps)
    return ref, bound


def _placement(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why NaN / infinities of ``got`` do not sit where ``expected`` has them (None: they do)."""
    g_nan, e_nan = got.isnan(), expected.isnan()
    if not torch.equal(g_nan, e_nan):
        return (f"{int((g_nan & ~e_nan).sum())} NaN where the default has none, "
                f"{int((e_nan & ~g_nan).sum())} missing where it has NaN")
    g_inf, e_inf = got.isinf(), expected.isinf()
    bad = (g_inf | e_inf) & (got != expected)
    if bad.any():
        return f"{int(bad.sum())} elements differ from the default in infinities"
    return None


def error_ratio(p, got: torch.Tensor, finite: torch.Tensor) -> tuple[float, int]:
    """(largest ``|got - ref| / bound`` over the ``finite`` elements, its flat index)."""
    ref, bound = _cached_reference(p)
    err = (got.double() - ref).abs() / bound
    err = torch.where(finite & ref.isfinite(), err, torch.zeros((), dtype=err.dtype, device=err.device))
    worst = int(err.flatten().argmax()) if err.numel() else 0
    return (float(err.flatten()[worst]) if err.numel() else 0.0), worst


def _cached_reference(p):
    cached = p.__dict__.get("_gemm_reference")
    if cached is None:
        cached = p.__dict__["_gemm_reference"] = reference(p)
    return cached


def _default_error(p, expected: torch.Tensor) -> float:
    """The default's own error ratio, once per reference output (kept on the params)."""
    key = (expected.data_ptr(), expected.shape)
    known = p.__dict__.get("_gemm_default_error")
    if known is None or known[0] != key:
        known = p.__dict__["_gemm_default_error"] = (key, error_ratio(p, expected, expected.isfinite())[0])
    return known[1]


def check_gemm(p, got: tuple, expected: tuple) -> str | None:
    """``TunableOp(numerics=...)``: None when the candidate's output ``got[0]`` passes against the
    default's ``expected[0]`` for params ``p`` (see the module docstring), else why not."""
    g, e = got[0], expected[0]
    if g.shape != e.shape or g.dtype != e.dtype:
        return f"result {g.dtype}{list(g.shape)} where the default gives {e.dtype}{list(e.shape)}"
    if g.numel() == 0:
        return None
    problem = _placement(g, e)
    if problem:
        return problem
    default = _default_error(p, e)
    ratio, worst = error_ratio(p, g, e.isfinite())
    limit = max(1.0, 2.0 * default)
    if ratio <= limit:
        return None
    ref = _cached_reference(p)[0].flatten()[worst]
    return (f"error {ratio:.3g} x the GEMM bound, over the limit {limit:.3g} (the default's {default:.3g}); "
            f"worst at flat index {worst}: {float(g.flatten()[worst]):.7g} vs exact {float(ref):.7g}")


def _loads_kernels_lazily(device: torch.device) -> bool:
    return device.type == "cuda"


def warm_reference(p) -> None:
    """The check once on a small problem of ``p``'s dtype, device and activation, once per process
    (``TunableOp.warm_numerics``: off the tuning budget, on a worker in an online session). Why: the first float64 GEMM and
    elementwise kernels a process runs take their load time, 230 ms on the H100, which the first GEMM
    signature's 200 ms budget paid before, and it froze on cuBLAS; after the warm-up, a check costs
    what it computes (1-6 ms at 4096 x 6144 x 4096). Nothing on the CPU: no kernel loads lazily there, and
    the small problem alone took 0.2 s on the 2-core host."""
    a = p.a
    key = (a.device, a.dtype, p.activation)
    if key in _warmed or not _loads_kernels_lazily(a.device):
        return
    # no random numbers: the user's random stream stays untouched, and no generator is made on the worker
    # thread that runs this (thread_context.off_thread) while the user's may capture a graph
    x = ((torch.arange(WARM_SIZE * WARM_SIZE, device=a.device) % 17 - 8) / 8).to(a.dtype).reshape(WARM_SIZE, WARM_SIZE)
    small = GemmParams(x, x, activation=p.activation)
    result = x @ x  # Tensor.__matmul__: never a patched torch.matmul
    check_gemm(small, (result,), (result,))
    _warmed.add(key)
