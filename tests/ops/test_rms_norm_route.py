"""rms_norm's route to torch's own function (``ops/rms_norm/route.py``, form 6 of ``backends/fast_gemm.cpp``):
a call that needs gradients, once torch's kernel is its decided choice, goes to ``at::rms_norm`` from C++
with torch's values and autograd node; every call the public function would not hand to torch's kernel
is refused (None), and the table goes with the op's choices."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tunekit
from tunekit.ops.rms_norm import route
from tunekit.ops.rms_norm.op import rms_norm_op


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def routed(request):
    """A 4 x 64 float32 call whose decided choice is torch's kernel, its layout routed (on the CPU,
    and on CUDA, where at::rms_norm is torch's fused kernel, as F.rms_norm dispatches)."""
    if not route.ready():
        pytest.skip("the C++ route extension cannot be built here")
    x = torch.randn(4, 64, device=request.param, requires_grad=True)
    w = (torch.rand(64, device=request.param) + 0.5).requires_grad_()
    with tunekit.tuning(tuning=False):  # the default, torch's kernel, decided at the first call
        tunekit.rms_norm(x, (64,), w, 1e-6)
        assert route.routed_keys() == {}  # the first call decides (through the Function), the second learns
        tunekit.rms_norm(x, (64,), w, 1e-6)
        assert len(route.routed_keys()) == 1
        yield x, w


def test_a_routed_call_gives_torchs_values_node_and_gradients(routed):
    x, w = routed
    y = route.call(x, (64,), w, 1e-6)
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    expected = F.rms_norm(xt, (64,), wt, 1e-6)
    assert y is not None and torch.equal(y, expected) and type(y.grad_fn) is type(expected.grad_fn)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(expected, (xt, wt), dy)):
        torch.testing.assert_close(got, want)
    assert torch.equal(tunekit.rms_norm(x, [64], w, 1e-6), expected)  # the public function takes the route
    assert route.call(x, torch.Size([64]), w, None) is not None  # eps None: torch's default


def test_calls_the_public_function_would_not_route_are_refused(routed):
    x, w = routed
    assert route.call(x, 64, w, 1e-6) is None  # a bare int: torch's own error or result
    assert route.call(x, (4, 64), w, 1e-6) is None  # normalized_shape not the weight's
    assert route.call(x, (64,), w, 1) is None  # an int eps
    assert route.call(x, (64,), w, float("nan")) is not None  # a float eps of any value: torch's math
    assert route.call(x.detach(), (64,), w.detach(), 1e-6) is None  # no gradients: another layout, not learned
    assert route.call(x.double(), (64,), w.double(), 1e-6) is None  # float64: not a routed dtype
    assert route.call(x, (64,), w.half(), 1e-6) is None  # a weight of another dtype
    assert route.call(x[:, :32], (32,), w[:32], 1e-6) is None  # another layout
    with tunekit.tuning(enabled=False):
        assert route.call(x, (64,), w, 1e-6) is None
    with TorchFunctionMode():
        assert route.call(x, (64,), w, 1e-6) is None


def test_the_table_goes_with_the_ops_choices(routed):
    x, w = routed
    rms_norm_op.forget()
    assert route.routed_keys() == {} and route.call(x, (64,), w, 1e-6) is None
