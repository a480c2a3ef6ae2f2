"""The wrapped GEMM candidates (Inductor's mm template, ``ops/gemm/triton_wrapped.py``) run directly against
a float64 reference: every configuration of both kinds on odd sizes, the epilogue forms (C, bias,
alpha / beta, activations), strided, transposed and misaligned views and outputs, K = 0, NaN / inf,
and what they refuse. Without a GPU the kernels run in Triton's interpreter: small sizes."""

import pytest
import torch

from gemm_checks import ACTS, DTYPES, check, matrix, nans, randn, run_checked, triton_on_cpu
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op
from tunekit.ops.gemm.torch_candidates import torch_addmm
from tunekit.ops.gemm.triton_wrapped import WRAPPED_CONFIGS, WRAPPED_KINDS, TritonWrapped, wrapped_candidates
from tunekit.tunable.config import Config

pytestmark = [pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(),
                                 reason=str(triton_on_cpu())),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy overflow in the interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = {kind: TritonWrapped(kind, Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=1, num_warps=4,
                                          num_stages=2)) for kind in WRAPPED_KINDS}


@pytest.mark.parametrize("index", range(2 * len(WRAPPED_CONFIGS)), ids=[c.name for c in wrapped_candidates()])
def test_every_configuration(index):
    """Each configuration of each kind once, on odd M, N, K (rows and columns past them wrap), a dtype in turn."""
    candidate = wrapped_candidates()[index]
    dtype = DTYPES[index % 3]
    M, N, K = 21, 37, 70
    a = matrix(M, K, dtype, DEVICE, seed=index)
    b = matrix(K, N, dtype, DEVICE, layout="col" if index % 2 else "row", seed=index + 1)
    p = GemmParams(a, b, nans((M, N), dtype, DEVICE))
    why = candidate.cannot_run(p)
    if why is not None and "shared memory" in why:
        pytest.skip(why)
    check(run_checked(candidate, p), a, b)


def test_both_ops_list_every_wrapped_candidate_and_plans_hold_them():
    from tunekit.ops.gemm import launch_plans
    names = {c.name for c in wrapped_candidates()}
    assert len(names) == 2 * len(WRAPPED_CONFIGS)
    for op in (mm_op, addmm_op):
        assert names <= {c.name for c in op.candidates}
    assert all(launch_plans.plannable(c) for c in wrapped_candidates())


@pytest.mark.parametrize("kind", WRAPPED_KINDS)
@pytest.mark.parametrize("act", list(ACTS))
def test_epilogue_with_c(kind, act):
    M, N, K = 13, 24, 40
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, "col", seed=1)
    c = randn((M, N), torch.bfloat16, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=0.75, beta=-1.5, out=nans((M, N), torch.bfloat16, DEVICE), activation=act)
    check(run_checked(SMALL[kind], p), a, b, c, 0.75, -1.5, act)


@pytest.mark.parametrize("kind", WRAPPED_KINDS)
@pytest.mark.parametrize("shape", [(24,), (1, 24), (13, 1), ()], ids=str)
def test_broadcast_c_and_bias(kind, shape):
    M, N, K = 13, 24, 32
    a, b = matrix(M, K, torch.float16, DEVICE), matrix(K, N, torch.float16, DEVICE, "col", seed=1)
    c = randn(shape, torch.float16, DEVICE, seed=3)
    for beta in (1, 2.5):
        p = AddmmParams(c, a, b, beta=beta, out=nans((M, N), torch.float16, DEVICE), activation="silu")
        check(run_checked(SMALL[kind], p), a, b, c, 1.0, beta, "silu")


@pytest.mark.parametrize("a_layout, b_layout", [("sliced", "col"), ("misaligned", "ld"), ("col", "sliced")])
def test_strided_misaligned_views_and_outputs(a_layout, b_layout):
    M, N, K = 17, 24, 40
    a = matrix(M, K, torch.float16, DEVICE, a_layout)
    b = matrix(K, N, torch.float16, DEVICE, b_layout, seed=1)
    for kind in WRAPPED_KINDS:
        for out in (nans((M, N), torch.float16, DEVICE), nans((N, M), torch.float16, DEVICE).t(),
                    nans((M * N + 1,), torch.float16, DEVICE)[1:].view(M, N)):
            check(run_checked(SMALL[kind], GemmParams(a, b, out)), a, b)
    y = run_checked(SMALL["wrapped"], GemmParams(a, b))
    assert y.shape == (M, N) and y.is_contiguous()


