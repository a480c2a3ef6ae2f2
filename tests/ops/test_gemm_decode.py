"""The CUDA C decode GEMM candidates (``ops/gemm/cuda_decode.py``, ``kernels/cuda/gemm_decode.cu``): every
configuration against a float64 reference on the GPU (M from 1 to 16, N and K that leave partial row
groups and passes, padded leading dimensions, outputs pre-filled with NaN, NaN / inf in the operands),
and on any machine what they refuse and that the kernels compile."""

import pytest
import torch

from gemm_checks import check, nans, randn
from tunekit.backends import kernel_units, nvrtc
from tunekit.ops.gemm import AddmmParams, GemmParams, mm_op
from tunekit.ops.gemm.cuda_decode import CONFIGS, GEMV_CONFIGS, MAX_M, CudaDecode, CudaGemv, _aligned, decode_candidates

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _linear(M, N, K, dtype, device, *, ld=0, seed=0):
    """a [M, K] and b = w.t() for w [N, K], rows padded by ``ld`` elements (a padded leading dimension)."""
    a = randn((M, K + ld), dtype, device, seed)[:, :K]
    w = randn((N, K + ld), dtype, device, seed + 1)[:, :K]
    return a, w.t()


def test_mm_lists_every_configuration_and_addmm_none():
    names = {c.name for c in mm_op.candidates}
    assert {f"cuda_decode_g{g}_w{w}_u{u}" for g, w, u in CONFIGS} <= names
    assert {f"cuda_gemv_w{w}_u{u}" for w, u in GEMV_CONFIGS} <= names
    from tunekit.ops.gemm import addmm_op
    assert not any(isinstance(c, CudaDecode) for c in addmm_op.candidates)


def test_refusals_say_why():
    """Every check but the pointers' (read only for CUDA tensors: meta and fake ones have none) on CPU tensors,
    where a layout that passes them all meets "needs a CUDA device"."""
    c = CudaDecode(*CONFIGS[0])
    bf = torch.bfloat16
    a, b = _linear(4, 64, 128, bf, "cpu")

    def why(p, candidate=c):
        return candidate.supports(p) or ""

    assert "needs a CUDA device" in why(GemmParams(a, b))  # everything else holds on this CPU tensor
    assert "mm only" in why(AddmmParams(torch.randn(64, dtype=bf), a, b))
    assert "float16 or bfloat16" in why(GemmParams(a.float(), b.float()))
    assert "activation none" in why(GemmParams(a, b, activation="relu"))
    big, bb = _linear(MAX_M + 1, 64, 128, bf, "cpu")
    assert "M <= 16" in why(GemmParams(big, bb))
    odd_a, odd_b = _linear(4, 64, 124, bf, "cpu")
    assert "multiple of 8" in why(GemmParams(odd_a, odd_b))
    assert "linear's layout" in why(GemmParams(a, b.contiguous()))  # b row-major: w not K-contiguous
    assert "the product's shape" in why(GemmParams(a, b, torch.empty(4, 65, dtype=bf)))
    assert "2-D" in why(GemmParams(a[None], b[None]))
    assert "on one device" in why(GemmParams(a, b, torch.empty(4, 64, dtype=bf, device="meta")))
    gemv = CudaGemv(*GEMV_CONFIGS[0])
    assert "M = 1" in why(GemmParams(a, b), gemv)
    one, wt = randn((1, 130), bf)[:, :128], _linear(1, 64, 128, bf, "cpu")[1]  # M = 1: a's row stride unused
    assert "needs a CUDA device" in why(GemmParams(one, wt), gemv)
    meta = torch.empty(2, 128, dtype=bf, device="meta")
    assert "needs a CUDA device" in why(GemmParams(meta, torch.empty(64, 128, dtype=bf, device="meta").t()))


def test_alignment_rule():
    """Rows of whole 16-byte vectors from a 16-byte aligned base; a single row's stride is never used."""
    bf = torch.bfloat16
    flat = randn(8 * 136 + 8, bf)
    assert _aligned(flat[:8 * 136].view(8, 136)) and not _aligned(flat[1:8 * 136 + 1].view(8, 136))
    assert not _aligned(randn((4, 130), bf)[:, :128]) and _aligned(randn((1, 130), bf)[:, :128])
    assert _aligned(randn((1, 128), bf).expand(4, 128))  # row stride 0: every row the same


