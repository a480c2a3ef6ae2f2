"""tunekit.rms_norm: every candidate against float64, torch's arguments / results / errors, autograd
(torch's node once torch's kernel is the choice, the tuned gradient otherwise, double backward), the
drop-in module, the patch of F.rms_norm / nn.RMSNorm / Hugging Face's LlamaRMSNorm, the custom ops."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import tunekit
from op_spies import CandidateRuns
from tunekit.ops.rms_norm import (RmsNormBackwardParams, RmsNormFunction, RmsNormParams, rms_norm_backward_op,
                                  rms_norm_op)
from tunekit.tunable.numerics import tolerance
from tunekit.tunable.params import make_trial

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [((5, 33), (33,)), ((2, 3, 64), (64,)), ((4, 6, 10), (6, 10)), ((1, 1), (1,)), ((7, 300), (300,))]


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():  # the Triton interpreter's overflow warnings
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def inputs(shape, norm, dtype, requires_grad=False):
    x = (torch.randn(shape, dtype=torch.float64) * 3).to(dtype)
    w = (torch.rand(norm, dtype=torch.float64) + 0.5).to(dtype)
    return x.requires_grad_(requires_grad), w.requires_grad_(requires_grad)


def reference(x, w, norm, eps, dy=None):
    """float64 forward (and gradients for ``dy``)."""
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    dims = tuple(range(x.dim() - len(norm), x.dim()))
    y = xd * torch.rsqrt(xd.square().mean(dims, keepdim=True) + eps) * wd
    if dy is None:
        return y.detach()
    gx, gw = torch.autograd.grad(y, (xd, wd), dy.double())
    return y.detach(), gx, gw


def close(actual, expected, dtype, scale=1.0):
    rtol, atol = tolerance(dtype)
    torch.testing.assert_close(actual.double(), expected.double(), rtol=2 * rtol, atol=2 * atol * scale)


# -- every candidate, directly ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, norm", SHAPES)
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("name", [c.name for c in rms_norm_op.candidates])
def test_forward_candidate_matches_float64(name, shape, norm, eps, dtype):
    x, w = inputs(shape, norm, dtype)
    trial = make_trial(RmsNormParams(x, w, norm, eps))
    assert trial.out.isnan().all()  # unwritten elements would show
    candidate = rms_norm_op.candidate(name)
    why = candidate.supports(trial)
    if why:
        pytest.skip(why)
    assert candidate.run(trial) is trial.out
    close(trial.out, reference(x, w, norm, eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, norm", SHAPES)
@pytest.mark.parametrize("name", [c.name for c in rms_norm_backward_op.candidates])
def test_backward_candidate_matches_float64(name, shape, norm, dtype):
    x, w = inputs(shape, norm, dtype)
    dy = torch.randn(shape, dtype=torch.float64).to(dtype)
    trial = make_trial(RmsNormBackwardParams(dy, x, w, norm, 1e-6))
    candidate = rms_norm_backward_op.candidate(name)
    why = candidate.supports(trial)
    if why:
        pytest.skip(why)
    dx, dw = candidate.run(trial)
    assert dx is trial.out and dw is trial.dweight
    _, gx, gw = reference(x, w, norm, 1e-6, dy)
    close(dx, gx, dtype)
    rows = x.numel() // w.numel()
    close(dw, gw, dtype, scale=math.sqrt(rows))  # a sum over the rows


@pytest.mark.parametrize("name", [c.name for c in rms_norm_op.candidates if "triton" in c.name])
def test_triton_declines_what_it_does_not_run(name):
    c = rms_norm_op.candidate(name)
    x, w = inputs((4, 8), (8,), torch.float32)
    assert c.supports(RmsNormParams(x.t().contiguous().t(), w, (8,)))  # strided rows
    assert c.supports(RmsNormParams(x.double(), w.double(), (8,)))  # float64: torch's
    long_x, long_w = inputs((1, 16385), (16385,), torch.float32)
    assert c.supports(RmsNormParams(long_x, long_w, (16385,)))  # a row longer than the registers hold


@pytest.mark.parametrize("name", [c.name for c in rms_norm_op.candidates])
def test_special_values_as_torch(name):
    x, w = inputs((4, 16), (16,), torch.float32)
    x[0, 3], x[1, 5], x[2, 0] = math.nan, math.inf, -math.inf
    trial = make_trial(RmsNormParams(x, w, (16,), 1e-6))
    c = rms_norm_op.candidate(name)
    if c.supports(trial):
        pytest.skip(c.supports(trial))
    got, want = c.run(trial), F.rms_norm(x, (16,), w, 1e-6)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_empty_input():
    x, w = inputs((0, 16), (16,), torch.float32)
    assert tunekit.rms_norm(x, (16,), w).shape == (0, 16)
    dx, dw = tunekit.rms_norm_backward(torch.empty(0, 16), x, w, (16,))
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros(16))


# -- the public function: torch's arguments, results and errors ----------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_public_function_matches_torch(dtype):
    x, w = inputs((6, 40), (40,), dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for args in (((40,), w), ([40], w, 1e-5), (torch.Size([40]), w, None)):
            close(tunekit.rms_norm(x, *args), F.rms_norm(x, *args), dtype)
        for args in (((40,), None), ((40,), w.float() if dtype != torch.float32 else w.double())):
            got, want = tunekit.rms_norm(x, *args), F.rms_norm(x, *args)  # torch's own function runs these
            assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("args", [((41,), "w"), ((40,), "w41"), ((3, 40), "w"), ((40,), "w", "eps"), (40, "w")])
def test_bad_arguments_raise_as_torch(args):
    x, w = inputs((6, 40), (40,), torch.float32)
    values = {"w": w, "w41": torch.ones(41), "eps": "1e-5"}
    call = [values.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(Exception) as torch_error:
        F.rms_norm(x, *call)
    with pytest.raises(type(torch_error.value)):
        tunekit.rms_norm(x, *call)


def test_integer_input_raises_as_torch():
    x = torch.ones(3, 4, dtype=torch.int64)
    with pytest.raises(Exception) as torch_error:
        F.rms_norm(x, (4,), torch.ones(4, dtype=torch.int64))
    with pytest.raises(type(torch_error.value)):
        tunekit.rms_norm(x, (4,), torch.ones(4, dtype=torch.int64))


def test_calls_reach_the_tunable_op(monkeypatch):
    runs = CandidateRuns(monkeypatch, "rms_norm")
    x, w = inputs((6, 40), (40,), torch.float32)
    with tunekit.tuning(tuning=False):
        tunekit.rms_norm(x, (40,), w)
        tunekit.rms_norm(x, (40,), w)
    assert runs.count("rms_norm") == 2
    runs.close()


# -- autograd ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tuned_gradient_matches_float64(dtype):
    x, w = inputs((5, 7, 33), (33,), dtype, requires_grad=True)
    y = RmsNormFunction.apply(x, w, (33,), None)
    dy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    want_y, want_gx, want_gw = reference(x, w, (33,), None, dy)
    close(y, want_y, dtype)
    close(gx, want_gx, dtype)
    close(gw, want_gw, dtype, scale=math.sqrt(35))


def test_first_call_tunes_then_torch_node_when_torch_is_the_choice():
    x, w = inputs((6, 40), (40,), torch.float32, requires_grad=True)
    with tunekit.tuning(tuning=False):  # the default decides: torch's kernel
        first = tunekit.rms_norm(x, (40,), w)
        later = tunekit.rms_norm(x, (40,), w)
    assert type(first.grad_fn).__name__ == "RmsNormFunctionBackward"
    assert "RmsNormFunction" not in type(later.grad_fn).__name__
    g1 = torch.autograd.grad(first.sum(), (x, w))
    g2 = torch.autograd.grad(later.sum(), (x, w))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_gradients_and_double_backward_pass_gradcheck():
    x, w = inputs((4, 24), (24,), torch.float64, requires_grad=True)
    fn = lambda a, b: RmsNormFunction.apply(a, b, (24,), 1e-5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_backward_function_refuses_mismatched_inputs():
    x, w = inputs((4, 8), (8,), torch.float32)
    with pytest.raises(ValueError, match="dy and x"):
        tunekit.rms_norm_backward(torch.ones(4, 9), x, w, (8,))


# -- drop-in: tunekit.nn.RMSNorm and tunekit.patch() ----------------------------------------------
def test_module_is_torchs_with_tunekits_forward(monkeypatch):
    runs = CandidateRuns(monkeypatch, "rms_norm")
    ours, theirs = tunekit.nn.RMSNorm(40, eps=1e-5), torch.nn.RMSNorm(40, eps=1e-5)
    ours.load_state_dict(theirs.state_dict())
    assert isinstance(ours, torch.nn.RMSNorm) and repr(ours) == repr(theirs)
    x = torch.randn(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))
    assert runs.count("rms_norm") >= 1
    runs.close()


def test_patch_routes_functional_and_module_then_restores(monkeypatch):
    original_f, original_forward = F.rms_norm, torch.nn.RMSNorm.forward
    runs = CandidateRuns(monkeypatch, "rms_norm")
    m, x = torch.nn.RMSNorm(40), torch.randn(3, 40)
    with torch.no_grad(), tunekit.patch(["rms_norm"]):
        assert F.rms_norm is not original_f
        torch.testing.assert_close(F.rms_norm(x, (40,), m.weight), original_f(x, (40,), m.weight))
        torch.testing.assert_close(m(x), original_forward(m, x))
        calls = runs.count("rms_norm")
    assert calls >= 2
    assert F.rms_norm is original_f and torch.nn.RMSNorm.forward is original_forward
    runs.close()


def test_patch_takes_hugging_face_llama_rms_norm(monkeypatch):
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    cls = modeling_llama.LlamaRMSNorm
    original = cls.forward
    runs = CandidateRuns(monkeypatch, "rms_norm")
    m = cls(40, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 40, dtype=torch.bfloat16)
    with torch.no_grad(), tunekit.patch():
        assert cls.forward is not original
        got, want = m(x), original(m, x)
        assert runs.count("rms_norm") >= 1
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)  # one rounding less: within an ulp
        m32 = cls(40).to(torch.bfloat16)
        m32.weight.data = m32.weight.data.float()  # float32 weight: Hugging Face's float32 result, its forward
        assert m32(x).dtype == torch.float32
    assert cls.forward is original
    runs.close()


# -- torch.library custom ops ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_custom_ops_opcheck(dtype):
    x, w = inputs((5, 33), (33,), dtype, requires_grad=True)
    opcheck(torch.ops.tunekit.rms_norm, (x, w, [33], 1e-5))
    dy = torch.randn(5, 33, dtype=dtype)
    opcheck(torch.ops.tunekit.rms_norm_backward, (dy, x.detach(), w.detach(), [33], None))


def test_compiled_call_matches_eager():
    x, w = inputs((6, 40), (40,), torch.float32, requires_grad=True)
    compiled = torch.compile(lambda a, b: tunekit.rms_norm(a, (40,), b, 1e-5) * 2, backend="aot_eager",
                             fullgraph=True)
    y = compiled(x, w)
    want = F.rms_norm(x, (40,), w, 1e-5) * 2
    torch.testing.assert_close(y, want)
    g, rg = torch.autograd.grad(y.sum(), (x, w)), torch.autograd.grad(want.sum(), (x, w))
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b)


# -- on the GPU: every candidate at model sizes, the tuned call under autograd, the patched LLaMA step --
GPU_SHAPES = [((4096, 1024), (1024,)), ((7, 300), (300,)), ((3, 16384), (16384,)), ((2, 513, 4096), (4096,))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, norm", GPU_SHAPES)
def test_every_candidate_on_the_gpu(cuda, shape, norm, dtype):
    x, w = (t.to(cuda) for t in inputs(shape, norm, dtype))
    dy = torch.randn(shape, device=cuda).to(dtype)
    want_y, want_gx, want_gw = reference(x, w, norm, None, dy)
    ran = 0
    for c in rms_norm_op.candidates:
        trial = make_trial(RmsNormParams(x, w, norm, None))
        if c.supports(trial) is None:
            close(c.run(trial), want_y, dtype)
            ran += 1
    for c in rms_norm_backward_op.candidates:
        trial = make_trial(RmsNormBackwardParams(dy, x, w, norm, None))
        if c.supports(trial) is None:
            dx, dw = c.run(trial)
            close(dx, want_gx, dtype)
            close(dw, want_gw, dtype, scale=math.sqrt(x.numel() // w.numel()))
            ran += 1
    assert ran == len(rms_norm_op.candidates) + len(rms_norm_backward_op.candidates)  # Triton runs them all


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tuned_calls_under_autograd_on_the_gpu(cuda, dtype):
    x, w = (t.to(cuda).requires_grad_() for t in inputs((4096, 1024), (1024,), dtype))
    want = F.rms_norm(x, (1024,), w, 1e-6)
    dy = torch.randn_like(want)
    want_g = torch.autograd.grad(want, (x, w), dy)
    for _ in range(3):  # tuning, then the decided choice (torch's node or the tuned gradient)
        y = tunekit.rms_norm(x, (1024,), w, 1e-6)
        close(y, want, dtype)
        for a, b in zip(torch.autograd.grad(y, (x, w), dy), want_g):
            close(a, b, dtype, scale=64)
