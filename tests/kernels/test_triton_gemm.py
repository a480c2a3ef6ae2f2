"""Triton GEMM kernels with pointer loads (``kernels/triton/gemm.py``: ``matmul_kernel``, split-K and its
reduction, the skinny kernel) launched directly, against float64 torch (``tests/triton_gemm_checks.py``: the
launcher, the tolerance, the interpreter on CPU-only machines). Shapes where cuBLAS matters (4097 x 4095 x 4096,
decode M = 1/16, K = 14336) are marked gpu. The persistent TMA kernel and the sm_90 compile:
``test_triton_gemm_tma.py``.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from triton_gemm_checks import (ACTS, DTYPES, FILTERS, NAN, check, device, gemm, launch, nans,  # noqa: F401
                                operands, randn)

pytestmark = FILTERS


# --------------------------------------------------------------------------------------------------
# matmul_kernel
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 65), (33, 7, 17), (65, 64, 64)], ids=str)
def test_matmul_shapes(shape, dtype, device):
    """Odd M, N, K (masked tails everywhere), EVEN_K at 64 / 16, a 1 x 1 x 1 product."""
    M, N, K = shape
    a, b = operands(M, N, K, dtype, device)
    out = launch("matmul", a, b, nans((M, N), dtype, device), group_m=2)
    check(out, a, b)


@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t", "sliced", "out_t"])
def test_matmul_strided_views(layout, device):
    """Transposed operands (linear's weight is b = w.t()), column-sliced and row-strided views, a
    transposed output: strides only, no copies."""
    M, N, K, dt = 19, 23, 37, torch.float16
    a = randn((M, K), dt, device)
    b = randn((K, N), dt, device, seed=1)
    out = nans((M, N), dt, device)
    if layout in ("a_t", "both_t"):
        a = randn((K, M), dt, device).t()
    if layout in ("b_t", "both_t"):
        b = randn((N, K), dt, device, seed=1).t()
    if layout == "sliced":
        a = randn((M, 2 * K + 3), dt, device)[:, 3::2]  # stride_ak = 2, offset 3
        b = randn((3 * K, N + 5), dt, device, seed=1)[1::3, 2:N + 2]  # stride_bk = 3 (N + 5)
    if layout == "out_t":
        out = nans((N, M), dt, device).t()
    launch("matmul", a, b, out)
    check(out, a, b)


@pytest.mark.parametrize("act", list(ACTS))
def test_matmul_epilogue(act, device):
    """addmm + bias + activation: out = ACT(alpha * A@B + beta * C + bias), bf16 C and bias, fp32 out."""
    M, N, K = 21, 34, 40
    a, b = operands(M, N, K, torch.bfloat16, device)
    c, bias = randn((M, N), torch.bfloat16, device, seed=5), randn(N, torch.bfloat16, device, seed=6)
    out = launch("matmul", a, b, nans((M, N), torch.float32, device), c, bias, alpha=0.75, beta=-1.5, act=act)
    check(out, a, b, c, bias, 0.75, -1.5, act)


def test_matmul_broadcast_c(device):
    """addmm's input broadcast from (N,) and from (M, 1) (stride 0, no copy), alpha and beta != 1."""
    M, N, K = 17, 30, 24
    a, b = operands(M, N, K, torch.float32, device)
    for c in (randn(N, torch.float32, device, seed=3), randn((M, 1), torch.float32, device, seed=4)):
        out = launch("matmul", a, b, nans((M, N), torch.float32, device), c, alpha=2.0, beta=0.5)
        check(out, a, b, c, alpha=2.0, beta=0.5)


def test_beta_zero_does_not_read_c(device):
    """beta == 0: C is not read, so NaN in C stays out (torch.addmm); beta != 0 propagates it."""
    M, N, K = 9, 18, 20
    a, b = operands(M, N, K, torch.float16, device)
    c = nans((M, N), torch.float16, device)
    out = launch("matmul", a, b, nans((M, N), torch.float16, device), c, beta=0.0)
    check(out, a, b)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), torch.addmm(c.float(), a.float(), b.float(), beta=0).half().cpu(),
                               rtol=2e-3, atol=1e-3)
    out = launch("matmul", a, b, nans((M, N), torch.float16, device), c, beta=1.0)
    assert out.isnan().all()


