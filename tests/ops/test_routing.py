"""``routing.takes``: whether tunekit may take a call of torch's function. Its checks after
``is_compiling()`` exist twice, in Python (``python_takes``) and in C++ (``backends/fast_route.cpp``,
installed once built): both are held to the same cases here, each case one the rule names."""

import subprocess
import sys
import threading

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import TorchDispatchMode

from tunekit.backends import fast_route
from tunekit.ops._shared import routing

from extension_checks import built


def _module():
    return built(fast_route, "routing")


def _native():
    module = _module()
    module.configure(torch.Tensor, routing.state, fwAD, torch._C._functorch.peek_interpreter_stack)
    return module.takes


@pytest.fixture(params=["python", "c++"])
def checks(request):
    return routing.python_takes if request.param == "python" else _native()


class _PassThroughFunctionMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _PassThroughDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_plain_floating_tensor_is_taken(checks, dtype):
    assert checks(torch.randn(8, dtype=dtype)) is True
    assert checks(torch.randn(4, 6).t()) is True  # a view: still a plain strided tensor


@pytest.mark.parametrize("make", [
    lambda: torch.arange(5),  # integer
    lambda: torch.randn(3, dtype=torch.complex64),
    lambda: torch.nn.Parameter(torch.randn(3)),  # a subclass
    lambda: torch.randn(4).to_sparse(),
    lambda: torch.empty(3, device="meta"),
    lambda: [1.0, 2.0],
    lambda: None,
], ids=["int", "complex", "parameter", "sparse", "meta", "list", "none"])
def test_what_torch_must_handle_is_not_taken(checks, make):
    assert checks(make()) is False


def test_not_taken_inside_tunekit_on_this_thread_only(checks):
    x = torch.randn(4)
    seen = []
    routing.state.inside = True
    try:
        assert checks(x) is False
        other = threading.Thread(target=lambda: seen.append(checks(x)))
        other.start()
        other.join()
    finally:
        routing.state.inside = False
    assert seen == [True] and checks(x) is True


def test_not_taken_under_a_torch_function_or_dispatch_mode(checks):
    x = torch.randn(4)
    with _PassThroughFunctionMode():
        assert checks(x) is False
    with _PassThroughDispatchMode():
        assert checks(x) is False
    assert checks(x) is True


def test_not_taken_under_forward_ad_or_a_functorch_transform(checks):
    x = torch.randn(3, 4)
    with fwAD.dual_level():
        assert checks(x) is False
    seen = []
    torch.func.vmap(lambda row: seen.append(checks(row)) or row)(x)
    torch.func.grad(lambda t: seen.append(checks(t)) or t.sum())(torch.randn(4))
    assert seen == [False, False]
    assert checks(x) is True


def test_not_taken_while_torchscript_traces(checks):
    seen = []

    def f(t):
        seen.append(checks(t))
        return t * 2

    torch.jit.trace(f, torch.randn(3), check_trace=False)
    assert seen == [False] and checks(torch.randn(3)) is True


def test_takes_asks_the_cpp_checks_once_built_and_python_until_then(monkeypatch):
    monkeypatch.setattr(routing, "_checks", routing._first_checks)
    installed = []
    monkeypatch.setattr(fast_route, "when_loaded", lambda install: installed.append(install))
    x = torch.randn(4)
    assert routing.takes(x) is True and routing._checks is routing.python_takes  # the build asked for
    assert len(installed) == 1
    installed[0](fast_route.load())
    assert routing._checks is fast_route.load().takes and routing.takes(x) is True
    assert routing.takes(torch.arange(3)) is False


def test_takes_is_false_under_torch_compile_without_asking_the_checks(monkeypatch):
    asked = []
    monkeypatch.setattr(routing, "_checks", lambda x: asked.append(x) or True)
    compiled = torch.compile(lambda t: t + 1 if routing.takes(t) else t - 1, backend="eager", fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), -torch.ones(2))
    assert asked == []


def test_configure_refuses_what_is_not_a_tensor_type():
    with pytest.raises(TypeError, match="must be a type"):
        _module().configure("not a type", routing.state, fwAD, torch._C._functorch.peek_interpreter_stack)


def test_takes_before_configure_raises_in_a_fresh_process():
    _module()  # built (or skipped) here; the child loads the same build
    code = ("import torch\nfrom tunekit.backends import fast_route\n"
            "try:\n    fast_route.load().takes(torch.zeros(1))\nexcept RuntimeError as e:\n    print('refused:', e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: takes: configure() was not called" in done.stdout, done.stdout + done.stderr
