"""Every Triton GEMM candidate run directly (not only the tuned winner) against a float64 reference:
each of the forty configurations once, then each kernel kind through the epilogue forms (C, bias,
alpha / beta, activations, batches, in place), strided and misaligned views, K = 0, NaN / inf, and
what ``supports`` refuses. Without a GPU the kernels run in Triton's interpreter: small sizes."""

import pytest
import torch

from gemm_checks import ACTS, DTYPES, check, matrix, nans, randn, run_checked, triton_on_cpu
from tunekit.ops.gemm import CONFIGS, AddmmParams, GemmParams, TritonGemm, addmm_op, mm_op
from tunekit.ops.gemm import triton_launch
from tunekit.ops.gemm.torch_candidates import torch_addmm, torch_mm
from tunekit.tunable.config import Config

pytestmark = [pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(),
                                 reason=str(triton_on_cpu())),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy overflow in the interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: one small configuration of each kind, for the many-case tests (the interpreter is slow on big tiles)
SMALL = {kind: TritonGemm(kind, Config(BLOCK_M=bm, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=1, num_warps=4,
                                       num_stages=2))
         for kind, bm in (("matmul", 16), ("skinny", 4), ("tma", 16), ("padded", 16))}
SPLIT = TritonGemm("matmul", Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, SPLIT_K=3, num_warps=4,
                                    num_stages=2))


# -- every configuration -------------------------------------------------------------------------
@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[TritonGemm(*c).name for c in CONFIGS])
def test_every_configuration(index):
    """Each configuration once, NaN-filled out, a dtype per configuration in turn: odd M, N, K for the
    pointer kernels; 16-byte aligned rows (TMA) or unaligned ones (padded copies) for the TMA kinds."""
    kind, config, large = CONFIGS[index]
    c = TritonGemm(kind, config, large)
    M, N, K = (19, 40, 72) if kind == "tma" else (21, 37, 70)

    def params(dtype):
        a = matrix(M, K, dtype, DEVICE, seed=index)
        b = matrix(K, N, dtype, DEVICE, layout="col" if index % 2 else "row", seed=index + 1)
        return GemmParams(a, b, nans((M, N), dtype, DEVICE))
    p = params(DTYPES[index % 3])
    why = c.cannot_run(p)
    if why is not None and "shared memory" in why and p.a.dtype is torch.float32:
        p = params(torch.bfloat16)  # a GPU: float32 doubles the tiles' shared memory
        why = c.cannot_run(p)
    if why is not None and "shared memory" in why:  # refused on this GPU (256x128x64, 4 stages on an H100)
        pytest.skip(why)
    check(run_checked(c, p), p.a, p.b)


def test_every_candidate_of_both_ops_is_listed():
    from tunekit.ops.gemm.cuda_decode import decode_candidates
    from tunekit.ops.gemm.quack_candidates import quack_candidates
    from tunekit.ops.gemm.triton_padded_rows import padded_rows_candidates
    from tunekit.ops.gemm.triton_swapped import swapped_candidates
    from tunekit.ops.gemm.triton_wrapped import wrapped_candidates
    names = {TritonGemm(*c).name for c in CONFIGS}
    assert len(names) == len(CONFIGS) >= 40
    names |= {c.name for c in wrapped_candidates()} | {c.name for c in quack_candidates()}
    names |= {c.name for c in padded_rows_candidates()}
    cublaslt = {f"cublaslt_h{rank}" for rank in range(8)}
    epilogue = {f"cublaslt_bias_h{rank}" for rank in range(8)}
    decode = {c.name for c in decode_candidates()} | {c.name for c in swapped_candidates()}  # mm's alone
    for op, torch_own in ((mm_op, {"torch_mm"} | cublaslt | decode),
                          (addmm_op, {"torch_addmm", "torch_addmm_epilogue"} | epilogue)):
        assert op.default is op.candidates[0] and op.default.name in torch_own
        assert {c.name for c in op.candidates} == names | torch_own
    assert mm_op.candidate(TritonGemm(*CONFIGS[0]).name) is not addmm_op.candidate(TritonGemm(*CONFIGS[0]).name)  # each op its own


