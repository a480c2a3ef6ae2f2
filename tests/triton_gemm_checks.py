"""Launching the Triton GEMM kernels (``kernels/triton/gemm.py``, ``gemm_tma.py``) directly, and checking
their outputs against float64 torch: what tests/kernels/test_triton_gemm*.py share.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before the
kernels modules are imported): sizes stay <= 65 and tiles at 16, so every case still has several
tiles, masked tails in M, N and K, and several K steps. Outputs start as NaN (an element the
kernel never writes fails), inputs are random normals (never zeros).

The tolerance (``check``): ``tests/gemm_checks.py``, with the kernels' bias in the error scale.
"""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels module decorates its kernels

from tunekit.kernels.triton import gemm, gemm_tma  # noqa: E402

import gemm_checks  # noqa: E402
from gemm_checks import ACTS, DTYPES, NAN, nans, randn  # noqa: E402,F401

#: warnings of numpy inside Triton's interpreter, filtered by the test modules
FILTERS = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
           pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


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


def check(out, a, b, c=None, bias=None, alpha=1.0, beta=1.0, act="none"):
    """gemm_checks.check with the kernels' argument order (c, bias, alpha, beta, act)."""
    gemm_checks.check(out, a, b, c, alpha, beta, act, bias=bias)


@pytest.fixture
def device():
    """cuda when there is one; else cpu, through the interpreter when the kernels were built for it."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not gemm.INTERPRETED:
        pytest.skip("kernels module was imported before TRITON_INTERPRET=1 was set; they cannot run on CPU")
    return torch.device("cpu")


def operands(M, N, K, dtype, device, batch=None, seed=0):
    pre = () if batch is None else (batch,)
    return randn(pre + (M, K), dtype, device, seed), randn(pre + (K, N), dtype, device, seed + 1)
