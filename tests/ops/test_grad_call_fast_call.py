"""The C++ fast call's differentiable path (backends/fast_call.cpp with fast_grad.cpp's recorders): a cached
call of silu or gelu whose x requires grad runs its runner with grad mode off and gets torch's own node in one
C++ call, where a recorder can record it; else it leaves the call to the general path (test_grad_call.py: the
differentiable call through Python)."""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_grad

from grad_call_cases import CASES, decide as _decide, gelu_module, silu_module, warm as _warm  # noqa: F401

pytestmark = pytest.mark.skipif(fast_grad.load() is None, reason="the C++ extension is off or cannot be built here")


def _fast_call_with(runner, x, extra=None, recorder=None):
    """A C++ FastCall whose one runner, for ``x``'s key (and ``extra``), is ``runner``."""
    from tunekit.backends import fast_call
    from tunekit.tunable import context
    key = (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
    runners = {context.current().cache_id: {key if extra is None else (key, extra): runner}}
    options = {} if recorder is None else {"recorder": recorder}
    return fast_call.load().FastCall(runners, context._current, context, torch.Tensor, frozenset(), **options)


class KernelRunner:
    """A stand-in for a CUDA C runner (not differentiable): records grad mode and its inputs."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, x):
        self.calls.append(torch.is_grad_enabled())
        return self.fn(x.detach())


@pytest.mark.parametrize("case", ["silu", "gelu_tanh"])
def test_a_fast_call_with_a_recorder_runs_a_kernel_runner_and_gives_torchs_node(case):
    """silu's and gelu's fast calls take x requiring grad themselves once the extension's recorder is
    in their slot: the runner (grad mode off) and torch's node in one C++ call."""
    module = fast_grad.load()
    a = torch.randn(37, 65, dtype=torch.float64).requires_grad_()
    x = a * 2  # non-leaf: the gradient flows on to a
    if case == "silu":
        runner, extra, recorder = KernelRunner(F.silu), None, [module.silu_call]
    else:
        runner, extra, recorder = KernelRunner(lambda t: F.gelu(t, approximate="tanh")), "tanh", [module.gelu_call]
    fc = _fast_call_with(runner, x, extra, recorder)
    y = fc(x) if extra is None else fc(x, extra)
    assert runner.calls == [False]  # run once, grad mode off
    assert y.grad_fn.name() == CASES[case][2]
    if case == "gelu_tanh":
        assert y.grad_fn._saved_approximate == "tanh"
    dy = torch.randn_like(y)
    y.backward(dy)
    b = a.detach().clone().requires_grad_()
    expected = CASES[case][1](b * 2)
    expected.backward(dy)
    assert torch.equal(a.grad, b.grad) and torch.equal(y.detach(), expected.detach())


def test_a_fast_call_without_a_recorder_or_where_one_cannot_record_leaves_the_call():
    """No recorder yet (its slot None, or none given), a forward-mode tangent, or a result that is not
    fresh: None, the general path runs (with grad mode off the runner's result is the answer)."""
    module = fast_grad.load()
    x = torch.randn(40, requires_grad=True)
    runner = KernelRunner(F.silu)
    assert _fast_call_with(runner, x)(x) is None
    assert _fast_call_with(runner, x, recorder=[None])(x) is None
    assert runner.calls == []
    fc = _fast_call_with(runner, x, recorder=[module.silu_call])
    with torch.no_grad():
        y = fc(x)
    assert runner.calls == [False] and y.grad_fn is None and torch.equal(y, F.silu(x.detach()))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(40), torch.randn(40)).requires_grad_()
        assert _fast_call_with(runner, dual, recorder=[module.silu_call])(dual) is None
    for not_fresh in (lambda t: t, lambda t: t.view(-1)):
        x = torch.randn(40, requires_grad=True)
        assert _fast_call_with(not_fresh, x, recorder=[module.silu_call])(x) is None
        assert x.grad_fn is None and x.is_leaf
    with pytest.raises(TypeError):  # gelu's recorder needs the approximation
        module.gelu_call(runner, torch.randn(3, requires_grad=True))


