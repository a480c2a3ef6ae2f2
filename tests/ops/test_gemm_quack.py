"""quack's Hopper kernels as mm and addmm candidates (ops/gemm/quack_candidates.py, backends/quack.py):
what supports refuses and why (on the CPU, before any CUDA call), a missing quack-kernels, a plan under
kept-builds-only preparation, their place after the Triton candidates; on an H100 / H200 with
quack-kernels installed, each configuration run directly against a float64 reference (mm and linear's
addmm, every activation, row- and column-major operands, float16 and bfloat16, NaN-filled out, a new
result), a plan made by ``prepare`` and reused, NaN / inf, and a CUDA graph of calls with different
biases."""

import pytest
import torch

from gemm_checks import bound, check, check_graph_of_two_calls, matrix, nans, randn, within
from tunekit.backends import quack
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op
from tunekit.ops.gemm.quack_candidates import CONFIGS, MIN_MN, QuackGemm, _bias_problem, _operand_problem
from tunekit.tunable.preparations import NeedsCompiler, builds_only

NAMES = [QuackGemm(c).name for c in CONFIGS]


def _linear(M, N, K, dtype, device, act="none", bias=True, b_layout="col", out=True, seed=0, a_layout="row"):
    a = matrix(M, K, dtype, device, a_layout, seed=seed)
    b = matrix(K, N, dtype, device, b_layout, seed=seed + 1)  # "col": weight.t()
    o = nans((M, N), dtype, device) if out else None
    if not bias:
        return GemmParams(a, b, o, activation=act)
    return AddmmParams(randn((N,), dtype, device, seed=seed + 2), a, b, out=o, activation=act)


def test_every_configuration_is_a_candidate_of_both_ops_after_the_triton_ones():
    assert len(set(NAMES)) == len(CONFIGS)
    for op in (mm_op, addmm_op):
        names = [c.name for c in op.candidates]
        assert names[-len(NAMES):] == NAMES  # online tuning's cap of compiles is spent on Triton first
        assert all(callable(getattr(op.candidate(n), "prepare", None)) for n in NAMES)
    assert mm_op.candidate(NAMES[0]) is not addmm_op.candidate(NAMES[0])
    assert len({QuackGemm(c).source_hash() for c in CONFIGS}) == len(CONFIGS)


def test_cpu_tensors_and_unknown_activations_are_declined():
    c = QuackGemm(CONFIGS[0])
    assert c.supports(_linear(1024, 1024, 64, torch.bfloat16, "cpu")) == "CUDA only"
    assert "activation" in c.supports(_linear(1024, 1024, 64, torch.bfloat16, "cpu", act="gelu"))  # erf: not quack's


def test_other_scalars_in_the_same_cache_key_get_torchs_addmm():
    """A choice made for linear's form (alpha = beta = 1) met by other scalars of the same cache key."""
    p = _linear(1024, 1024, 64, torch.float32, "cpu")
    q = AddmmParams(p.c, p.a, p.b, alpha=0.5, beta=2.0)
    check(QuackGemm(CONFIGS[0]).run(q), q.a, q.b, q.c, alpha=0.5, beta=2.0)


def test_what_is_refused_before_any_cuda_call():
    bf = torch.bfloat16
    assert _operand_problem(_linear(1024, 1024, 64, bf, "cpu")) is None
    assert _bias_problem(_linear(1024, 1024, 64, bf, "cpu")) is None
    assert "float16 / bfloat16" in _operand_problem(_linear(1024, 1024, 64, torch.float32, "cpu"))
    assert "multiples of 8" in _operand_problem(_linear(1024, 1024, 60, bf, "cpu"))
    assert "multiples of 8" in _operand_problem(_linear(1024, 1020, 64, bf, "cpu"))
    assert f"{MIN_MN} or more" in _operand_problem(_linear(512, 1024, 64, bf, "cpu"))
    assert "dense" in _operand_problem(_linear(1024, 1024, 64, bf, "cpu", b_layout="ld"))
    assert "dense" in _operand_problem(_linear(1024, 1024, 64, bf, "cpu", b_layout="misaligned"))
    p = _linear(1024, 1024, 64, bf, "cpu")
    p.out = nans((1024, 1024), bf, "cpu").t()
    assert "out:" in _operand_problem(p)
    p = _linear(1024, 1024, 64, bf, "cpu")
    assert "alpha = beta = 1" in _bias_problem(AddmmParams(p.c, p.a, p.b, alpha=2))
    assert "bias" in _bias_problem(AddmmParams(randn((1024, 1024), bf), p.a, p.b))
    assert "bias" in _bias_problem(AddmmParams(p.c.float(), p.a, p.b))
    assert _bias_problem(AddmmParams(p.c.view(1, 1024), p.a, p.b)) is None  # a [1, N] bias
    assert "16-byte aligned" in _bias_problem(AddmmParams(randn((1025,), bf)[1:], p.a, p.b))
    assert "empty" in _operand_problem(_linear(1024, 1024, 0, bf, "cpu"))


