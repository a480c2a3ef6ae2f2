"""The activations' differentiable call through C++ (ops/_shared/grad_call.py, backends/fast_grad.cpp):
from the second call of a signature, y's grad_fn is a C++ node; its gradients are torch's, it keeps
torch's autograd rules (retain_graph, in-place changes of the saved input, double backward, non-leaf
inputs), runs the backward under the forward's settings, and propagates the backward's errors."""

import importlib

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_grad
from tunekit.tunable import context, results_store, tuning

silu_module = importlib.import_module("tunekit.ops.silu")
gelu_module = importlib.import_module("tunekit.ops.gelu.op")

pytestmark = pytest.mark.skipif(fast_grad.load() is None, reason="the C++ extension is off or cannot be built here")

CASES = {
    "silu": (lambda x: tunekit.silu(x), lambda x: F.silu(x), "SiluFunctionBackward"),
    "gelu": (lambda x: tunekit.gelu(x), lambda x: F.gelu(x), "GeluFunctionBackward"),
    "gelu_tanh": (lambda x: tunekit.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
                  "GeluFunctionBackward"),
}


def _warm(fn, shape=(37, 65), dtype=torch.float32):
    """Call twice on a tensor of this signature: the first tunes, the second has a runner cached."""
    for _ in range(2):
        fn(torch.randn(shape, dtype=dtype).requires_grad_())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_cached_call_gets_a_cpp_node_and_torchs_gradients(case, dtype):
    ours, theirs, name = CASES[case]
    _warm(ours, dtype=dtype)
    a = torch.randn(37, 65, dtype=torch.float64).to(dtype).requires_grad_()
    x = a * 2  # a non-leaf input: the gradient flows on to a
    y = ours(x)
    assert type(y.grad_fn).__name__ == "CppFunction" and y.grad_fn.name() == name
    dy = torch.randn_like(y)
    y.backward(dy)
    b = a.detach().double().requires_grad_()
    theirs(b * 2).backward(dy.double())
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(a.grad.double(), b.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(y.detach().double(), theirs(b.detach() * 2), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_torchs_autograd_rules_hold(case):
    ours, theirs, _ = CASES[case]
    _warm(ours, shape=(64,), dtype=torch.float64)
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    y = ours(x)
    y.sum().backward(retain_graph=True)
    y.sum().backward()  # retained once: a second backward accumulates
    ref = x.detach().requires_grad_()
    theirs(ref).sum().backward()
    torch.testing.assert_close(x.grad, 2 * ref.grad)
    with pytest.raises(RuntimeError, match="second time|freed"):
        y.sum().backward()
    z = x.detach().clone().requires_grad_()
    w = z * 1.0
    out = ours(w)
    w.mul_(2)  # the saved input changed in place: torch's error, not a wrong gradient
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("case", list(CASES))
def test_double_backward_matches_torch(case):
    ours, theirs, _ = CASES[case]
    _warm(ours, shape=(16,), dtype=torch.float64)
    x = torch.randn(16, dtype=torch.float64, requires_grad=True)
    y = ours(x)
    assert type(y.grad_fn).__name__ == "CppFunction"
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    ref = x.detach().requires_grad_()
    (rg,) = torch.autograd.grad(theirs(ref).sum(), ref, create_graph=True)
    (rgg,) = torch.autograd.grad(rg.sum(), ref)
    torch.testing.assert_close(g, rg)
    torch.testing.assert_close(gg, rgg)
    assert torch.autograd.gradgradcheck(ours, (x,))


def test_the_backward_runs_under_the_forwards_settings(tmp_path):
    """Forward in a tuning() block, backward outside it: the backward's tuning lands in that block's store."""
    store = str(tmp_path / "forward.sqlite")
    with tuning(results=store):
        _warm(tunekit.silu, shape=(300,))
        y = tunekit.silu(torch.randn(301, requires_grad=True))  # a new signature for the backward
        _ = tunekit.silu(torch.randn(301, requires_grad=True))
        y = tunekit.silu(torch.randn(301, requires_grad=True))
    assert type(y.grad_fn).__name__ == "CppFunction"
    y.sum().backward()
    signatures = [e.signature for e in results_store(store).entries("silu_backward")]
    assert any("301" in s for s in signatures), signatures
    assert not any("301" in e.signature for e in results_store().entries("silu_backward"))


def test_an_error_in_the_backward_reaches_the_caller():
    _warm(tunekit.silu, shape=(50,))

    def broken(dy, x):
        raise ValueError("backward exploded")
    call = fast_grad.load().GradCall(silu_module.silu_op.fast_call, broken, context._current, "Broken")
    y = call(torch.randn(50, requires_grad=True))
    assert y is not None and y.grad_fn.name() == "Broken"
    with pytest.raises(ValueError, match="backward exploded"):
        y.sum().backward()


def test_not_taken_without_a_cached_runner_or_with_a_forward_tangent():
    call = gelu_module._gelu_grad_call
    x = torch.randn(777, requires_grad=True)  # never seen: no runner cached
    assert call.call(x, "none") is None
    _warm(tunekit.silu, shape=(40,))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(40), torch.randn(40)).requires_grad_()
        assert silu_module._silu_grad_call.call(dual) is None
    with torch.no_grad():
        assert silu_module._silu_grad_call.call(torch.randn(40, requires_grad=True)) is None