def test_a_fast_call_with_a_recorder_leaves_inference_mode_unrecorded_errors_cleared_and_nothing_leaked():
    """Under inference mode (grad mode on or not) torch records no history: neither does the recorder.
    A runner whose membership test raises leaves the call to the general path with no error pending;
    a transform's wrapped tensor (no data pointer) is refused without leaking a reference."""
    import sys
    module = fast_grad.load()
    x = torch.randn(40, requires_grad=True)
    runner = KernelRunner(F.silu)
    fc = _fast_call_with(runner, x, recorder=[module.silu_call])
    with torch.inference_mode(), torch.enable_grad():
        y = fc(x)
        want = F.silu(x)
    assert y.grad_fn is None and not y.requires_grad and want.grad_fn is None and torch.equal(y, want)

    class Unhashable:
        __hash__ = None

        def __call__(self, t):
            return F.silu(t.detach())
    assert _fast_call_with(Unhashable(), x, recorder=[module.silu_call])(x) is None
    from tunekit.tunable import context
    table = {}
    runners = {context.current().cache_id: table}
    fc = fast_call_module().FastCall(runners, context._current, context, torch.Tensor, frozenset(),
                                     recorder=[module.silu_call])
    before, answers = sys.getrefcount(table), []
    torch.func.vmap(lambda t: answers.append(fc(t)) or t)(torch.randn(3, 40))
    assert answers == [None] and sys.getrefcount(table) == before


def fast_call_module():
    from tunekit.backends import fast_call
    return fast_call.load()


def test_installing_the_extension_fills_the_recorder_slots_the_ops_fast_calls_read():
    from tunekit.ops._shared.grad_call import recorder_slot
    _warm(tunekit.silu)
    _warm(lambda t: tunekit.gelu(t, approximate="tanh"))
    fast_grad.when_loaded.settle()
    assert recorder_slot("silu")[0] is fast_grad.load().silu_call
    assert recorder_slot("gelu")[0] is fast_grad.load().gelu_call


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["silu", "gelu_tanh"])
def test_with_a_cuda_c_choice_the_fast_call_takes_the_differentiable_call(case, monkeypatch):
    """On the GPU with a CUDA C kernel decided, x requiring grad goes through the C++ fast call (the
    Launcher and torch's node), not the op's GradCall; values and gradients are torch's."""
    from tunekit.backends import fast_call
    if fast_call.load() is None or not torch.cuda.is_available():
        pytest.skip("needs the fast-call extension and a GPU")
    ours, theirs, name = CASES[case]
    op = silu_module.silu_op if case == "silu" else gelu_module.gelu_op
    choice = "silu_f32" if case == "silu" else "gelu_tanh_f32"
    x0 = torch.randn(4096 + 7, device="cuda")
    _decide(op, op.make_params(x0) if case == "silu" else op.make_params(x0, approximate="tanh"), choice)
    ours(x0)  # the runner cached
    _warm(ours, shape=(4096 + 7,), dtype=torch.float32)  # the extension installed (CPU tensors)
    fast_grad.when_loaded.settle()
    grad_call = silu_module._silu_grad_call if case == "silu" else gelu_module._gelu_grad_call

    def not_expected(*args):
        raise AssertionError("the GradCall was taken: the fast call left the differentiable call")
    monkeypatch.setattr(grad_call, "call", not_expected)
    from tunekit.ops._shared.grad_call import recorder_slot
    slot, recorded = recorder_slot("silu" if case == "silu" else "gelu"), []
    recorder = slot[0]
    slot[0] = lambda *args: recorded.append(type(args[0]).__name__) or recorder(*args)
    try:
        x = torch.randn(4096 + 7, device="cuda", requires_grad=True)
        y = ours(x)
    finally:
        slot[0] = recorder
    assert recorded == ["Launcher"]  # the CUDA C choice's runner, through the recorder
    assert y.grad_fn.name() == name
    dy = torch.randn_like(y)
    y.backward(dy)
    b = x.detach().clone().requires_grad_()
    expected = theirs(b)
    expected.backward(dy)
    torch.testing.assert_close(y.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(x.grad, b.grad)  # torch's backward kernel on the same x and dy
