"""tunekit.silu and silu_backward: every candidate against a float64 reference, the public API's semantics,
autograd, tuning on real data."""

import sys

import pytest
import torch
import torch.nn.functional as F

import tunekit
from elementwise_checks import (DTYPES, Form, assert_same_outcome, candidate_cases, check_candidate,
                                check_candidate_on_awkward_inputs, layout_cases, outcome, twice)
from tunekit.ops.silu import SiluBackwardParams, SiluFunction, SiluParams, silu_backward_op, silu_op
from tunekit.tunable import results_store, tuning
from tunekit.tunable.numerics import compare, tolerance

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

FORMS = [
    Form("silu", silu_op, lambda ts, out: SiluParams(ts[0], out), F.silu),
    Form("silu_backward", silu_backward_op, lambda ts, out: SiluBackwardParams(ts[0], ts[1], out),
         torch.ops.aten.silu_backward, n_inputs=2),
]


def reference(x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return (x64 * torch.sigmoid(x64)).to(x.dtype)


def check(actual, x):
    """Within the dtype's tolerance of the float64 result rounded to the dtype."""
    rtol, atol = tolerance(x.dtype)
    problem = compare(actual, reference(x), (rtol * 1.5, atol))
    assert problem is None, problem


def inputs(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dtype)


@pytest.mark.parametrize("form, name, dtype, device, shape", candidate_cases(FORMS))
def test_every_candidate_matches_float64(form, name, dtype, device, shape):
    check_candidate(form, name, dtype, device, shape)


@pytest.mark.parametrize("form, name, dtype, device", layout_cases(FORMS))
def test_every_candidate_on_awkward_layouts_and_values(form, name, dtype, device):
    check_candidate_on_awkward_inputs(form, name, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_public_silu_tunes_and_matches_torch(dtype, device):
    x = inputs((257, 129), dtype, device)
    y = tunekit.silu(x)
    check(y, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, F.silu(x), **dict(zip(("rtol", "atol"), tolerance(dtype))))
    assert len(results_store().entries("silu")) == 1
    assert tunekit.swish is tunekit.silu


@pytest.mark.parametrize("device", DEVICES)
def test_out_and_inplace(device):
    x = inputs((1000,), torch.float32, device)
    out = torch.full_like(x, float("nan"))
    assert tunekit.silu(x, out=out) is out
    check(out, x)
    y = x.clone()
    r = tunekit.silu(y, inplace=True)
    assert r.data_ptr() == y.data_ptr()
    check(y, x)


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_tuning_changes_user_data_exactly_once(device):
    x = inputs((4096,), torch.float16, device)
    expected = F.silu(x.clone())
    with tuning(max_tuning_ms=200):
        tunekit.silu(x, inplace=True)
    assert len(results_store().entries("silu")) == 1  # it did tune
    torch.testing.assert_close(x, expected, **dict(zip(("rtol", "atol"), tolerance(torch.float16))))


def test_inplace_matches_an_untuned_call_bit_for_bit():
    x = inputs((3000,), torch.float32, "cpu")
    a, b = x.clone(), x.clone()
    with tuning(tuning=False):
        tunekit.silu(a, inplace=True)
    with tuning(results=":memory:"):
        tunekit.silu(b, inplace=True)
    tuned_choice = silu_op.resolve(SiluParams(b, b)).candidate.name
    if tuned_choice == "torch_silu":
        assert torch.equal(a, b)
    else:
        check(b, x)


def test_view_of_x_as_out_is_an_inplace_call():
    x = inputs((100,), torch.float32, "cpu")
    expected = reference(x)
    result = tunekit.silu(x, out=x.view(100))
    assert result.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cached_call_runs_the_choices_runner_without_params(dtype, device, monkeypatch):
    """The public function's fast path: after the first call, a call of the same key goes straight
    to the choice's runner (no params, no tunable-op call) when the choice offers one."""
    x = inputs((257, 129), dtype, device)
    tunekit.silu(x)
    chosen = silu_op.resolve(SiluParams(x)).candidate
    has_runner = chosen.fast_runner is not None and chosen.fast_runner(SiluParams(x)) is not None
    module = sys.modules["tunekit.ops.silu"]
    calls = []
    monkeypatch.setattr(module, "_silu_call", lambda p: calls.append(p) or silu_op.call(p))
    fresh = inputs((257, 129), dtype, device)  # another tensor of the same key
    check(tunekit.silu(fresh), fresh)
    assert len(calls) == (0 if has_runner else 1), chosen.name
    check(tunekit.silu(fresh.t()), fresh.t())  # not contiguous: the params path
    assert len(calls) == (1 if has_runner else 2)


def torch_silu(input, inplace=False, *, out=None):
    """torch's functions for tunekit.silu's forms: ``F.silu``, and ``torch._C._nn.silu`` for ``out=``."""
    return F.silu(input, inplace) if out is None else torch._C._nn.silu(input, out=out)


def _silu_forms():
    """name -> a function making fresh (args, kwargs) for one call (each side gets its own)."""
    x = lambda: torch.randn(10)  # noqa: E731
    overlapping = lambda: (lambda buf: ((buf[:6],), {"out": buf[3:9]}))(torch.randn(10))  # noqa: E731
    return {
        "integer": lambda: ((torch.arange(10),), {}),
        "bool": lambda: ((torch.ones(3, dtype=torch.bool),), {}),
        "complex": lambda: ((torch.randn(10, dtype=torch.complex64),), {}),
        "complex-inplace": lambda: ((torch.randn(10, dtype=torch.complex64), True), {}),
        "not-a-tensor": lambda: (([1.0, 2.0],), {}),
        "positional-inplace": lambda: ((x(), True), {}),
        "truthy-inplace": lambda: ((x(),), {"inplace": 1}),
        "input-keyword": lambda: ((), {"input": x()}),
        "out-of-another-shape": lambda: ((x(),), {"out": torch.full((11,), float("nan"))}),
        "empty-out": lambda: ((x(),), {"out": torch.empty(0)}),
        "out-of-another-dtype": lambda: ((x(),), {"out": torch.empty(10, dtype=torch.float64)}),
        "expanded-out": lambda: ((x(),), {"out": torch.empty(1).expand(10)}),
        "overlapping-out": overlapping,
        "inplace-on-expanded": lambda: ((torch.ones(1).expand(10),), {"inplace": True}),
        "out-with-grad": lambda: ((x().requires_grad_(),), {"out": torch.empty(10)}),
        "meta": lambda: ((torch.randn(10, device="meta"),), {}),
        "float64-out": lambda: ((x().double(),), {"out": torch.full((10,), float("nan"), dtype=torch.float64)}),
    }


@pytest.mark.parametrize("form", list(_silu_forms()))
def test_torch_forms_give_torchs_result_warning_or_exception_type(form):
    """Whatever torch does with a call, tunekit.silu does: its value, its resize warning, its
    exception type (tunekit hands the forms it does not compute to torch's own function)."""
    make = _silu_forms()[form]
    (targs, tkwargs), (args, kwargs) = twice(make)
    theirs = outcome(torch_silu, *targs, **tkwargs)
    ours = outcome(tunekit.silu, *args, **kwargs)
    assert_same_outcome(ours, theirs, tolerance(torch.float32), form)
    if "out" in kwargs and ours.error is None:
        assert ours.returned is kwargs["out"]  # torch's out= returns out itself


def test_out_together_with_inplace_is_refused():
    x = torch.randn(10)
    with pytest.raises(ValueError, match="either out= or inplace"):
        tunekit.silu(x, out=torch.empty(10), inplace=True)
    with pytest.raises(ValueError, match="either out= or inplace"):
        tunekit.silu(torch.arange(3), True, out=torch.empty(3))


def test_make_params_refuses_what_the_public_function_leaves_to_torch():
    """``tunekit.explain`` / offline tuning build params directly: no torch function to fall back on."""
    from tunekit.ops.silu import make_params
    x = torch.randn(10)
    with pytest.raises(TypeError, match="floating-point"):
        make_params(torch.arange(10))
    with pytest.raises(ValueError, match="out must be"):
        make_params(x, out=torch.empty(11))
    buf = torch.randn(20)
    with pytest.raises(ValueError, match="partially overlaps"):
        make_params(buf[:10], out=buf[5:15])
    with pytest.raises(ValueError, match="overlapping elements"):
        make_params(x, out=torch.empty(1).expand(10))
    assert make_params(x, out=x.view(10)).out is x


def test_float64_runs_the_default_correctly():
    x = torch.randn(100, dtype=torch.float64)
    torch.testing.assert_close(tunekit.silu(x), x * torch.sigmoid(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
def test_gradients_match_float64_torch(dtype, device):
    x = inputs((37, 65), dtype, device).requires_grad_()
    dy = inputs((37, 65), dtype, device, scale=1.0)
    y = SiluFunction.apply(x)  # tunekit's tuned backward (tunekit.silu records torch's node: test_grad_call.py)
    assert "SiluFunction" in y.grad_fn.name()
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    F.silu(x64).backward(dy.double())
    rtol, atol = tolerance(dtype)
    problem = compare(x.grad, x64.grad.to(dtype), (rtol * 1.5, atol))
    assert problem is None, problem
    assert len(results_store().entries("silu_backward")) == 1  # the backward was tuned too


def test_gradcheck_in_float64_and_double_backward():
    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tunekit.silu, (x,))
    assert torch.autograd.gradgradcheck(tunekit.silu, (x,))
    dy = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tunekit.silu_backward, (dy, x))


def test_autograd_with_out_or_inplace_keeps_torch_rules():
    leaf = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError):
        tunekit.silu(leaf, inplace=True)  # as F.silu: a leaf that needs grad cannot be changed in place
    a = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = a * 1.0
    tunekit.silu(b, inplace=True).sum().backward()
    s = torch.sigmoid(a.detach())
    torch.testing.assert_close(a.grad, s * (1 + a.detach() * (1 - s)))
    with torch.no_grad():
        y = tunekit.silu(a)
    assert y.grad_fn is None


def test_silu_backward_checks_its_arguments():
    with pytest.raises(ValueError, match="one shape"):
        tunekit.silu_backward(torch.randn(3), torch.randn(4))
    with pytest.raises(TypeError, match="floating-point"):
        tunekit.silu_backward(torch.arange(3), torch.randn(3))
    dy = torch.randn(5, 7).t()  # non-contiguous: the default runs it
    x = torch.randn(7, 5)
    torch.testing.assert_close(tunekit.silu_backward(dy, x), torch.ops.aten.silu_backward(dy, x))


def test_an_expanded_gradient_runs_correctly():
    x = torch.randn(300, dtype=torch.float64, requires_grad=True)
    tunekit.silu(x).sum().backward()  # dy is a stride-0 expansion of one element
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(x.grad, s * (1 + x.detach() * (1 - s)))
    assert SiluFunction is not None


@pytest.mark.gpu
def test_vector_kernels_decline_misaligned_pointers_and_scalar_ones_take_them(cuda):
    x = inputs((4096,), torch.float16, cuda)[1:]
    p = SiluParams(x)
    assert "16-byte aligned" in silu_op.candidate("silu_f16x8_pack").supports(p)
    assert "4-byte aligned" in silu_op.candidate("silu_f16x2").supports(p)
    assert silu_op.candidate("silu_f16").supports(p) is None
    assert "float16 only" in silu_op.candidate("silu_f16").supports(SiluParams(x.float()))


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements(cuda):
    n = 2**31 + 9
    x = torch.empty(n, dtype=torch.float16, device=cuda)
    x[-4096:] = inputs((4096,), torch.float16, cuda)
    x[:4096] = inputs((4096,), torch.float16, cuda)
    for name in ("silu_f16x8_pack", "silu_f16", "silu_f16x8_pack_x4", "silu_f16x8_pack_x2_persistent"):
        out = torch.full_like(x, float("nan"))
        silu_op.candidate(name).run(SiluParams(x, out))
        for sl in (slice(0, 4096), slice(n - 4096, n)):
            check(out[sl], x[sl])
        del out