@pytest.mark.parametrize("kind", WRAPPED_KINDS)
def test_k_zero_and_nan_inf_like_torch(kind):
    M, N = 5, 19
    a0, b0 = matrix(M, 0, torch.float32, DEVICE), matrix(0, N, torch.float32, DEVICE)
    c = randn((M, N), torch.float32, DEVICE, seed=2)
    p = AddmmParams(c, a0, b0, alpha=3, beta=0.5, out=nans((M, N), torch.float32, DEVICE), activation="silu")
    torch.testing.assert_close(run_checked(SMALL[kind], p), torch_addmm(p.replace(out=None)))
    a, b = matrix(M, 32, torch.float32, DEVICE), matrix(32, N, torch.float32, DEVICE, seed=1)
    a[0, 3], a[2, 5], b[7, 4] = float("nan"), float("inf"), -float("inf")
    c[4, 6] = float("inf")
    p = AddmmParams(c, a, b, out=nans((M, N), torch.float32, DEVICE), activation="relu")
    got, expected = run_checked(SMALL[kind], p), torch_addmm(p.replace(out=None))
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    check(got, a, b, c, act="relu")


def test_refusals_and_where_they_are_worth_trying(monkeypatch):
    from tunekit.ops.gemm import triton_wrapped
    w = SMALL["wrapped"]
    a, b = matrix(21, 16, torch.float32, DEVICE), matrix(16, 24, torch.float32, DEVICE, seed=1)
    assert w.cannot_run(GemmParams(a, b)) is None and w.not_worth(GemmParams(a, b)) is None
    batched = GemmParams(matrix(21, 16, torch.float32, DEVICE, batch=2), matrix(16, 24, torch.float32, DEVICE, batch=2))
    assert "batch of one" in w.cannot_run(batched)
    assert triton_wrapped._reach(torch.empty(3, 5, device="meta").t()) == 15
    assert triton_wrapped._reach(torch.empty(2 ** 16, 2 ** 15 + 8, device="meta")[:, :16]) == (2 ** 16 - 1) * (2 ** 15 + 8) + 16
    monkeypatch.setattr(triton_wrapped, "_INT32", 21 * 16)  # a's last offset + 1: int32 would overflow there
    assert "int32" in w.cannot_run(GemmParams(a, b))
    monkeypatch.setattr(triton_wrapped, "_INT32", 21 * 24)  # the output it would allocate (21 x 24) reaches it
    a_small, b_small = matrix(21, 2, torch.float32, DEVICE), matrix(2, 24, torch.float32, DEVICE, seed=1)
    assert "int32" in w.cannot_run(GemmParams(a_small, b_small))
    assert "int32" in w.cannot_run(GemmParams(a_small, b_small, nans((21, 24), torch.float32, DEVICE)))  # one given
    monkeypatch.undo()
    decode = GemmParams(matrix(16, 16, torch.float32, DEVICE), b)
    assert "M > 16" in w.not_worth(decode)
    large = GemmParams(torch.empty(1024, 1024, device="meta"), torch.empty(1024, 1024, device="meta"))
    assert "small problems" in w.not_worth(large)
    odd = GemmParams(torch.empty(777, 333, device="meta"), torch.empty(333, 1555, device="meta"))
    assert w.not_worth(odd) is None  # issue 23's small odd shape (2^28.6)
    with pytest.raises(ValueError, match="unknown wrapped"):
        TritonWrapped("matmul", SMALL["wrapped"].config)


def test_online_tuning_compiles_the_template_before_padded_copies_on_small_odd_problems():
    """ops/gemm/op.py triton_order: where both are worth trying (777 x 1555 x 333 as F.linear: no operand TMA
    reads), the first ONLINE_PREPARATIONS Triton candidates worth trying are the static template's."""
    from tunekit.ops.gemm.op import ONLINE_PREPARATIONS, triton_order
    order = [c.kind for c in triton_order()]
    assert order.index("wrapped_static") > max(i for i, k in enumerate(order) if k == "tma")
    assert max(i for i, k in enumerate(order) if k == "wrapped") < order.index("padded")
    assert [c.name for c in mm_op.candidates if hasattr(c, "kind")] == [c.name for c in triton_order(turned=True)]
    x, w = torch.empty(777, 333, device="meta"), torch.empty(1555, 333, device="meta")
    p = GemmParams(x, w.t())
    worth = [c for c in triton_order() if c.not_worth(p) is None and (c.kind != "tma")]  # tma: rows of 666 bytes
    assert [c.kind for c in worth[:ONLINE_PREPARATIONS]] == ["wrapped_static"] * ONLINE_PREPARATIONS
    assert worth[0].name == "triton_wrapped_static_m64_n128_k32_g8_sk1_w8_s4"
