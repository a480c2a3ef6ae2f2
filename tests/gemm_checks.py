"""What the GEMM tests share (tests/ops/test_gemm_*.py, and the Triton kernels' through triton_gemm_checks.py): fresh random operands in every layout, a float64 reference and the
bound a correct fp32-accumulating GEMM meets (independent of tunekit's own numerical check).

Bound per element, against the float64 result of the same
(already rounded) inputs::

    |out - ref| <= (eps_out + 8 eps32) |ref| + (2 sqrt(K) + 4) eps_acc * 1.2 * scale + tiny_out
    scale = |alpha| (|A| @ |B|) + |beta| |C| + |bias|

eps_acc is float32's eps, or 2**-10 with TF32 (inputs rounded to 10 mantissa bits; GPU only). NaN
must sit exactly where the reference has NaN, infinities match in place and sign.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from elementwise_checks import triton_on_cpu  # noqa: F401 - the GEMM tests take it from here

NAN = float("nan")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTS = {"none": lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def randn(shape, dtype=torch.float32, device="cpu", seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def nans(shape, dtype, device="cpu") -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype, device=device)


def matrix(rows, cols, dtype=torch.float32, device="cpu", layout="row", seed=0, batch=None) -> torch.Tensor:
    """A [batch?,] rows x cols operand laid out as ``layout``: "row" (contiguous), "col" (a transposed
    contiguous tensor), "sliced" (every other column of a wider tensor, offset 1: strided and
    misaligned), "misaligned" (contiguous rows at a base one element off 16 bytes), "ld" (rows of a
    wider tensor: a padded leading dimension), "bcast" (3-D only: one matrix expanded over the batch)."""
    pre = () if batch is None else (batch,)
    if layout == "row":
        return randn((*pre, rows, cols), dtype, device, seed)
    if layout == "col":
        return randn((*pre, cols, rows), dtype, device, seed).mT
    if layout == "sliced":
        return randn((*pre, rows, 2 * cols + 1), dtype, device, seed)[..., 1::2]
    if layout == "misaligned":
        flat = randn(math.prod(pre) * rows * cols + 1, dtype, device, seed)
        return flat[1:].view(*pre, rows, cols)
    if layout == "ld":
        return randn((*pre, rows, cols + 8), dtype, device, seed)[..., :cols]
    if layout == "bcast":
        return randn((1, rows, cols), dtype, device, seed).expand(batch, rows, cols)
    raise ValueError(layout)


def reference(a, b, c=None, alpha=1.0, beta=1.0, act="none", bias=None):
    """float64 result of ACT(alpha * a @ b + beta * c + bias) and its error scale."""
    a64, b64 = a.double(), b.double()
    y = alpha * (a64 @ b64)
    scale = abs(alpha) * (a64.abs() @ b64.abs())
    if c is not None and beta != 0:
        y = y + beta * c.double()
        scale = scale + abs(beta) * c.double().abs()
    if bias is not None:
        y = y + bias.double()
        scale = scale + bias.double().abs()
    return ACTS[act](y), scale


def bound(a, b, c=None, alpha=1.0, beta=1.0, act="none", tf32=False, out_dtype=None, bias=None):
    """(float64 reference, allowed error per element) on a's device (module docstring)."""
    ref, scale = reference(a, b, c, alpha, beta, act, bias)
    K = a.shape[-1]
    fin = torch.finfo(out_dtype or a.dtype)
    eps32 = torch.finfo(torch.float32).eps
    eps_acc = 2.0 ** -10 if tf32 else eps32
    allowed = ((fin.eps + 8 * eps32) * ref.abs() + (2 * math.sqrt(K) + 4) * eps_acc * 1.2 * scale
               + fin.smallest_normal * fin.eps)
    return ref, allowed


def within(out, ref, allowed) -> None:
    """Assert ``out`` is within ``allowed`` of ``ref`` with NaN / inf exactly placed (on out's device)."""
    got = out.double()
    ref, allowed = ref.to(got.device).expand(got.shape), allowed.to(got.device).expand(got.shape)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    nan_got, nan_ref = got.isnan(), ref.isnan()
    assert not (nan_got & ~nan_ref).any(), f"{int((nan_got & ~nan_ref).sum())} NaN where the reference is not"
    assert not (nan_ref & ~nan_got).any(), f"{int((nan_ref & ~nan_got).sum())} not NaN where the reference is"
    inf_bad = (got.isinf() | ref.isinf()) & (got != ref)
    assert not inf_bad.any(), f"{int(inf_bad.sum())} elements differ in infinities"
    excess = ((got - ref).abs().nan_to_num(0.0) - allowed).nan_to_num(0.0)
    if excess.numel():
        i = int(excess.argmax())
        assert excess.flatten()[i] <= 0, (f"{int((excess > 0).sum())} elements off; worst at {i}: "
                                          f"{float(got.flatten()[i])} vs {float(ref.flatten()[i])} "
                                          f"(allowed {float(allowed.flatten()[i]):.3g})")


def check(out, a, b, c=None, alpha=1.0, beta=1.0, act="none", tf32=False, bias=None) -> None:
    """Assert ``out`` is a correct ACT(alpha * a @ b + beta * c + bias) in out's dtype (module docstring)."""
    within(out, *bound(a, b, c, alpha, beta, act, tf32, out.dtype, bias))


def run_checked(candidate, p):
    """Run ``candidate`` on ``p`` (its hard requirements must hold) and return the output (``p.out`` when given)."""
    why = candidate.cannot_run(p)
    assert why is None, f"{candidate.name}: {why}"
    result = candidate.run(p)
    if p.out is not None:
        assert result is p.out
    return result


def check_graph_of_two_calls(candidate, p1, p2, act: str) -> None:
    """``candidate`` on ``p1`` then ``p2`` (linear's addmm with other biases) captured in one CUDA graph
    (``p1`` run first, outside it: plans and workspaces are made there), outputs NaN-filled, replayed:
    each call keeps its own bias."""
    candidate.run(p1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1, y2 = candidate.run(p1), candidate.run(p2)
    y1.fill_(float("nan"))
    y2.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(y1, p1.a, p1.b, p1.c, act=act)
    check(y2, p2.a, p2.b, p2.c, act=act)

