"""The differentiable call through C++ (ops/_shared/grad_call.py, backends/fast_grad.cpp): from the
second call of an activation's signature (logsumexp: any call of at most TORCH_NODE_MAX_NUMEL
elements), y comes from tunekit's tuned forward and carries torch's own grad_fn (SiluBackward0 /
GeluBackward0 / LogsumexpBackward0), so its gradients are torch's and it keeps every autograd rule of
torch's (retain_graph, in-place changes of the saved input, double backward, non-leaf inputs,
compiled autograd); where it does not take a call the Python Function runs."""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_grad

from grad_call_cases import CASES, decide as _decide, gelu_module, lse_module, silu_module, warm as _warm  # noqa: F401

pytestmark = pytest.mark.skipif(fast_grad.load() is None, reason="the C++ extension is off or cannot be built here")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_cached_call_gets_torchs_node_and_gradients(case, dtype):
    if case == "logsumexp" and dtype is torch.bfloat16:
        pytest.skip("16-bit logsumexp keeps tunekit's Function: see the test of its limits below")
    ours, theirs, name = CASES[case]
    _warm(ours, dtype=dtype)
    a = torch.randn(37, 65, dtype=torch.float64).to(dtype).requires_grad_()
    x = a * 2  # a non-leaf input: the gradient flows on to a
    y = ours(x)
    assert y.grad_fn.name() == name
    if case == "gelu_tanh":
        assert y.grad_fn._saved_approximate == "tanh"
    dy = torch.randn_like(y)
    y.backward(dy)
    b = a.detach().clone().requires_grad_()
    expected = theirs(b * 2)
    expected.backward(dy)
    assert torch.equal(a.grad, b.grad)  # torch's backward kernel on the same x and dy
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(y.detach().double(), expected.detach().double(), rtol=tol, atol=tol)


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
    w = x.detach().clone().requires_grad_() * 1.0
    out = ours(w)
    w.mul_(2)  # the saved input changed in place: torch's error, not a wrong gradient
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("case", list(CASES))
def test_double_backward_and_gradgradcheck(case):
    ours, theirs, name = CASES[case]
    _warm(ours, shape=(16,), dtype=torch.float64)
    x = torch.randn(16, dtype=torch.float64, requires_grad=True)
    assert ours(x).grad_fn.name() == name
    (g,) = torch.autograd.grad(ours(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    ref = x.detach().requires_grad_()
    (rg,) = torch.autograd.grad(theirs(ref).sum(), ref, create_graph=True)
    (rgg,) = torch.autograd.grad(rg.sum(), ref)
    torch.testing.assert_close(g, rg)
    torch.testing.assert_close(gg, rgg)
    assert torch.autograd.gradgradcheck(ours, (x,))


def test_compiled_autograd_runs_the_backward():
    from torch._dynamo import compiled_autograd
    _warm(tunekit.silu, shape=(48,))
    x = torch.randn(48, requires_grad=True)
    y = tunekit.silu(x)
    assert y.grad_fn.name() == "SiluBackward0"
    with compiled_autograd._enable(torch.compile(backend="eager")):
        y.sum().backward()
    ref = x.detach().requires_grad_()
    F.silu(ref).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_taken_without_a_cached_runner_not_with_a_tangent_or_without_grad():
    x = torch.randn(777, requires_grad=True)  # never seen: no runner cached, the general call runs it
    y = gelu_module._gelu_grad_call.call(x, "none")
    assert y.grad_fn.name() == "GeluBackward0"
    torch.testing.assert_close(y, F.gelu(x))
    _warm(tunekit.silu, shape=(40,))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(40), torch.randn(40)).requires_grad_()
        assert silu_module._silu_grad_call.call(dual) is None
    with torch.no_grad():
        assert silu_module._silu_grad_call.call(torch.randn(40, requires_grad=True)) is None


def test_bad_construction_and_a_failing_forward():
    module = fast_grad.load()
    with pytest.raises(TypeError):
        module.GradCall(lambda x: x, "relu")
    with pytest.raises(TypeError):
        module.GradCall(None, "silu")

    def exploding(x):
        raise ValueError("forward exploded")
    with pytest.raises(ValueError, match="forward exploded"):
        module.GradCall(exploding, "silu")(torch.randn(3, requires_grad=True))
    with pytest.raises(TypeError, match="did not return a tensor"):
        module.GradCall(lambda x: 3, "silu")(torch.randn(3, requires_grad=True))
    with pytest.raises(TypeError):
        module.GradCall(lambda x, a: x, "gelu")(torch.randn(3, requires_grad=True))  # gelu needs its approximation


@pytest.mark.parametrize("forward", [lambda x: x, lambda x: x[1:], lambda x: (x * 2).requires_grad_()],
                         ids=["the input itself", "a view", "a tensor with a history"])
def test_a_result_that_is_not_fresh_gets_no_history(forward):
    """A forward whose result aliases x, is a view or already requires grad is not given torch's node
    (setting its history would corrupt x's graph): None, and the caller's Function runs instead."""
    x = torch.randn(6, requires_grad=True)
    assert fast_grad.load().GradCall(forward, "silu")(x) is None
    assert x.grad_fn is None and x.is_leaf


@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), ((0, 2), False), ([2, 1], True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logsumexp_gets_torchs_node_with_its_dims_and_torchs_gradient(dim, keepdim, dtype):
    x = torch.randn(5, 7, 9, dtype=torch.float64).to(dtype).requires_grad_()
    y = tunekit.logsumexp(x, dim, keepdim)
    node = y.grad_fn
    assert node.name() == "LogsumexpBackward0"
    expected_dims = sorted(d % 3 for d in ((dim,) if isinstance(dim, int) else dim))
    assert list(node._saved_dim) == expected_dims and node._saved_keepdim is keepdim
    assert node._saved_self.data_ptr() == x.data_ptr()
    assert node._saved_result.data_ptr() == y.data_ptr()  # torch's formula reads the result: ours
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = x.detach().double().requires_grad_()
    torch.logsumexp(ref, dim, keepdim).backward(dy.double())
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(y.detach().double(), torch.logsumexp(ref.detach(), dim, keepdim), rtol=tol, atol=tol)


def test_logsumexp_above_the_limit_or_in_16_bit_keeps_the_tuned_gradient_and_a_0d_input_gets_torchs_node():
    big = torch.randn(lse_module.TORCH_NODE_MAX_NUMEL + 1, requires_grad=True)
    assert "LogsumexpFunction" in tunekit.logsumexp(big, 0).grad_fn.name()
    small = torch.randn(8, 9, dtype=torch.bfloat16, requires_grad=True)  # torch's formula rounds x - lse to 16 bits
    assert "LogsumexpFunction" in tunekit.logsumexp(small, 1).grad_fn.name()
    at_limit = torch.randn(lse_module.TORCH_NODE_MAX_NUMEL, requires_grad=True)
    assert tunekit.logsumexp(at_limit, 0).grad_fn.name() == "LogsumexpBackward0"
    scalar = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = tunekit.logsumexp(scalar, 0)
    y.backward()
    assert y.grad_fn.name() == "LogsumexpBackward0" and scalar.grad.item() == 1.0


def test_logsumexp_node_rejects_malformed_arguments():
    call = fast_grad.load().GradCall(lambda x, dims, keepdim: x.sum(), "logsumexp")
    x = torch.randn(3, requires_grad=True)
    for args in [(x,), (x, (0,)), (x, [0], False), (x, (0,), 1), (x, ("0",), False)]:
        with pytest.raises(TypeError):
            call(*args)
    assert call(x, (0,), False).grad_fn.name() == "LogsumexpBackward0"


def test_installing_drops_the_backward_sessions_the_function_started():
    """Before the extension is in place the Python Function runs and its backward may start a tuning
    session of silu_backward; once torch's node takes the calls nothing returns to it: installing
    drops it (its input copies with it), and silu's own decisions stay."""
    from tunekit.ops.silu import SiluFunction, silu_backward_op
    x = torch.randn(4099, requires_grad=True)
    with tunekit.tuning(max_tuning_ms=10_000, tuning_step_ms=1e-6):  # a session spread over calls, left open
        SiluFunction.apply(x).sum().backward()
        assert silu_backward_op.session_calls(), "the backward's tuning did not stay open"
    tunekit.silu(torch.randn(64))  # a decision of silu's own, kept
    decided = silu_module.silu_op.decisions(tunekit.tunable.context.current())
    grad_call = silu_module.GradCall(silu_module._silu_forward, "silu", silu_backward_op)
    grad_call._install(fast_grad.load())
    assert silu_backward_op.session_calls() == {}
    assert silu_module.silu_op.decisions(tunekit.tunable.context.current()) == decided
    y = grad_call.call(x)
    assert y.grad_fn.name() == "SiluBackward0"


@pytest.mark.parametrize("case", ["silu", "gelu", "gelu_tanh"])
def test_with_torchs_kernel_decided_a_differentiable_call_is_torchs_own_call(case, monkeypatch):
    """Where the decided forward is torch's kernel (on the CPU always), its runner is torch's function,
    named differentiable: the fast call gives its result and node directly (F.silu's host cost; the C++
    autograd call's Python forward callback and hand-built node cost 1-4 us more on the CPU host)."""
    ours, theirs, name = CASES[case]
    module = silu_module if case == "silu" else gelu_module
    op = module.silu_op if case == "silu" else module.gelu_op
    extra = () if case == "silu" else ("tanh" if case == "gelu_tanh" else "none",)
    _decide(op, op.make_params(torch.randn(37, 65), *extra), op.default.name)  # Triton's interpreter competes here
    _warm(ours)
    grad_call = module._silu_grad_call if case == "silu" else module._gelu_grad_call

    def not_expected(*args):
        raise AssertionError("the C++ autograd call was taken")
    monkeypatch.setattr(grad_call, "call", not_expected)
    x = torch.randn(37, 65, requires_grad=True)
    y = ours(x)
    assert y.grad_fn.name() == name
    dy = torch.randn_like(y)
    y.backward(dy)
    b = x.detach().clone().requires_grad_()
    theirs(b).backward(dy)
    assert torch.equal(x.grad, b.grad) and torch.equal(y.detach(), theirs(x.detach()))
    with tunekit.patch(["silu", "gelu"]):  # the patched torch function takes the same path
        y2 = (F.silu(x) if case == "silu" else F.gelu(x, approximate="tanh" if case == "gelu_tanh" else "none"))
    assert y2.grad_fn.name() == name and torch.equal(y2.detach(), y.detach())