# -- epilogues ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(SMALL))
@pytest.mark.parametrize("act", list(ACTS))
def test_epilogue_with_c(kind, act):
    """ACT(alpha * A @ B + beta * C), bf16, C a full matrix."""
    M, N, K = 13, 24, 40
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, "col", seed=1)
    c = randn((M, N), torch.bfloat16, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=0.75, beta=-1.5, out=nans((M, N), torch.bfloat16, DEVICE), activation=act)
    check(run_checked(SMALL[kind], p), a, b, c, 0.75, -1.5, act)


@pytest.mark.parametrize("kind", list(SMALL))
@pytest.mark.parametrize("shape", [(24,), (1, 24), (13, 1), (), (1,)], ids=str)
def test_broadcast_c_and_bias(kind, shape):
    """addmm's input broadcast from a row (linear's bias: the bias path when beta == 1), a column, a scalar."""
    M, N, K = 13, 24, 32
    a, b = matrix(M, K, torch.float16, DEVICE), matrix(K, N, torch.float16, DEVICE, "col", seed=1)
    c = randn(shape, torch.float16, DEVICE, seed=3)
    for beta in (1, 2.5):
        p = AddmmParams(c, a, b, beta=beta, out=nans((M, N), torch.float16, DEVICE), activation="silu")
        check(run_checked(SMALL[kind], p), a, b, c, 1.0, beta, "silu")


@pytest.mark.parametrize("kind", list(SMALL))
def test_batched(kind):
    """bmm / baddbmm: a batch of 3, C per entry, B broadcast over the batch (the padded kind copies
    it; the tma kind cannot read a stride-0 batch)."""
    batch, M, N, K = 3, 11, 16, 24
    a = matrix(M, K, torch.float32, DEVICE, batch=batch)
    b = matrix(K, N, torch.float32, DEVICE, "row", seed=1, batch=batch)
    c = randn((batch, M, N), torch.float32, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=0.5, beta=2, out=nans((batch, M, N), torch.float32, DEVICE))
    check(run_checked(SMALL[kind], p), a, b, c, 0.5, 2.0)
    wb = matrix(K, N, torch.float32, DEVICE, "bcast", seed=4, batch=batch)
    p = GemmParams(a, wb, nans((batch, M, N), torch.float32, DEVICE), activation="relu")
    if kind == "tma":
        assert "cannot read" in SMALL[kind].cannot_run(p)
        return
    check(run_checked(SMALL[kind], p), a, wb, act="relu")


@pytest.mark.parametrize("kind", ["matmul", "skinny", "padded"])
def test_in_place(kind):
    """addmm_: out is C; every element read then written by the same program."""
    M, N, K = 9, 20, 33
    a, b = matrix(M, K, torch.float32, DEVICE), matrix(K, N, torch.float32, DEVICE, seed=1)
    c = randn((M, N), torch.float32, DEVICE, seed=2)
    before = c.clone()
    p = AddmmParams(c, a, b, alpha=2, beta=0.5, out=c)
    assert run_checked(SMALL[kind], p) is c
    check(c, a, b, before, 2.0, 0.5)


def test_split_k_epilogue_and_in_place():
    M, N, K = 10, 20, 100
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, "col", seed=1)
    c = randn((M, N), torch.bfloat16, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=1.5, beta=0.25, out=nans((M, N), torch.bfloat16, DEVICE), activation="gelu_tanh")
    check(run_checked(SPLIT, p), a, b, c, 1.5, 0.25, "gelu_tanh")
    before = c.clone()
    assert run_checked(SPLIT, AddmmParams(c, a, b, out=c)) is c
    check(c, a, b, before)


# -- layouts ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_layout", ["row", "col", "sliced", "misaligned", "ld"])
@pytest.mark.parametrize("b_layout", ["row", "col", "sliced", "misaligned"])
def test_strided_and_misaligned_views(a_layout, b_layout):
    """Transposed, strided, offset and padded views: no copies in the pointer kernel; the padded kind
    copies what TMA cannot read; the tma kind takes what it can."""
    M, N, K = 17, 24, 40
    a = matrix(M, K, torch.float16, DEVICE, a_layout)
    b = matrix(K, N, torch.float16, DEVICE, b_layout, seed=1)
    for kind in ("matmul", "padded", "tma"):
        p = GemmParams(a, b, nans((M, N), torch.float16, DEVICE))
        if kind == "tma" and not (triton_launch.tma_readable(a) and triton_launch.tma_readable(b)):
            assert SMALL[kind].cannot_run(p)
            continue
        check(run_checked(SMALL[kind], p), a, b)