@pytest.mark.skipif(nvrtc.available() is not None, reason="NVRTC unavailable")
@pytest.mark.parametrize("filename, name", [(f, n) for f in ("gemm_decode.cu", "gemv.cu") for n in kernel_units.kernel_names(f)])
def test_every_kernel_compiles_for_hopper(filename, name):
    """NVRTC builds each kernel's unit for sm_90 (no GPU needed): the MMA and load forms assemble."""
    code = kernel_units.kernel_source(filename, name)
    image = nvrtc.compile_cubin(code, f"{filename}:{name}", "sm_90", identity=kernel_units.unit_identity(filename, name))
    assert image[:4] == b"\x7fELF"


@gpu
@needs_gpu
@pytest.mark.parametrize("candidate", decode_candidates(), ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M, N, K, ld", [(1, 4096, 4096, 0), (16, 1000, 1032, 8), (3, 37, 8, 0),
                                         (9, 517, 14336, 16), (2, 1, 264, 0), (1, 37, 8, 8), (1, 1001, 14336 + 8, 0),
                                         (1, 3, 2056, 16)])
def test_every_configuration_against_float64(candidate, dtype, M, N, K, ld):
    a, b = _linear(M, N, K, dtype, "cuda", ld=ld, seed=M + N)
    p = GemmParams(a, b, nans((M, N), dtype, "cuda"))
    if isinstance(candidate, CudaGemv) and M != 1:
        assert "M = 1" in candidate.supports(p)
        return
    assert candidate.supports(p) is None
    assert candidate.run(p) is p.out
    check(p.out, a, b)
    fresh = candidate.run(GemmParams(a, b))  # a result it allocates
    assert torch.equal(fresh, p.out)  # one launch, no atomics: the same bits


@gpu
@needs_gpu
@pytest.mark.parametrize("candidate", decode_candidates(), ids=lambda c: c.name)
@pytest.mark.parametrize("layout", ["odd_lda_one_row", "a_rows_broadcast", "w_row_strided"])
def test_views_the_checks_accept(candidate, layout):
    """Views supports() lets through: one row of a wider tensor (its odd stride never used), a's rows one
    row expanded (stride 0), w every other row of a wider tensor at a column offset of 8."""
    bf, K, N = torch.bfloat16, 264, 40
    M = 1 if layout == "odd_lda_one_row" or isinstance(candidate, CudaGemv) else 6
    if layout == "odd_lda_one_row":
        a = randn((1, K + 9), bf, "cuda")[:, :K]
    elif layout == "a_rows_broadcast":
        a = randn((1, K), bf, "cuda").expand(M, K)
    else:
        a = randn((M, K), bf, "cuda")
    w = randn((2 * N, K + 16), bf, "cuda", 1)[::2, 8:8 + K] if layout == "w_row_strided" else randn((N, K), bf, "cuda", 1)
    p = GemmParams(a, w.t(), nans((M, N), bf, "cuda"))
    assert candidate.supports(p) is None
    check(candidate.run(p), a, w.t())


@gpu
@needs_gpu
def test_pointer_checks_refuse_on_the_gpu():
    c, bf = CudaDecode(*CONFIGS[0]), torch.bfloat16
    a, b = _linear(4, 64, 128, bf, "cuda")
    flat = randn(4 * 128 + 8, bf, "cuda")
    assert "16-byte aligned" in c.supports(GemmParams(flat[1:4 * 128 + 1].view(4, 128), b))
    assert "16-byte aligned" in c.supports(GemmParams(randn((4, 130), bf, "cuda")[:, :128], b))
    w = randn((64, 129), bf, "cuda")[:, 1:]
    assert "16-byte aligned" in c.supports(GemmParams(a, w.t()))
    shared = torch.empty(4 * 128 + 4 * 64, dtype=bf, device="cuda")
    a_in = shared[:4 * 128].view(4, 128)
    a_in.copy_(a)
    assert "overlapping no input" in c.supports(GemmParams(a_in, b, shared[64:64 + 4 * 64].view(4, 64)))
    assert "dense row-major" in c.supports(GemmParams(a, b, torch.empty(64, 4, dtype=bf, device="cuda").t()))


@gpu
@needs_gpu
@pytest.mark.parametrize("candidate", [CudaDecode(*CONFIGS[0]), CudaDecode(*CONFIGS[1]), CudaGemv(*GEMV_CONFIGS[0])],
                         ids=lambda c: c.name)
def test_nan_and_inf_land_where_torch_puts_them(candidate):
    M = 1 if isinstance(candidate, CudaGemv) else 5
    a, b = _linear(M, 300, 520, torch.bfloat16, "cuda")
    a[0, 7], a[M - 1, 500] = float("nan"), float("inf")
    b[11, 42] = float("-inf")  # w[42, 11]: reaches column 42 of every row
    p = GemmParams(a, b, nans((M, 300), torch.bfloat16, "cuda"))
    check(candidate.run(p), a, b)