@pytest.mark.parametrize("act", list(ACTS))
def test_specials_in_c_propagate(act, device):
    """NaN and +-inf in C reach the output through every activation as in torch (relu keeps NaN;
    silu and gelu of -inf are NaN: -inf * 0)."""
    M, N, K = 4, 16, 16
    a, b = operands(M, N, K, torch.float32, device)
    c = randn((M, N), torch.float32, device, seed=2)
    c[0, :3] = torch.tensor([NAN, float("inf"), -float("inf")])
    out = launch("matmul", a, b, nans((M, N), torch.float32, device), c, act=act)
    check(out, a, b, c, act=act)


@pytest.mark.parametrize("kind", ["matmul", "skinny"])
def test_k_zero(kind, device):
    """K == 0: ACT(beta * C + bias), and zeros without C (torch.addmm / mm on empty K)."""
    M, N = 5, 19
    a, b = operands(M, N, 0, torch.float32, device)
    c, bias = randn((M, N), torch.float32, device, seed=2), randn(N, torch.float32, device, seed=3)
    out = launch(kind, a, b, nans((M, N), torch.float32, device), c, bias, alpha=3.0, beta=0.5, act="silu",
                 block=(8, 16, 16) if kind == "skinny" else (16, 16, 16))
    torch.testing.assert_close(out, F.silu(0.5 * c + bias))
    out = launch(kind, a, b, nans((M, N), torch.float32, device), block=(8, 16, 16) if kind == "skinny" else (16, 16, 16))
    assert (out == 0).all()


def test_empty_output_launches_nothing(device):
    a, b = operands(0, 4, 8, torch.float32, device)
    out = torch.empty(0, 4, device=device)
    assert launch("matmul", a, b, out) is out


def test_batched(device):
    """bmm / baddbmm: batch folded into the grid; B broadcast over the batch (stride 0), C per batch
    entry, C broadcast from (N,)."""
    batch, M, N, K = 3, 13, 20, 33
    a, b = operands(M, N, K, torch.float16, device, batch=batch)
    out = launch("matmul", a, b, nans((batch, M, N), torch.float16, device), group_m=2)
    check(out, a, b)
    w = randn((K, N), torch.float16, device, seed=7).expand(batch, K, N)
    c = randn((batch, M, N), torch.float16, device, seed=8)
    out = launch("matmul", a, w, nans((batch, M, N), torch.float16, device), c, alpha=0.5, beta=2.0)
    check(out, a, w, c, alpha=0.5, beta=2.0)
    c = randn(N, torch.float32, device, seed=9)
    out = launch("matmul", a, b, nans((batch, M, N), torch.float32, device), c, act="relu")
    check(out, a, b, c, act="relu")


def test_tf32_precision_accepted(device):
    """INPUT_PRECISION="tf32" compiles and runs (the interpreter computes in fp32 regardless; on a GPU
    the error is tf32's: 10-bit mantissa inputs)."""
    M, N, K = 16, 16, 32
    a, b = operands(M, N, K, torch.float32, device)
    out = launch("matmul", a, b, nans((M, N), torch.float32, device), precision="tf32")
    torch.testing.assert_close(out, (a.double() @ b.double()).float(), rtol=1e-2, atol=1e-2 * math.sqrt(K))