def test_transposed_and_strided_out():
    M, N, K = 15, 24, 32
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, seed=1)
    for out in (nans((N, M), torch.bfloat16, DEVICE).t(), nans((M, 2 * N), torch.bfloat16, DEVICE)[:, ::2],
                nans((M * N + 1,), torch.bfloat16, DEVICE)[1:].view(M, N)):
        for kind in ("matmul", "tma", "padded"):
            out.fill_(float("nan"))
            check(run_checked(SMALL[kind], GemmParams(a, b, out)), a, b)


def test_new_output_is_contiguous():
    a, b = matrix(7, 16, torch.float32, DEVICE), matrix(16, 12, torch.float32, DEVICE, seed=1)
    for kind in SMALL:
        y = run_checked(SMALL[kind], GemmParams(a, b))
        assert y.shape == (7, 12) and y.is_contiguous()
        check(y, a, b)


# -- edge values and sizes --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["matmul", "skinny"])
def test_k_zero(kind):
    """K == 0: ACT(beta * C), zeros without C (torch's empty-sum semantics)."""
    M, N = 5, 19
    a, b = matrix(M, 0, torch.float32, DEVICE), matrix(0, N, torch.float32, DEVICE)
    c = randn((M, N), torch.float32, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=3, beta=0.5, out=nans((M, N), torch.float32, DEVICE), activation="silu")
    torch.testing.assert_close(run_checked(SMALL[kind], p), torch_addmm(p.replace(out=None)))
    assert (run_checked(SMALL[kind], GemmParams(a, b, nans((M, N), torch.float32, DEVICE))) == 0).all()


def test_empty_results_are_left_to_the_default():
    a, b = matrix(0, 8, torch.float32, DEVICE), matrix(8, 4, torch.float32, DEVICE)
    assert "empty" in SMALL["matmul"].cannot_run(GemmParams(a, b))
    assert torch_mm(GemmParams(a, b)).shape == (0, 4)


@pytest.mark.parametrize("kind", ["matmul", "tma"])
def test_nan_and_inf_propagate_like_torch(kind):
    M, N, K = 8, 16, 32
    a, b = matrix(M, K, torch.float32, DEVICE), matrix(K, N, torch.float32, DEVICE, seed=1)
    a[0, 3], a[2, 5], b[7, 4] = float("nan"), float("inf"), -float("inf")
    c = randn((M, N), torch.float32, DEVICE, seed=2)
    c[5, 6] = float("inf")
    p = AddmmParams(c, a, b, out=nans((M, N), torch.float32, DEVICE), activation="relu")
    got = run_checked(SMALL[kind], p)
    expected = torch_addmm(p.replace(out=None))
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.isinf(), expected.isinf()) and torch.equal(got[got.isinf()], expected[expected.isinf()])
    check(got, a, b, c, act="relu")


def test_beta_zero_does_not_read_c():
    """torch.addmm's rule: with beta == 0, NaN and inf in C do not reach the result."""
    M, N, K = 9, 16, 24
    a, b = matrix(M, K, torch.float16, DEVICE), matrix(K, N, torch.float16, DEVICE, seed=1)
    c = nans((M, N), torch.float16, DEVICE)
    for kind in SMALL:
        got = run_checked(SMALL[kind], AddmmParams(c, a, b, beta=0, out=nans((M, N), torch.float16, DEVICE)))
        assert got.isfinite().all()
        check(got, a, b)


# -- what supports() refuses ------------------------------------------------------------------------
def test_refusals():
    a, b = matrix(8, 16, torch.float32, DEVICE), matrix(16, 8, torch.float32, DEVICE)
    c = randn((8, 8), torch.float32, DEVICE)
    mm = SMALL["matmul"]
    assert "one dtype" in mm.cannot_run(GemmParams(a, b.half()))
    assert "float32, float16 or bfloat16" in mm.cannot_run(GemmParams(a.double(), b.double()))
    assert "alpha == 0" in mm.cannot_run(AddmmParams(c, a, b, alpha=0))
    assert "overlaps" in mm.cannot_run(GemmParams(a, b, randn(8, torch.float32, DEVICE).expand(8, 8)))
    square = randn((8, 8), torch.float32, DEVICE)
    assert "overlaps" in mm.cannot_run(GemmParams(square, square.clone(), square))
    assert SPLIT.cannot_run(GemmParams(a, b, deterministic=False)) is None
    assert "deterministic" in SPLIT.cannot_run(GemmParams(a, b, deterministic=True))
    assert mm.cannot_run(GemmParams(a, b, deterministic=True)) is None


