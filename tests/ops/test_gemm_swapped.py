"""The turned-over decode GEMM candidates (``ops/gemm/triton_swapped.py``) run directly against a float64
reference: every configuration once, decode shapes with activations, NaN / inf placed as torch places them,
strided, transposed and misaligned operands and outputs, float32 with TF32 as torch allows it, and what they
refuse or skip; where mm lists them (right after the TMA kind, so online tuning of a decode signature compiles
them after the CUDA decode kernels) and that their kind is plannable (``test_gemm_launch_plans.py`` replays
planned calls on the GPU). Without a GPU the kernels run in Triton's interpreter: small sizes."""

import pytest
import torch

from gemm_checks import DTYPES, check, matrix, nans, run_checked, triton_on_cpu
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, launch_plans, mm_op
from tunekit.ops.gemm.torch_candidates import torch_mm
from tunekit.ops.gemm.triton_swapped import SWAPPED_CONFIGS, TritonSwapped, swapped_candidates
from tunekit.tunable.config import Config

pytestmark = [pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(),
                                 reason=str(triton_on_cpu())),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy overflow in the interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = TritonSwapped(Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=2))


@pytest.mark.parametrize("index", range(len(SWAPPED_CONFIGS)), ids=[c.name for c in swapped_candidates()])
def test_every_configuration(index):
    """Each configuration once: a decode product in linear's layout (b = w.t()), odd N and K, a dtype in turn."""
    candidate = swapped_candidates()[index]
    dtype = DTYPES[index % 3]
    M, N, K = 5, 37, 70
    p = _linear(M, N, K, dtype, index)
    if dtype is torch.float32 and candidate.cannot_run(p) is not None:  # a GPU: float32 doubles the stages' bytes
        assert "shared memory" in candidate.cannot_run(p)
        p = _linear(M, N, K, torch.bfloat16, index)
    assert candidate.not_worth(p) is None
    check(run_checked(candidate, p), p.a, p.b)


def _linear(M, N, K, dtype, seed) -> GemmParams:
    a, w = matrix(M, K, dtype, DEVICE, seed=seed), matrix(N, K, dtype, DEVICE, seed=seed + 1)
    return GemmParams(a, w.t(), nans((M, N), dtype, DEVICE))


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("act", ["none", "gelu_tanh"])
def test_decode_products_with_an_activation_and_nan_inf(M, act):
    N, K = 40, 72
    a, w = matrix(M, K, torch.bfloat16, DEVICE, seed=M), matrix(N, K, torch.bfloat16, DEVICE, seed=M + 1)
    p = GemmParams(a, w.t(), nans((M, N), torch.bfloat16, DEVICE), activation=act)
    check(run_checked(SMALL, p), a, w.t(), act=act)
    a[0, 3], w[7, 9], w[11, 2] = float("nan"), float("inf"), -float("inf")
    got = run_checked(SMALL, p)
    expected = torch_mm(p.replace(out=None))
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    assert torch.equal(got[got.isinf()], expected[expected.isinf()])


@pytest.mark.parametrize("a_layout", ["row", "col", "sliced", "misaligned", "ld"])
@pytest.mark.parametrize("b_layout", ["row", "col", "sliced", "misaligned"])
def test_strided_and_misaligned_views(a_layout, b_layout):
    M, N, K = 9, 24, 40
    a = matrix(M, K, torch.float16, DEVICE, a_layout)
    b = matrix(K, N, torch.float16, DEVICE, b_layout, seed=1)
    check(run_checked(SMALL, GemmParams(a, b, nans((M, N), torch.float16, DEVICE))), a, b)


@pytest.mark.parametrize("tf32", [False, True])
def test_float32_as_torch_allows_tf32(tf32):
    """TF32 (``p.tf32``, from torch's matmul precision setting) reaches the turned-over launch; the bound is TF32's."""
    M, N, K = 7, 48, 136
    a, w = matrix(M, K, torch.float32, DEVICE, seed=3), matrix(N, K, torch.float32, DEVICE, seed=4)
    candidate = swapped_candidates()[1]  # 4 stages: float32 fits in shared memory on the GPU
    p = GemmParams(a, w.t(), nans((M, N), torch.float32, DEVICE), tf32=tf32)
    check(run_checked(candidate, p), a, w.t(), tf32=tf32)


def test_transposed_strided_and_new_outputs():
    M, N, K = 15, 24, 32
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, seed=1)
    for out in (nans((N, M), torch.bfloat16, DEVICE).t(), nans((M, 2 * N), torch.bfloat16, DEVICE)[:, ::2],
                nans((M * N + 1,), torch.bfloat16, DEVICE)[1:].view(M, N)):
        check(run_checked(SMALL, GemmParams(a, b, out)), a, b)
    y = run_checked(SMALL, GemmParams(a, b))
    assert y.shape == (M, N) and y.is_contiguous()
    check(y, a, b)


def test_what_it_refuses_and_where_it_is_worth_trying():
    K, N = 32, 24
    a, w = matrix(16, K, torch.float32, DEVICE), matrix(N, K, torch.float32, DEVICE, seed=1)
    assert SMALL.not_worth(GemmParams(a, w.t())) is None
    assert "M <= 16 only" in SMALL.not_worth(GemmParams(matrix(17, K, torch.float32, DEVICE), w.t()))
    assert "2-D mm only" in SMALL.cannot_run(AddmmParams(torch.randn(N, device=DEVICE), a, w.t()))
    assert "2-D mm only" in SMALL.cannot_run(GemmParams(a[None].expand(2, 16, K), w.t()[None].expand(2, K, N)))
    assert "empty" in SMALL.cannot_run(GemmParams(matrix(0, K, torch.float32, DEVICE), w.t()))
    assert "one dtype" in SMALL.cannot_run(GemmParams(a, w.t().half()))


def test_mm_lists_them_after_the_tma_kind_and_addmm_not_at_all():
    kinds = [c.kind for c in mm_op.candidates if hasattr(c, "kind")]
    first = kinds.index("swapped")
    assert kinds[first:first + len(SWAPPED_CONFIGS)] == ["swapped"] * len(SWAPPED_CONFIGS)
    assert set(kinds[:first]) == {"tma"}
    assert not any(isinstance(c, TritonSwapped) for c in addmm_op.candidates)
    assert all(launch_plans.plannable(c) for c in swapped_candidates())
    assert TritonSwapped(SMALL.config).source_hash() == SMALL.source_hash() != swapped_candidates()[0].source_hash()
