"""The GEMM numerical check (``TunableOp(numerics=...)``): an exact reference, a bound that grows with K,
and 2x torch's own error: correct candidates pass, wrong ones and ones 3x worse than the default do
not, NaN / inf must sit where the default has them; and tuning the real ops rejects a wrong candidate."""

import math

import pytest
import torch

import tunekit
from gemm_checks import matrix, randn, triton_on_cpu
from tunekit.ops.gemm import AddmmParams, GemmParams, TritonGemm, mm_op
from tunekit.ops.gemm.numerics import check_gemm, reference
from tunekit.ops.gemm.torch_candidates import torch_addmm, torch_mm
from tunekit.tunable.tunable_op import TunableOp

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def params(M=12, N=20, K=64, dtype=torch.float32, **kw):
    return GemmParams(matrix(M, K, dtype), matrix(K, N, dtype, seed=1), **kw)


def off_by(p, ratio) -> torch.Tensor:
    """The exact result moved by ``ratio`` x the bound at every element, in p's dtype (float32: the
    rounding adds well under 1% of the bound)."""
    ref, bound = reference(p)
    return (ref + ratio * bound).to(p.a.dtype)


def test_torchs_own_result_passes():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        p = params(dtype=dtype)
        out = torch_mm(p)
        assert check_gemm(p, (out,), (out.clone(),)) is None


def test_a_wrong_result_is_rejected():
    p = params()
    good = torch_mm(p)
    bad = good.clone()
    bad[3, 7] += 1e-2
    assert "GEMM bound" in check_gemm(p, (bad,), (good,))
    assert "GEMM bound" in check_gemm(p, (good.t().contiguous().t() * 1.001,), (good,))
    assert "result" in check_gemm(p, (good[:, :5],), (good,))
    assert "result" in check_gemm(p, (good.half(),), (good,))


def test_within_the_floor_passes_whatever_the_default():
    p = params()
    exact = off_by(p, 0.0)
    assert check_gemm(p, (off_by(p, 0.9),), (exact,)) is None
    assert check_gemm(p, (off_by(p, 1.3),), (exact,)) is not None


def test_more_than_twice_the_defaults_error_is_rejected():
    """The default 2 bounds off (cuBLAS with reduced-precision reductions, say): a candidate 1.7x as
    far off passes, one 3x as far off does not."""
    p = params()
    default = off_by(p, 2.0)
    assert check_gemm(p, (off_by(p, 3.4),), (default,)) is None
    problem = check_gemm(p, (off_by(p, 6.0),), (default,))
    assert problem is not None and "the default's 2" in problem


def test_bound_grows_with_k():
    """An error that is too much at K = 16 is within the bound at K = 4096 (sqrt(K) accumulation)."""
    small, large = params(K=16), params(K=4096)
    for p, ok in ((small, False), (large, True)):
        exact = off_by(p, 0.0)
        ref, bound = reference(small)
        moved = (exact.double() + 3 * bound.mean()).float()
        assert (check_gemm(p, (moved,), (exact,)) is None) == ok


def test_bound_scales_with_the_products_not_the_result():
    """Rows that cancel to ~0 still get the room their products' magnitudes need."""
    a = matrix(4, 256, torch.float32)
    a[1] = 1e4 * randn(256, seed=5)
    b = matrix(256, 8, torch.float32, seed=1)
    p = GemmParams(a, b)
    ref, bound = reference(p)
    assert bound[1].min() > 1e3 * bound[0].max()  # the bound follows each row's magnitudes
    assert math.isfinite(float(bound.max()))


def test_nan_and_inf_placement_must_match_the_default():
    p = params()
    good = torch_mm(p)
    expected = good.clone()
    expected[0, 0], expected[1, 1] = float("nan"), float("inf")
    got = expected.clone()
    assert check_gemm(p, (got,), (expected,)) is None
    got[2, 2] = float("nan")
    assert "NaN where the default has none" in check_gemm(p, (got,), (expected,))
    got = expected.clone()
    got[1, 1] = -float("inf")
    assert "infinities" in check_gemm(p, (got,), (expected,))
    got = expected.clone()
    got[0, 0] = 0.0
    assert "missing" in check_gemm(p, (got,), (expected,))