def test_deterministic_mode_is_read_when_params_are_made():
    a, b = matrix(8, 16, torch.float32, DEVICE), matrix(16, 8, torch.float32, DEVICE)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        p = GemmParams(a, b)
    finally:
        torch.use_deterministic_algorithms(before)
    assert p.deterministic and "deterministic" in SPLIT.cannot_run(p)


def test_not_worth_rules():
    """Cheap pruning: decode configurations for M <= 16 only (and only they there), the skinny kernel
    against a K-contiguous weight, tiles far larger than the problem, split-K only for few tiles."""
    by_name = {c.name: c for c in mm_op.candidates[1:] if isinstance(c, TritonGemm)}
    decode = next(c for c in by_name.values() if c.kind == "matmul" and c.config.BLOCK_M == 16)
    skinny = next(c for c in by_name.values() if c.kind == "skinny" and c.config.BLOCK_M == 1)
    big = next(c for c in by_name.values() if c.kind == "matmul" and c.config.BLOCK_M == 128 and c.config.SPLIT_K == 1)
    x, w = matrix(1, 512, torch.bfloat16, DEVICE), matrix(256, 512, torch.bfloat16, DEVICE)
    p = GemmParams(x, w.t())
    assert decode.not_worth(p) is None or "split-K" in decode.not_worth(p)
    assert skinny.not_worth(p) is None
    assert "decode configurations only" in big.not_worth(p)
    assert "K-contiguous" in skinny.not_worth(GemmParams(x, w.t().contiguous()))
    p = GemmParams(matrix(300, 512, torch.bfloat16, DEVICE), w.t())
    assert "M <= 16 only" in decode.not_worth(p)
    assert "twice the problem" in big.not_worth(GemmParams(matrix(40, 64, torch.bfloat16, DEVICE),
                                                           matrix(64, 20, torch.bfloat16, DEVICE)))
    split = next(c for c in by_name.values() if c.config.SPLIT_K > 1 and c.config.BLOCK_M == 64)
    assert "split-K" in split.not_worth(GemmParams(matrix(64, 64, torch.bfloat16, DEVICE),
                                                   matrix(64, 64, torch.bfloat16, DEVICE)))


def test_tma_readable_and_aligned_copy():
    x = torch.empty(64, 48, dtype=torch.float16)
    assert triton_launch.tma_readable(x) and triton_launch.tma_readable(x.t())
    assert not triton_launch.tma_readable(torch.empty(64, 45, dtype=torch.float16))  # 90-byte rows
    assert not triton_launch.tma_readable(x[:, ::2])
    assert not triton_launch.tma_readable(torch.empty(64, 49, dtype=torch.float16)[:, 1:])
    assert not triton_launch.tma_readable(torch.empty(1, 64, 48, dtype=torch.float16).expand(3, 64, 48))
    for t in (randn((7, 45), torch.bfloat16), randn((45, 7), torch.bfloat16).t(), randn((3, 5, 9), torch.float16),
              randn((13, 2 * 9), torch.float32)[:, ::2]):
        copy = triton_launch.aligned_copy(t)
        assert triton_launch.tma_readable(copy) and torch.equal(copy, t)
    col = triton_launch.aligned_copy(randn((45, 7), torch.bfloat16).t())
    assert col.stride(-2) == 1  # a column-major operand stays column-major


def test_input_precision_follows_tf32():
    a, b = matrix(4, 16, torch.float32, DEVICE), matrix(16, 4, torch.float32, DEVICE)
    assert triton_launch._precision(GemmParams(a, b, tf32=True)) == "tf32"
    assert triton_launch._precision(GemmParams(a, b, tf32=False)) == "ieee"
    assert triton_launch._precision(GemmParams(a.half(), b.half(), tf32=True)) == "ieee"


