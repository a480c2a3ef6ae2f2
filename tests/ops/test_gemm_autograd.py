"""Autograd of every GEMM form: the backward is GEMMs through the tuned ``mm`` op.

- gradcheck / gradgradcheck of :class:`GemmFunction` itself in float64 (the formulas: C broadcast,
  alpha / beta, the weight form, each activation; double backward);
- gradients of the public functions against torch's autograd on the same float32 inputs, with
  tuning off (torch's kernels on both sides) and with a Triton candidate forced in;
- the backward's GEMMs are calls of the tunekit op (counted), and run under the forward's settings.
"""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from gemm_checks import ACTS, randn, triton_on_cpu
from op_spies import CandidateRuns
from tunekit.ops.gemm import GemmFunction, TritonGemm, addmm_op, mm_op
from tunekit.tunable.config import Config
from tunekit.tunable.tunable_op import Resolution

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def leaf(shape, seed, dtype=torch.float64, device="cpu"):
    return randn(shape, dtype, device, seed).requires_grad_()


# -- the Function's formulas, in float64 (the default, torch's kernel, runs float64) -------------------
@pytest.mark.parametrize("act", list(ACTS))
def test_gradcheck_addmm_form(act):
    a, b = leaf((4, 6), 0), leaf((6, 5), 1)
    for c_shape in ((4, 5), (5,), (4, 1), ()):
        c = leaf(c_shape, 2)
        fn = lambda c, a, b: GemmFunction.apply(c, a, b, 0.5, -1.5, act, False)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (c, a, b))
        assert torch.autograd.gradgradcheck(fn, (c, a, b))


@pytest.mark.parametrize("act", ["none", "gelu_tanh"])
def test_gradcheck_weight_and_batched_forms(act):
    x, w, bias = leaf((4, 6), 0), leaf((5, 6), 1), leaf(5, 2)
    lin = lambda x, w, bias: GemmFunction.apply(bias, x, w, 1, 1, act, True)  # noqa: E731
    assert torch.autograd.gradcheck(lin, (x, w, bias))
    assert torch.autograd.gradgradcheck(lin, (x, w, bias))
    a, b = leaf((2, 3, 4), 3), leaf((2, 4, 5), 4)
    bmm = lambda a, b: GemmFunction.apply(None, a, b, 1, 1, act, False)  # noqa: E731
    assert torch.autograd.gradcheck(bmm, (a, b))
    assert torch.autograd.gradgradcheck(bmm, (a, b))


# -- the public functions against torch's autograd -----------------------------------------------------
def _cases():
    """(name, tunekit call, torch call, input shapes)."""
    return [
        ("mm", lambda a, b: tunekit.mm(a, b), torch.mm, [(5, 7), (7, 6)]),
        ("addmm", lambda c, a, b: tunekit.addmm(c, a, b, beta=0.5, alpha=2),
         lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), [(6,), (5, 7), (7, 6)]),
        ("bmm", tunekit.bmm, torch.bmm, [(3, 5, 7), (3, 7, 6)]),
        ("baddbmm", lambda c, a, b: tunekit.baddbmm(c, a, b, alpha=-1),
         lambda c, a, b: torch.baddbmm(c, a, b, alpha=-1), [(5, 1), (3, 5, 7), (3, 7, 6)]),
        ("matmul fold", tunekit.matmul, torch.matmul, [(2, 3, 5, 7), (7, 6)]),
        ("matmul bcast", tunekit.matmul, torch.matmul, [(3, 5, 7), (1, 7, 6)]),
        ("linear", tunekit.linear, F.linear, [(2, 5, 7), (6, 7), (6,)]),
        ("linear 2d", tunekit.linear, F.linear, [(5, 7), (6, 7)]),
        *[(f"linear_act {act}", lambda x, w, b, act=act: tunekit.linear_act(x, w, b, act),
           lambda x, w, b, act=act: ACTS[act](F.linear(x, w, b)), [(2, 5, 7), (6, 7), (6,)]) for act in ACTS],
    ]


CASES = _cases()


def _grads(fn, tensors, dy):
    out = fn(*tensors)
    return out, torch.autograd.grad(out, tensors, dy)


