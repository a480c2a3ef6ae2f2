"""tunekit.nn.Linear and tunekit.patch(["gemm"]) (F.linear, torch.matmul, nn.Linear.forward): torch's
module and functions in every way one can look at them, tunekit's GEMMs for the calls it takes
(counted), torch's own for every other form; with tuning off the values are torch's bit for bit;
undo restores the exact original objects."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import tunekit
from gemm_checks import randn
from op_spies import CandidateRuns
from tunekit.torch_compat import patch as patch_module

TORCH_LINEAR, TORCH_MATMUL, TORCH_FORWARD = F.linear, torch.matmul, torch.nn.Linear.forward
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def runs(monkeypatch):
    spies = CandidateRuns(monkeypatch, "mm", "addmm")
    yield spies
    spies.close()


@pytest.fixture(autouse=True)
def torch_as_it_was():
    yield
    assert F.linear is TORCH_LINEAR and torch.matmul is TORCH_MATMUL and torch.nn.Linear.forward is TORCH_FORWARD


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def pair(dtype, bias=True):
    torch.manual_seed(0)
    theirs = torch.nn.Linear(24, 9, bias=bias).to(dtype)
    ours = tunekit.nn.Linear(24, 9, bias=bias).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


# -- tunekit.nn.Linear ----------------------------------------------------------------------------
def test_linear_module_looks_like_torchs():
    ours, theirs = pair(torch.float32)
    assert isinstance(ours, torch.nn.Linear) and repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for clone in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours)):
        assert type(clone) is type(ours) and torch.equal(clone.weight, ours.weight)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_module_values_and_gradients_equal_torch(dtype, bias, runs):
    ours, theirs = pair(dtype, bias)
    with tunekit.tuning(tuning=False):
        for shape in ((7, 24), (2, 5, 24), (2, 2, 3, 24)):
            x = randn(shape, dtype).requires_grad_()
            y, yt = ours(x), theirs(x)
            same(y, yt)
            dy = randn(tuple(y.shape), dtype, seed=3)
            g = torch.autograd.grad(y, [x, ours.weight], dy)
            gt = torch.autograd.grad(yt, [x, theirs.weight], dy)
            for a, b in zip(g, gt):
                torch.testing.assert_close(a, b, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-3)
    assert runs.count("addmm" if bias else "mm") >= 3


def test_linear_module_leaves_other_inputs_to_torch(runs):
    ours, theirs = pair(torch.float32)
    for x in (randn(24), randn((5, 3, 24)).transpose(0, 1)):
        same(ours(x), theirs(x))
    x = randn((5, 24)).double()
    same(copy.deepcopy(ours).double()(x), copy.deepcopy(theirs).double()(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        same(ours(randn((5, 24))), theirs(randn((5, 24))))
    assert runs.total() == 0


# -- tunekit.patch(["gemm"]) -----------------------------------------------------------------------
def test_patch_replaces_and_undo_restores_the_exact_objects():
    handle = tunekit.patch(["gemm"])
    try:
        assert F.linear is not TORCH_LINEAR and torch.matmul is not TORCH_MATMUL
        assert torch.nn.Linear.forward is not TORCH_FORWARD
        assert [a.qualified_name for a in patch_module.attributes_of("gemm")] == [
            "torch.nn.functional.linear", "torch.matmul", "torch.nn.modules.linear.Linear.forward"]
    finally:
        handle.undo()
    assert F.linear is TORCH_LINEAR and torch.matmul is TORCH_MATMUL and torch.nn.Linear.forward is TORCH_FORWARD


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_patched_calls_run_tunekit_with_torchs_values(dtype, runs):
    w, bias = randn((9, 24), dtype, seed=1), randn(9, dtype, seed=2)
    module = torch.nn.Linear(24, 9).to(dtype)
    x2, x3 = randn((7, 24), dtype), randn((2, 5, 24), dtype)
    a, b = randn((3, 5, 24), dtype), randn((3, 24, 6), dtype, seed=4)
    calls = [lambda: F.linear(x2, w, bias), lambda: F.linear(x3, w), lambda: F.linear(x3, weight=w, bias=bias),
             lambda: module(x3), lambda: torch.matmul(x2, w.t()), lambda: torch.matmul(x3, w.t()),
             lambda: torch.matmul(a, b)]
    expected = [call() for call in calls]
    with tunekit.tuning(tuning=False), tunekit.patch(["gemm"]):
        for call, e in zip(calls, expected):
            before = runs.total()
            same(call(), e)
            assert runs.total() == before + 1


def test_forms_tunekit_does_not_take_go_to_torch(runs):
    x, w = randn((5, 3, 24)), randn((9, 24), seed=1)
    bias = randn(9, seed=2)
    a4, b4 = randn((2, 3, 4, 5)), randn((2, 3, 5, 6), seed=1)
    calls = [lambda: F.linear(x.transpose(0, 1), w, bias),  # torch: a batched GEMM and an add
             lambda: F.linear(x.transpose(0, 1), w),        # cannot fold without a copy
             lambda: F.linear(randn(24), w),                  # a vector
             lambda: F.linear(x.double(), w.double()),        # float64
             lambda: torch.matmul(a4, b4),                    # 4-D batches
             lambda: torch.matmul(randn((3, 4, 5)), randn((1, 5, 6))),  # broadcast batch (torch folds it)
             lambda: torch.matmul(randn((4, 5)), randn(5)),
             lambda: torch.matmul(randn((4, 5)), randn((5, 6)), out=torch.empty(4, 6))]
    expected = [call() for call in calls]
    with tunekit.tuning(tuning=False), tunekit.patch(["gemm"]):
        got = [call() for call in calls]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert F.linear(randn((5, 24)), w).dtype == torch.bfloat16  # autocast: torch's cast
    for g, e in zip(got, expected):
        same(g, e)
    assert runs.total() == 0


def test_patched_errors_are_torchs():
    with tunekit.patch(["gemm"]):
        with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
            F.linear(randn((3, 4)), randn((5, 6)))
        with pytest.raises(RuntimeError):
            torch.matmul(randn((2, 3, 4)), randn((2, 5, 6)))


def test_patched_model_step_matches_torch():
    """A small MLP, forward and backward, under the patch with tuning off: torch's numbers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8, bias=False))
    x = randn((4, 6, 16))

    def step():
        model.zero_grad(set_to_none=True)
        y = model(x)
        y.square().mean().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y, grads = step()
    with tunekit.tuning(tuning=False), tunekit.patch(["gemm"]):
        yp, gp = step()
    same(yp, y)
    for a, b in zip(gp, grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_compile_under_the_patch_traces_torchs_ops():
    def f(x, w):
        return torch.matmul(F.linear(x, w), w)

    x, w = randn((3, 8)), randn((8, 8), seed=1)
    with tunekit.patch(["gemm"]):
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(x, w), torch.matmul(F.linear(x, w), w))
    torch._dynamo.reset()
