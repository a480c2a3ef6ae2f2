"""The persistent TMA GEMM kernel (``kernels/triton/gemm_tma.py``) launched directly against float64 torch
(``tests/triton_gemm_checks.py``), and every GEMM kernel compiled for sm_90 without a GPU: a subprocess
compiles each variant (cubin) with Triton's NVIDIA backend, so API breakage and Hopper lowering (wgmma, TMA)
are caught on CPU-only CI.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_gemm_checks import FILTERS, check, device, gemm, gemm_tma, launch, nans, operands, randn, triton  # noqa: F401

pytestmark = FILTERS

HERE = Path(__file__).resolve().parent


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
           "PYTHONPATH": os.pathsep.join([src, str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    code = "import test_triton_gemm_tma as t; t._compile_all()"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert run.stdout.count(" ok") == len(SM90_VARIANTS), run.stdout


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