@pytest.mark.parametrize("name, ours, theirs, shapes", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_torch(name, ours, theirs, shapes):
    with tunekit.tuning(tuning=False):
        xs = [leaf(s, i, torch.float32) for i, s in enumerate(shapes)]
        y = ours(*xs)
        dy = randn(tuple(y.shape), seed=9)
        expected_y, expected = _grads(theirs, xs, dy)
        y, got = _grads(ours, xs, dy)
    torch.testing.assert_close(y, expected_y, rtol=1e-5, atol=1e-5)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_double_backward_matches_torch():
    with tunekit.tuning(tuning=False):
        x, w, bias = leaf((4, 6), 0, torch.float32), leaf((5, 6), 1, torch.float32), leaf(5, 2, torch.float32)
        results = []
        for fn in (lambda x, w, b: tunekit.linear_act(x, w, b, "silu"), lambda x, w, b: F.silu(F.linear(x, w, b))):
            gx, gw = torch.autograd.grad(fn(x, w, bias).square().sum(), (x, w), create_graph=True)
            results.append(torch.autograd.grad((gx.sum() + gw.square().sum()), (x, w, bias)))
    for g, e in zip(*results):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_backward_gemms_are_tuned_calls(monkeypatch):
    runs = CandidateRuns(monkeypatch, "mm", "addmm")
    try:
        with tunekit.tuning(tuning=False):
            x, w, bias = leaf((2, 5, 7), 0, torch.float32), leaf((6, 7), 1, torch.float32), leaf(6, 2, torch.float32)
            y = tunekit.linear(x, w, bias)
            assert runs.counts() == {"mm": 0, "addmm": 1}
            y.backward(randn(tuple(y.shape), seed=3))
        assert runs.counts() == {"mm": 2, "addmm": 1}  # dx = dy @ w, dw = dy^T @ x
        dw_params = runs.runs["mm"][1]
        assert dw_params.a.stride(0) == 1  # dy^T: a transposed view, no copy
        assert w.grad.is_contiguous() and w.grad.shape == w.shape
    finally:
        runs.close()


def test_backward_runs_under_the_forwards_settings():
    """The backward's GEMMs see the forward's tuning() block even on autograd's thread."""
    x, w = leaf((4, 6), 0, torch.float32), leaf((5, 6), 1, torch.float32)
    with tunekit.tuning(enabled=False):
        y = tunekit.linear(x, w)
    seen = []
    real = mm_op.default.run

    def spy(p):
        seen.append(tunekit.settings().enabled)
        return real(p)

    mm_op.default.run, saved = spy, real
    try:
        y.sum().backward()
    finally:
        mm_op.default.run = saved
    assert seen == [False, False]


@pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(), reason=str(triton_on_cpu()))
def test_gradients_with_a_triton_candidate(monkeypatch):
    """A Triton configuration for every forward and backward GEMM: gradients within float32 GEMM error."""
    candidate = TritonGemm("matmul", Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, SPLIT_K=1,
                                            num_warps=4, num_stages=2))
    used = []

    def resolve(op):
        def fixed(params, s=None, **kw):
            ok = candidate.cannot_run(params) is None
            used.append(ok)
            return Resolution(candidate if ok else op.default, "forced", params.signature(), DEVICE)
        return fixed

    for op in (mm_op, addmm_op):
        monkeypatch.setattr(op, "resolve", resolve(op))
        op.forget()
    try:
        for name, ours, theirs, shapes in CASES:
            xs = [leaf(s, i, torch.float32, DEVICE) for i, s in enumerate(shapes)]
            y = ours(*xs)
            dy = randn(tuple(y.shape), torch.float32, DEVICE, seed=9)
            got = torch.autograd.grad(y, xs, dy)
            x64 = [t.detach().double().requires_grad_() for t in xs]
            expected = torch.autograd.grad(theirs(*x64), x64, dy.double())
            for g, e in zip(got, expected):
                torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4, msg=name)
    finally:
        for op in (mm_op, addmm_op):
            op.forget()
    assert used and all(used)