# --------------------------------------------------------------------------------------------------
# split-K
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["matmul", "skinny"])
@pytest.mark.parametrize("split_k,K", [(2, 64), (3, 50), (4, 20)], ids=["even", "odd", "empty_splits"])
def test_split_k_deterministic(kind, split_k, K, device):
    """Split-K partials + fixed-order reduction with the full epilogue: right, and bit-identical
    when run again. K = 20 with 4 splits of 16 leaves splits with no K block (they write zeros)."""
    M, N = 11, 27
    block = (16, 16, 16) if kind == "matmul" else (4, 16, 16)
    a, b = operands(M, N, K, torch.bfloat16, device)
    c, bias = randn((M, N), torch.bfloat16, device, seed=2), randn(N, torch.bfloat16, device, seed=3)
    kwargs = dict(alpha=1.25, beta=0.5, act="gelu_tanh", block=block, split_k=split_k, reduce_block=(4, 16))
    first = launch(kind, a, b, nans((M, N), torch.bfloat16, device), c, bias, **kwargs)
    check(first, a, b, c, bias, 1.25, 0.5, "gelu_tanh")
    again = launch(kind, a, b, nans((M, N), torch.bfloat16, device), c, bias, **kwargs)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))


def test_split_k_batched_strided_out(device):
    """Workspace layout [SPLIT_K, batch, M, N] with batch > 1 and a transposed output view."""
    batch, M, N, K = 2, 9, 14, 48
    a, b = operands(M, N, K, torch.float32, device, batch=batch)
    out = nans((batch, N, M), torch.float32, device).transpose(1, 2)
    launch("matmul", a, b, out, split_k=3, reduce_block=(8, 8))
    check(out, a, b)


# --------------------------------------------------------------------------------------------------
# skinny (decode) kernel
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,block_m", [(1, 1), (3, 4), (9, 2)])
def test_skinny_linear(M, block_m, dtype, device):
    """x @ w.t() + bias for a few rows against an N x K weight (K-contiguous tiles), rows tiled when
    M > BLOCK_M; split-K in two of the cases."""
    N, K = 40, 72
    x = randn((M, K), dtype, device)
    w = randn((N, K), dtype, device, seed=1)
    bias = randn(N, dtype, device, seed=2)
    split = 1 if M == 3 else 3
    out = launch("skinny", x, w.t(), nans((M, N), dtype, device), bias=bias, act="silu", block=(block_m, 16, 32),
                 split_k=split, reduce_block=(1, 32))
    check(out, x, w.t(), bias=bias, act="silu")


def test_even_k():
    assert gemm.even_k(128, 64) and gemm.even_k(256, 64, 4) and not gemm.even_k(192, 64, 2)
    assert gemm.even_k(0, 64, 2)


# --------------------------------------------------------------------------------------------------
# GPU: the shapes the kernels are for
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4097, 4095, 512), (777, 1555, 333), (257, 1031, 4096)], ids=str)
def test_gpu_odd_shapes(shape, cuda):
    M, N, K = shape
    a, b = operands(M, N, K, torch.bfloat16, cuda)
    bias = randn(N, torch.bfloat16, cuda, seed=3)
    for cfg in (dict(block=(128, 128, 64), num_warps=8, num_stages=3, group_m=8),
                dict(block=(64, 128, 32), num_warps=4, num_stages=4, group_m=8, split_k=2, reduce_block=(32, 64))):
        out = launch("matmul", a, b, nans((M, N), torch.bfloat16, cuda), bias=bias, act="gelu", **cfg)
        check(out, a, b, bias=bias, act="gelu")


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16])
def test_gpu_decode(M, cuda):
    N, K = 4096, 14336
    x = randn((M, K), torch.bfloat16, cuda)
    w = randn((N, K), torch.bfloat16, cuda, seed=1)
    out = launch("skinny", x, w.t(), nans((M, N), torch.bfloat16, cuda), block=(min(M, 2), 16, 512),
                 split_k=2, reduce_block=(1, 1024))
    check(out, x, w.t())
    out = launch("matmul", x, w.t(), nans((M, N), torch.bfloat16, cuda), block=(16, 64, 128), num_warps=4,
                 num_stages=4, split_k=8, reduce_block=(16, 256))
    check(out, x, w.t())