def test_a_missing_quack_is_the_reason(monkeypatch):
    monkeypatch.setattr(quack.importlib.metadata, "version", lambda name: (_ for _ in ()).throw(
        quack.importlib.metadata.PackageNotFoundError(name)))
    quack.version.cache_clear()
    quack.unavailable.cache_clear()
    try:
        assert "not installed" in quack.unavailable(0)
    finally:
        quack.version.cache_clear()
        quack.unavailable.cache_clear()


def test_a_plan_not_made_yet_needs_a_compiler_under_kept_builds_only():
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu")
    with builds_only(), pytest.raises(NeedsCompiler):
        quack.plan_for(p.a, p.b, p.c, p.out, "gelu_tanh", CONFIGS[0])


# -- on an H100 / H200 with quack-kernels -----------------------------------------------------------
def _offered(c, p):
    why = c.supports(p)
    if why is not None and ("not installed" in why or "compute capability" in why):
        pytest.skip(why)
    assert why is None, f"{c.name}: {why}"
    return c


def _check_like_torch(out, p, act):
    """Within the bound of a single-rounding float32-accumulating GEMM, or no further off than torch's
    own (add)mm + activation on the same inputs where torch misses that bound."""
    c = p.c if type(p) is AddmmParams else None
    ref, allowed = bound(p.a, p.b, c, act=act, out_dtype=out.dtype)
    theirs = (addmm_op if c is not None else mm_op).default.run(type(p)(*((c,) if c is not None else ()), p.a, p.b,
                                                                        activation=act)).double()
    finite = ref.isfinite() & theirs.isfinite()
    slack = max(1.0, float(((theirs - ref).abs() / allowed)[finite].max())) if finite.any() else 1.0
    within(out, ref, allowed * slack)


FORMS = [("gelu_tanh", True, torch.bfloat16, "col"), ("none", False, torch.float16, "row"),
         ("none", True, torch.bfloat16, "col"), ("relu", True, torch.float16, "col"),
         ("silu", True, torch.bfloat16, "row"), ("gelu_tanh", False, torch.bfloat16, "col")]


@pytest.mark.gpu
@pytest.mark.parametrize("name, act, bias, dtype, b_layout",
                         [(n, *f) for n in NAMES for f in (FORMS if n == NAMES[0] else FORMS[:2])])
def test_each_configuration_directly(name, act, bias, dtype, b_layout):
    """Every form on the first configuration, two on the others (each form and configuration is a compile
    of seconds)."""
    p = _linear(1032, 1544, 520, dtype, "cuda", act, bias, b_layout, seed=len(name))  # multiples of 8, not of 16
    c = _offered(QuackGemm(CONFIGS[NAMES.index(name)]), p)
    c.prepare(p)  # the plan, compiled without a launch
    assert c.run(p) is p.out
    _check_like_torch(p.out, p, act)
    fresh = _linear(2048, 1024, 1024, dtype, "cuda", act, bias, b_layout, out=False, seed=7)  # same plan, other sizes
    _check_like_torch(c.run(fresh), fresh, act)


@pytest.mark.gpu
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_a_column_major_a_as_the_weight_gradient_has(b_layout):
    """grad_weight = grad_out.T @ x: A column-major (M-contiguous), a plan of its own."""
    p = _linear(1024, 2048, 512, torch.bfloat16, "cuda", bias=False, b_layout=b_layout, seed=5, a_layout="col")
    c = _offered(QuackGemm(CONFIGS[0]), p)
    assert c.run(p) is p.out
    _check_like_torch(p.out, p, "none")


@pytest.mark.gpu
def test_a_plan_is_made_on_a_worker_thread_as_preparations_are():
    """A fresh thread has no current CUDA context: quack's module load there failed with
    CUDA_ERROR_INVALID_CONTEXT until the plan bound the device's primary context (H100)."""
    import concurrent.futures
    p = _linear(1024, 1024, 256, torch.float16, "cuda", "gelu_tanh", seed=3)
    c = _offered(QuackGemm(CONFIGS[2]), p)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(c.prepare, p).result(timeout=300)
    _check_like_torch(c.run(p), p, "gelu_tanh")


@pytest.mark.gpu
def test_nan_and_inf_land_where_torchs_do():
    p = _linear(1024, 1024, 64, torch.bfloat16, "cuda", "gelu_tanh")
    p.a[3, 5], p.a[7, 1], p.b[2, 9], p.c[11] = float("nan"), float("inf"), float("-inf"), float("nan")
    check(_offered(QuackGemm(CONFIGS[0]), p).run(p), p.a, p.b, p.c, act="gelu_tanh")


@pytest.mark.gpu
def test_a_cuda_graph_whose_calls_carry_different_biases():
    p1 = _linear(1024, 1024, 512, torch.bfloat16, "cuda", "relu", out=False, seed=1)
    p2 = AddmmParams(randn((1024,), torch.bfloat16, "cuda", seed=9), p1.a, p1.b, activation="relu")
    check_graph_of_two_calls(_offered(QuackGemm(CONFIGS[-1]), p1), p1, p2, "relu")
