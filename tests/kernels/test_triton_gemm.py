"""Triton GEMM kernels (``kernels/triton/gemm.py``) launched directly, against float64 torch.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before the
kernels module is imported): sizes stay <= 65 and tiles at 16, so every case still has several
tiles, masked tails in M, N and K, and several K steps. Outputs start as NaN (an element the
kernel never writes fails), inputs are random normals (never zeros).

Tolerance (``check``), per element, against the float64 result of the same (already rounded) inputs:

    |out - ref| <= (eps_out + 8 eps_f32) |ref| + (2 sqrt(K) + 4) eps_f32 * 1.2 * scale + tiny_out

- eps_out |ref|: the single rounding to out's dtype (plus a few fp32 ulps of the activation);
- scale = |alpha| (|A| @ |B|) + |beta| |C| + |bias|: fp32 accumulation error grows like sqrt(K)
  relative to the sum of |products| (not to |ref|, which can cancel to ~0); 16-bit products are
  exact in fp32; 1.2 bounds the activations' slope (gelu's max slope is 1.13);
- tiny_out: half the smallest subnormal step of out's dtype (silu/gelu tails underflow in fp16).
NaN must be exactly where the reference has NaN.

A subprocess compiles every kernel for sm_90 (cubin, no GPU needed) with Triton's NVIDIA backend,
so API breakage and Hopper lowering (wgmma, TMA) are caught on CPU-only CI. Shapes where cuBLAS
matters (4097 x 4095 x 4096, decode M = 1/16, K = 14336) are marked gpu.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels module decorates its kernels

from tunekit.kernels.triton import gemm, gemm_tma  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),  # numpy, interpreter
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

NAN = float("nan")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTS = {"none": lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------------
# host side: what a launcher does (grid, workspace, strides, constexprs)
# --------------------------------------------------------------------------------------------------

def _cuda_scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _set_allocator():
    """Device-side TMA descriptors need global scratch from Triton's allocator. It is a ContextVar
    (Triton >= 3.4): set it in the launching thread; setting it again is one ContextVar.set."""
    triton.set_allocator(_cuda_scratch)


def _as3(t):
    """A 2-D operand as batch 1 with batch stride 0 (0 keeps Triton's divisible-by-16 hint)."""
    if t.dim() == 3:
        return t, t.stride(0)
    return t.unsqueeze(0), 0


def launch(kind, a, b, out, c=None, bias=None, alpha=1.0, beta=1.0, act="none", *, block=(16, 16, 16),
           group_m=1, split_k=1, precision="ieee", num_warps=4, num_stages=2, reduce_block=(16, 32),
           num_sms=4, out_tma=False, flatten=True):
    """out = ACT(alpha * a @ b + beta * c + bias) with kernel ``kind`` ("matmul", "skinny", "tma").
    a: [batch,] M x K, b: [batch,] K x N, out: [batch,] M x N (any strides); c broadcastable to out."""
    a3, sab = _as3(a)
    b3, sbb = _as3(b)
    o3, sob = _as3(out)
    batch, M, K = a3.shape
    N = b3.shape[-1]
    assert b3.shape[0] == batch and o3.shape == (batch, M, N)
    if batch == 0 or M == 0 or N == 0:
        return out
    has_c = c is not None and beta != 0
    if has_c:
        c3 = c.expand(out.shape) if out.dim() == 3 else c.expand(M, N).unsqueeze(0)
        c_strides = (c3.stride(0) if batch > 1 else 0, c3.stride(1), c3.stride(2))
    else:
        c3, c_strides = None, (0, 0, 0)
    bias_stride = bias.stride(0) if bias is not None else 0
    args = [a, b, c3, bias, None, None, M, N, K, batch, sab, a3.stride(1), a3.stride(2), sbb, b3.stride(1),
            b3.stride(2), *c_strides, bias_stride, sob, o3.stride(1), o3.stride(2), alpha, beta]
    epilogue = dict(HAS_C=has_c, HAS_BIAS=bias is not None, ACTIVATION=gemm.ACTIVATIONS[act])
    bm, bn, bk = block
    launch_opts = dict(num_warps=num_warps, num_stages=num_stages)
    if kind == "tma":
        if a.is_cuda:
            _set_allocator()
        args[4] = out
        tiles = batch * triton.cdiv(M, bm) * triton.cdiv(N, bn)
        gemm_tma.matmul_tma_persistent_kernel[(min(num_sms, tiles),)](
            *args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, NUM_SMS=num_sms,
            A_ROW_MAJOR=a.stride(-1) == 1, B_ROW_MAJOR=b.stride(-1) == 1, BATCHED=batch > 1, OUT_TMA=out_tma,
            INPUT_PRECISION=precision, FLATTEN=flatten, WARP_SPECIALIZE=False, **epilogue, **launch_opts)
        return out
    ws = None
    if split_k > 1:
        ws = torch.empty(split_k * batch * M * N, dtype=torch.float32, device=a.device)
        args[5] = ws
    else:
        args[4] = out
    grid = (batch * split_k * triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    tiling = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split_k, EVEN_K=gemm.even_k(K, bk, split_k))
    if kind == "matmul":
        gemm.matmul_kernel[grid](*args, GROUP_M=group_m, INPUT_PRECISION=precision, **tiling, **epilogue,
                                 **launch_opts)
    elif kind == "skinny":
        gemm.matmul_skinny_kernel[grid](*args, **tiling, **epilogue, **launch_opts)
    else:
        raise ValueError(kind)
    if split_k > 1:
        rm, rn = reduce_block
        grid = (batch * triton.cdiv(M, rm) * triton.cdiv(N, rn),)
        gemm.splitk_reduce_kernel[grid](ws, c3, bias, out, M, N, batch, *c_strides, bias_stride, sob, o3.stride(1),
                                        o3.stride(2), alpha, beta, SPLIT_K=split_k, BLOCK_M=rm, BLOCK_N=rn,
                                        **epilogue, num_warps=4)
    return out


# --------------------------------------------------------------------------------------------------
# reference and comparison
# --------------------------------------------------------------------------------------------------


def reference(a, b, c=None, bias=None, alpha=1.0, beta=1.0, act="none"):
    """float64 result and the error scale (|alpha| |A|@|B| + |beta| |C| + |bias|)."""
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


def check(out, a, b, c=None, bias=None, alpha=1.0, beta=1.0, act="none"):
    ref, scale = reference(a, b, c, bias, alpha, beta, act)
    K = a.shape[-1]
    fin = torch.finfo(out.dtype)
    eps32 = torch.finfo(torch.float32).eps
    allowed = ((fin.eps + 8 * eps32) * ref.abs() + (2 * math.sqrt(K) + 4) * eps32 * 1.2 * scale
               + fin.smallest_normal * fin.eps)
    got = out.double().cpu()
    ref, allowed = ref.cpu(), allowed.cpu()
    assert got.shape == ref.shape
    nan_got, nan_ref = got.isnan(), ref.isnan()
    assert not (nan_got & ~nan_ref).any(), f"{int((nan_got & ~nan_ref).sum())} NaN where the reference is not"
    assert not (nan_ref & ~nan_got).any(), f"{int((nan_ref & ~nan_got).sum())} not NaN where the reference is"
    inf_bad = (got.isinf() | ref.isinf()) & (got != ref)
    assert not inf_bad.any(), f"{int(inf_bad.sum())} elements differ in infinities"
    err = (got - ref).abs().nan_to_num(0.0)
    excess = (err - allowed).nan_to_num(0.0)
    i = int(excess.argmax())
    assert excess.flatten()[i] <= 0, (f"{int((excess > 0).sum())} elements off; worst at {i}: "
                                      f"{got.flatten()[i]} vs {ref.flatten()[i]} (allowed {allowed.flatten()[i]:.3g})")


@pytest.fixture
def device():
    """cuda when there is one; else cpu, through the interpreter when the kernels were built for it."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not gemm.INTERPRETED:
        pytest.skip("kernels module was imported before TRITON_INTERPRET=1 was set; they cannot run on CPU")
    return torch.device("cpu")


def randn(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def nans(shape, dtype, device):
    return torch.full(shape, NAN, dtype=dtype, device=device)


def operands(M, N, K, dtype, device, batch=None, seed=0):
    pre = () if batch is None else (batch,)
    return randn(pre + (M, K), dtype, device, seed), randn(pre + (K, N), dtype, device, seed + 1)


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


# --------------------------------------------------------------------------------------------------
# persistent TMA kernel (descriptors: the interpreter emulates them)
# --------------------------------------------------------------------------------------------------

needs_descriptors = pytest.mark.skipif(not gemm_tma.HAS_TENSOR_DESCRIPTORS,
                                       reason="this Triton has no tl.make_tensor_descriptor (needs >= 3.4)")


@needs_descriptors
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_tma_persistent_layouts(layout, device):
    """A row-major or transposed, B row-major or w.t() (descriptor boxes transposed in the kernel);
    odd M (TMA zero-fills out-of-bounds boxes); 4 persistent programs over 12 tiles; pointer stores
    for a transposed out in "tt"."""
    M, N, K, dt = 45, 48, 40, torch.float16  # 16-byte aligned rows for N and K (fp16: multiples of 8)
    a = randn((M, K), dt, device) if layout[0] == "n" else randn((K, M + 3), dt, device)[:, :M].t()
    b = randn((K, N), dt, device, seed=1) if layout[1] == "n" else randn((N, K), dt, device, seed=1).t()
    if layout[0] == "t":  # A = x.t() with x K x (M+3) sliced: stride_ak = M + 3 = 48 (96 bytes)
        assert a.stride() == (1, M + 3)
    out = nans((N, M), dt, device).t() if layout == "tt" else nans((M, N), dt, device)
    launch("tma", a, b, out, group_m=2, out_tma=layout != "tt")
    check(out, a, b)


@needs_descriptors
@pytest.mark.parametrize("out_tma", [True, False], ids=["tma_store", "pointer_store"])
def test_tma_persistent_batched_epilogue(out_tma, device):
    """3-D descriptors (BATCHED), bias + C + activation epilogue, bf16, tiles across batch entries."""
    batch, M, N, K = 2, 20, 24, 56
    a, b = operands(M, N, K, torch.bfloat16, device, batch=batch)
    c, bias = randn((batch, M, N), torch.bfloat16, device, seed=4), randn(N, torch.bfloat16, device, seed=5)
    out = launch("tma", a, b, nans((batch, M, N), torch.bfloat16, device), c, bias, alpha=0.5, beta=1.5,
                 act="gelu", out_tma=out_tma, num_sms=3)
    check(out, a, b, c, bias, 0.5, 1.5, "gelu")


@needs_descriptors
def test_tma_persistent_fp32_k_tail(device):
    """float32 ("ieee"), K not a multiple of BLOCK_K (zero-filled box), 2-D."""
    M, N, K = 18, 20, 36
    a, b = operands(M, N, K, torch.float32, device)
    out = launch("tma", a, b, nans((M, N), torch.float32, device), out_tma=True, block=(16, 16, 32))
    check(out, a, b)


def test_tma_compatible():
    x = torch.empty(64, 48, dtype=torch.float16)
    assert gemm_tma.tma_compatible(x) and gemm_tma.tma_compatible(x.t())
    assert not gemm_tma.tma_compatible(torch.empty(64, 45, dtype=torch.float16))  # 90-byte rows
    assert not gemm_tma.tma_compatible(x[:, ::2])  # no unit stride
    assert not gemm_tma.tma_compatible(torch.empty(64, 49, dtype=torch.float16)[:, 1:])  # misaligned base
    assert not gemm_tma.tma_compatible(torch.empty(1, 48, dtype=torch.float16).expand(3, 64, 48))  # batch stride 0
    assert gemm_tma.tma_compatible(torch.empty(3, 64, 48, dtype=torch.bfloat16))


def test_even_k():
    assert gemm.even_k(128, 64) and gemm.even_k(256, 64, 4) and not gemm.even_k(192, 64, 2)
    assert gemm.even_k(0, 64, 2)


# --------------------------------------------------------------------------------------------------
# compile every kernel for sm_90 without a GPU
# --------------------------------------------------------------------------------------------------

#: (kernel, pointer dtypes, constexprs, unit strides (specialized to 1 as launches do), num_warps,
#:  num_stages, what the PTX must contain)
SM90_VARIANTS = [
    ("matmul_kernel", "bf16", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT_K=1, EVEN_K=True,
                                   HAS_C=True, HAS_BIAS=True, ACTIVATION=4, INPUT_PRECISION="ieee"),
     ("stride_ak", "stride_bn", "stride_cn", "stride_on", "stride_bias"), 8, 3, ("wgmma", "cp.async")),
    ("matmul_kernel", "fp32", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, SPLIT_K=4, EVEN_K=False,
                                   HAS_C=False, HAS_BIAS=False, ACTIVATION=0, INPUT_PRECISION="tf32"),
     ("stride_am", "stride_bk"), 4, 4, ("wgmma",)),
    ("matmul_skinny_kernel", "bf16", dict(BLOCK_M=1, BLOCK_N=64, BLOCK_K=256, SPLIT_K=4, EVEN_K=False,
                                          HAS_C=False, HAS_BIAS=False, ACTIVATION=0),
     ("stride_ak", "stride_bk"), 4, 1, ("ld.global.v4",)),
    ("splitk_reduce_kernel", "fp16", dict(SPLIT_K=4, BLOCK_M=1, BLOCK_N=1024, HAS_C=True, HAS_BIAS=True,
                                          ACTIVATION=2),
     ("stride_cn", "stride_on", "stride_bias"), 4, 1, ()),
    ("matmul_tma_persistent_kernel", "bf16",
     dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, NUM_SMS=132, A_ROW_MAJOR=True, B_ROW_MAJOR=False,
          BATCHED=False, OUT_TMA=True, HAS_C=False, HAS_BIAS=True, ACTIVATION=3, INPUT_PRECISION="ieee",
          FLATTEN=True, WARP_SPECIALIZE=False),
     ("stride_ak", "stride_bk", "stride_on", "stride_bias"), 8, 3, ("wgmma", "cp.async.bulk.tensor")),
    ("matmul_tma_persistent_kernel", "fp16",
     dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, NUM_SMS=132, A_ROW_MAJOR=False, B_ROW_MAJOR=True,
          BATCHED=True, OUT_TMA=False, HAS_C=True, HAS_BIAS=False, ACTIVATION=1, INPUT_PRECISION="ieee",
          FLATTEN=True, WARP_SPECIALIZE=False),
     ("stride_am", "stride_bn", "stride_cn", "stride_on"), 8, 4, ("wgmma", "cp.async.bulk.tensor")),
]


def compile_sm90(name, dtype, constexprs, unit_strides, num_warps, num_stages):
    """Compile one kernel variant for sm_90 through Triton's NVIDIA backend (no GPU needed): ints
    divisible by 16 and 16-byte aligned pointers as a launch with aligned tensors would specialize
    them. Returns the PTX. Must run with TRITON_INTERPRET unset (JITFunctions, not interpreted)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(gemm_tma if name == "matmul_tma_persistent_kernel" else gemm, name)
    names = kernel.arg_names
    ptr_types = {"ws_ptr": "*fp32"}
    unused = {"c_ptr": not constexprs.get("HAS_C", True), "bias_ptr": not constexprs.get("HAS_BIAS", True),
              "ws_ptr": constexprs.get("SPLIT_K", 1) == 1 and name != "splitk_reduce_kernel",
              "out_ptr": constexprs.get("SPLIT_K", 1) > 1 and name != "splitk_reduce_kernel"}
    signature, consts, attrs = {}, {}, {}
    for i, arg in enumerate(names):
        if arg in constexprs:
            signature[arg], consts[arg] = "constexpr", constexprs[arg]
        elif arg.endswith("_ptr"):
            if unused.get(arg, False):
                signature[arg], consts[arg] = "constexpr", None
            else:
                signature[arg] = ptr_types.get(arg, "*" + dtype)
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif arg in ("alpha", "beta"):
            signature[arg] = "fp32"
        elif arg in unit_strides:
            signature[arg], consts[arg] = "constexpr", 1
        else:
            signature[arg] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    return compiled.asm["ptx"]


def _compile_all():
    """Entry point of the subprocess below: compile SM90_VARIANTS, check the PTX, print one line each."""
    for name, dtype, constexprs, unit, warps, stages, needles in SM90_VARIANTS:
        ptx = compile_sm90(name, dtype, constexprs, unit, warps, stages)
        missing = [n for n in needles if n not in ptx]
        print(name, dtype, "missing " + ",".join(missing) if missing else "ok", flush=True)
        assert not missing, f"{name} {dtype}: no {missing} in the sm_90 PTX"


def _has_nvidia_backend():
    try:
        from triton.backends import backends
    except ImportError:  # pragma: no cover
        return False
    return "nvidia" in backends


@pytest.mark.skipif(not _has_nvidia_backend(), reason="this Triton install has no NVIDIA backend")
def test_compiles_for_sm90():
    """Every kernel lowers to sm_90 PTX (ptxas included) on this machine, GPU or not: wgmma in the
    tl.dot kernels, cp.async pipelining in matmul_kernel, TMA (cp.async.bulk.tensor) in the
    persistent kernel, 16-byte loads in the skinny kernel."""
    src = str(Path(gemm.__file__).resolve().parents[3])
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join([src, str(HERE), os.environ.get("PYTHONPATH", "")])}
    code = "import test_triton_gemm as t; t._compile_all()"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert run.stdout.count(" ok") == len(SM90_VARIANTS), run.stdout


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


@pytest.mark.gpu
@needs_descriptors
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_gpu_tma_persistent(layout, cuda):
    M, N, K = 1000, 1536, 1024
    a = randn((M, K), torch.bfloat16, cuda) if layout[0] == "n" else randn((K, M), torch.bfloat16, cuda).t()
    b = randn((K, N), torch.bfloat16, cuda, seed=1) if layout[1] == "n" else randn((N, K), torch.bfloat16, cuda,
                                                                                      seed=1).t()
    sms = torch.cuda.get_device_properties(cuda).multi_processor_count
    for out_tma in (True, False):
        out = launch("tma", a, b, nans((M, N), torch.bfloat16, cuda), block=(128, 128, 64), num_warps=8,
                     num_stages=3, group_m=8, num_sms=sms, out_tma=out_tma)
        check(out, a, b)
    a3, b3 = operands(200, 256, 320, torch.bfloat16, cuda, batch=3)
    out = launch("tma", a3, b3, nans((3, 200, 256), torch.bfloat16, cuda), block=(128, 128, 64), num_warps=8,
                 num_stages=3, num_sms=sms, out_tma=True)
    check(out, a3, b3)