def test_source_hash_depends_on_the_configuration():
    c1, c2 = (TritonGemm(*CONFIGS[0]), TritonGemm(*CONFIGS[1]))
    assert c1.source_hash() != c2.source_hash() and c1.source_hash() == TritonGemm(*CONFIGS[0]).source_hash()


def test_the_challenger_floor_holds_where_the_default_is_routed_and_for_triton_launches():
    """ops/gemm/op.py challenger_floor: a linear (routed to torch's function once decided) needs every
    challenger to save CHALLENGER_HOST_MS; a fused linear (never routed) only its Triton candidates."""
    from tunekit.ops.gemm.op import CHALLENGER_HOST_MS, challenger_floor
    from tunekit.tunable.margin_rule import floor_ms
    a, b = matrix(8, 16, torch.bfloat16), matrix(16, 4, torch.bfloat16, "cpu", "col", seed=1)
    c = randn((4,), torch.bfloat16)
    triton = next(x for x in addmm_op.candidates if isinstance(x, TritonGemm))
    for name in ("torch_addmm_epilogue", "cublaslt_bias_h0"):
        assert challenger_floor(AddmmParams(c, a, b), addmm_op.candidate(name)) == CHALLENGER_HOST_MS
        assert challenger_floor(AddmmParams(c, a, b, activation="gelu_tanh"), addmm_op.candidate(name)) == 0.0
    assert challenger_floor(AddmmParams(c, a, b, activation="gelu_tanh"), triton) == CHALLENGER_HOST_MS
    assert challenger_floor(GemmParams(a, b), mm_op.candidate("cublaslt_h0")) == CHALLENGER_HOST_MS
    assert floor_ms(addmm_op, AddmmParams(c, a, b, activation="relu"), addmm_op.candidate("cublaslt_bias_h1")) == 0.0
    assert floor_ms(mm_op, GemmParams(a, b), mm_op.candidate("cublaslt_h1")) == CHALLENGER_HOST_MS


def test_a_triton_challenger_whose_calls_are_planned_needs_no_floor_beyond_the_margin(monkeypatch):
    """ops/gemm/op.py PLANNED_HOST_MS: a routable call (no out=, alpha = beta = the int 1) decided for a Triton
    kind launch_plans replays costs the host less than torch's; padded copies, out=, scaled calls (and alpha
    = 1.0, which the routes do not take) do not replay, nor any call where plans are not possible."""
    from tunekit.ops.gemm import op
    from tunekit.ops.gemm.op import CHALLENGER_HOST_MS, PLANNED_HOST_MS, challenger_floor
    assert PLANNED_HOST_MS == 0.0
    monkeypatch.setattr(op, "plans_possible", lambda candidate=None: True)  # here: no driver, so no kept launches
    a, b = matrix(8, 16, torch.bfloat16), matrix(16, 4, torch.bfloat16, "cpu", "col", seed=1)
    c = randn((4,), torch.bfloat16)
    by_kind = {}
    for x in mm_op.candidates:
        if isinstance(x, TritonGemm):
            by_kind.setdefault(x.kind, x)
    for kind in ("matmul", "skinny", "tma"):
        assert challenger_floor(GemmParams(a, b), by_kind[kind]) == PLANNED_HOST_MS
        assert challenger_floor(AddmmParams(c, a, b), addmm_op.candidate(by_kind[kind].name)) == PLANNED_HOST_MS
        assert challenger_floor(GemmParams(a, b, out=torch.empty(8, 4, dtype=torch.bfloat16)), by_kind[kind]) == \
            CHALLENGER_HOST_MS
        assert challenger_floor(AddmmParams(c, a, b, alpha=2.0), addmm_op.candidate(by_kind[kind].name)) == \
            CHALLENGER_HOST_MS
    assert challenger_floor(GemmParams(a, b), by_kind["padded"]) == CHALLENGER_HOST_MS
    assert challenger_floor(AddmmParams(c, a, b, alpha=1.0), addmm_op.candidate(by_kind["tma"].name)) == CHALLENGER_HOST_MS
    monkeypatch.setattr(op, "plans_possible", lambda candidate=None: False)
    assert challenger_floor(GemmParams(a, b), by_kind["matmul"]) == CHALLENGER_HOST_MS