def test_addmm_reference_includes_c_beta_alpha_and_activation():
    M, N, K = 6, 10, 32
    a, b, c = matrix(M, K, torch.float32), matrix(K, N, torch.float32, seed=1), randn(N, seed=2)
    p = AddmmParams(c, a, b, alpha=0.5, beta=-2, activation="gelu")
    ref, _ = reference(p)
    torch.testing.assert_close(ref, torch.nn.functional.gelu(0.5 * (a.double() @ b.double()) - 2 * c.double()))
    out = torch_addmm(p)
    assert check_gemm(p, (out,), (out.clone(),)) is None
    p0 = AddmmParams(torch.full((M, N), float("nan")), a, b, beta=0)
    assert reference(p0)[0].isfinite().all()  # beta == 0: C not read


def test_tf32_allows_tf32_rounding():
    p, p32 = params(K=256, tf32=True), params(K=256, tf32=False)
    ref = off_by(p32, 0.0)
    ten_bits = (ref.double() * (1 + 2.0 ** -11)).float()  # inputs rounded to TF32 move products this much
    assert check_gemm(p, (ten_bits,), (ref,)) is None
    assert check_gemm(p32, (ten_bits,), (ref,)) is not None


def test_the_reference_is_computed_once_per_params():
    p = params()
    out = torch_mm(p)
    check_gemm(p, (out,), (out,))
    first = p.__dict__["_gemm_reference"]
    check_gemm(p, (out.clone(),), (out,))
    assert p.__dict__["_gemm_reference"] is first


# -- in tuning ------------------------------------------------------------------------------------
def _op_with(*candidates):
    op = TunableOp("gemm_numerics_test", GemmParams, numerics=check_gemm)
    op.add(torch_mm, default=True)
    for fn in candidates:
        op.add(fn)
    return op


def test_tuning_rejects_wrong_and_too_inaccurate_candidates():
    def off_by_one_element(p):
        out = torch_mm(p.replace(out=None))
        out[0, 0] += 1.0
        return p.out.copy_(out)

    def bf16_inputs(p):  # 3 mantissa bits lost per input: far more than 2x float32's error
        return torch.mm(p.a.bfloat16().float(), p.b.bfloat16().float(), out=p.out)

    def same(p):
        return torch.mm(p.a, p.b, out=p.out)

    op = _op_with(off_by_one_element, bf16_inputs, same)
    p = params(M=16, N=16, K=128)
    with tunekit.tuning(results=":memory:", max_tuning_ms=5000, tuning_step_ms=float("inf")):
        r = op.resolve(p)
    records = r.entry.candidates
    assert records["off_by_one_element"].status == "numerics"
    assert records["bf16_inputs"].status == "numerics"
    assert records["same"].status != "numerics"


@pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(), reason=str(triton_on_cpu()))
def test_tuning_the_mm_op_rejects_a_broken_triton_candidate(monkeypatch):
    """A real candidate made wrong (one element off) is rejected by the mm op's own check, the others pass."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = matrix(24, 40, torch.bfloat16, device), matrix(40, 32, torch.bfloat16, device, seed=1)
    p = GemmParams(a, b)
    broken = next(c for c in mm_op.candidates[1:] if isinstance(c, TritonGemm) and c.supports(p) is None)
    run = broken.run

    def wrong(params, **kw):
        out = run(params, **kw)
        out.view(-1)[5] += 1
        return out

    monkeypatch.setattr(broken, "run", wrong)
    mm_op.forget()
    with tunekit.tuning(results=":memory:", max_tuning_ms=60000, tuning_step_ms=float("inf")):
        r = mm_op.resolve(p)
    records = r.entry.candidates
    assert records[broken.name].status == "numerics"
    others = [n for n, rec in records.items() if n != broken.name and rec.status not in ("unsupported",)]
    assert others and all(records[n].status != "numerics" for n in others)
    mm_op.forget()


def test_the_warm_up_runs_the_check_once_per_dtype_device_and_activation(monkeypatch):
    """warm_reference (the op's warm_numerics: off the budget, on a worker thread online) checks a small problem
    of the params' kind, so that the first signature's check does not pay the kernels' first load."""
    from tunekit.ops.gemm import numerics
    from tunekit.ops.gemm.op import addmm_op, mm_op

    from tunekit.ops._shared import routing

    assert mm_op.warm_numerics is numerics.warm_reference is addmm_op.warm_numerics
    assert mm_op.off_thread is routing.off_thread is addmm_op.off_thread  # online: on a worker
    p = GemmParams(torch.randn(3, 5), torch.randn(5, 7))
    assert routing.off_thread(numerics.warm_reference).worth(p) is False  # the CPU: not worth a worker
    monkeypatch.setattr(numerics, "_warmed", set())
    seen = []
    check = numerics.check_gemm
    monkeypatch.setattr(numerics, "check_gemm", lambda p, got, expected: seen.append(p) or check(p, got, expected))
    numerics.warm_reference(p)
    assert seen == []  # the CPU loads no kernel lazily: nothing to warm
    monkeypatch.setattr(numerics, "_loads_kernels_lazily", lambda device: True)  # as CUDA does
    state = torch.get_rng_state()
    numerics.warm_reference(p)
    assert torch.equal(torch.get_rng_state(), state)  # the user's random stream is untouched
    numerics.warm_reference(p)
    assert len(seen) == 1 and seen[0].a.shape == (numerics.WARM_SIZE, numerics.WARM_SIZE)
    numerics.warm_reference(GemmParams(torch.randn(3, 5), torch.randn(5, 7), activation="gelu"))
    numerics.warm_reference(GemmParams(torch.randn(3, 5, dtype=torch.bfloat16), torch.randn(5, 7, dtype=torch.bfloat16)))
    assert [(q.a.dtype, q.activation) for q in seen] == [(torch.float32, "none"), (torch.float32, "gelu"),
                                                         (torch.bfloat16, "none")]


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu", "gelu_tanh"])
def test_the_reference_never_calls_a_patchable_function(monkeypatch, activation):
    """The reference's activation is ATen's own: the warm-up runs it on a worker thread, where tunekit.patch()'s
    F.gelu (the routing's "inside a tunekit call" flag is per thread) went into tunekit's gelu op and took the tuning
    lock, which the caller could hold while it waited for the warm-up."""
    from tunekit.ops.gemm import numerics

    def patched(*args, **kwargs):
        raise AssertionError("a patchable torch.nn.functional function was called")

    for name in ("gelu", "silu", "relu"):
        monkeypatch.setattr(torch.nn.functional, name, patched)
    a, b = torch.randn(6, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    ref, bound = numerics.reference(GemmParams(a, b, activation=activation))
    expected = {"relu": torch.relu, "silu": torch._C._nn.silu, "gelu": torch._C._nn.gelu,
                "gelu_tanh": lambda z: torch._C._nn.gelu(z, approximate="tanh")}[activation](a @ b)
    torch.testing.assert_close(ref, expected)


def test_an_ops_work_off_the_callers_thread_never_reenters_tunekit_under_the_patch():
    """routing.off_thread marks the worker inside tunekit while the job runs: a patched F.gelu there runs torch's own.
    Unmarked, it went into tunekit's gelu op and waited for the tuning lock, which a caller waiting for the job
    held (explain(), resolve(finish=True)): a deadlock."""
    import tunekit
    from tunekit.ops._shared import routing
    from tunekit.tunable.preparations import session_worker
    from tunekit.tunable.tunable_op import TUNING_LOCK

    x = torch.randn(64, 32)
    job = routing.off_thread(lambda p: (routing.inside_tunekit(), torch.nn.functional.gelu(p.a, approximate="tanh")))
    with tunekit.patch(), TUNING_LOCK:
        inside, y = session_worker().submit(job, GemmParams(x, x.t())).result(timeout=20)
    assert inside and not routing.inside_tunekit()
    torch.testing.assert_close(y, torch._C._nn.gelu(x, approximate="tanh"))
