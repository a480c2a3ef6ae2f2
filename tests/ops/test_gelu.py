"""tunekit.gelu and gelu_backward, both forms: every candidate against a float64 reference, the public
API's semantics, autograd, tuning on real data."""

import sys

import pytest
import torch
import torch.nn.functional as F

import tunekit
from elementwise_checks import (DTYPES, SPECIAL, Form, assert_same_outcome, candidate_cases, check_candidate,
                                check_candidate_on_awkward_inputs, layout_cases, outcome, twice)
from tunekit.ops._shared.cuda_elementwise import CudaElementwise
from tunekit.ops.gelu import GeluBackwardParams, GeluFunction, GeluParams, gelu_backward_op, gelu_op, gelu_tolerance
from tunekit.tunable import results_store
from tunekit.tunable.numerics import compare

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
APPROXIMATE = ["none", "tanh"]


def _forms(a):
    return [
        Form(f"gelu[{a}]", gelu_op, lambda ts, out: GeluParams(ts[0], a, out),
             lambda x: F.gelu(x, approximate=a), arguments={"approximate": a}),
        Form(f"gelu_backward[{a}]", gelu_backward_op, lambda ts, out: GeluBackwardParams(ts[0], ts[1], a, out),
             lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate=a), n_inputs=2,
             arguments={"approximate": a}),
    ]


FORMS = _forms("none") + _forms("tanh")


def close(actual, expected, dtype):
    rtol, atol = gelu_tolerance(GeluParams(torch.empty(0, dtype=dtype)))
    problem = compare(actual, expected.to(dtype), (rtol * 1.5, atol))
    assert problem is None, problem


@pytest.mark.parametrize("form, name, dtype, device, shape", candidate_cases(FORMS))
def test_every_candidate_matches_float64(form, name, dtype, device, shape):
    check_candidate(form, name, dtype, device, shape)


@pytest.mark.parametrize("form, name, dtype, device", layout_cases(FORMS))
def test_every_candidate_on_awkward_layouts_and_values(form, name, dtype, device):
    special = SPECIAL
    if name == "torch_gelu" and device == "cpu" and "none" in form.label:
        special = [v for v in SPECIAL if abs(v) != float("inf")]  # torch CPU: gelu(+inf) = NaN (see below)
    check_candidate_on_awkward_inputs(form, name, dtype, device, special)


def test_torch_cpu_gelu_of_inf_is_nan():
    """A known PyTorch deviation, kept visible: its vectorised CPU erf makes gelu(+inf) NaN in
    float32 and bfloat16 (float64 and CUDA give +inf, as do tunekit's kernels, tested above)."""
    x = torch.tensor([float("inf")] * 9)
    assert torch.isnan(F.gelu(x)).all()  # if torch fixes it, drop the exception above
    assert torch.isinf(F.gelu(x.double())).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, lowest", [(torch.float16, -5.5), (torch.bfloat16, -12.5)])
def test_every_16_bit_erf_candidate_is_within_an_ulp_in_the_far_tail(cuda, dtype, lowest):
    """The CUDA C kernels' claim: x Phi(x) for x < -3 is Phi's tail scaled, so an approximation with a
    small absolute but large relative error there (Abramowitz & Stegun 7.1.26: 2% at x = -10,
    several bfloat16 ulps) shows here and not under the shared tolerance, whose atol absorbs these
    small values. (torch's and the Triton kernels' 0.5 x (1 + erf(x / sqrt 2)) in fp32 cancel to 0
    beyond x ~ -5.9 and are several ulps off from x ~ -4.5: within that atol, not within an ulp.)
    Below x ~ -12.9 Phi(x) is an fp32 subnormal, which the kernels flush: 0, like torch's."""
    x = (torch.rand(1 << 16, device=cuda, dtype=torch.float64) * (lowest + 3) - 3).to(dtype)
    # F.gelu and torch.special.ndtr in float64 cancel to 0 beyond x ~ -8.3; log_ndtr does not
    exact = x.double() * torch.special.log_ndtr(x.double()).exp()
    rounded = exact.to(dtype)
    ulp = (torch.nextafter(rounded.abs(), torch.full_like(rounded, float("inf"))) - rounded.abs()).double()
    params = GeluParams(x, "none")
    checked = []
    for c in gelu_op.candidates:
        if not isinstance(c, CudaElementwise) or c.supports(params) is not None:
            continue
        out = c.run(GeluParams(x, "none", torch.full_like(x, float("nan"))))
        worst = ((out.double() - exact).abs() / ulp).max().item()
        assert worst <= 1.0, f"{c.name}: {worst:.2f} ulp"
        checked.append(c.name)
    assert f"gelu_{'f16' if dtype == torch.float16 else 'bf16'}x8_pack" in checked, checked


def test_each_cuda_form_declines_the_other_approximation():
    x = torch.randn(16)
    assert "approximate='none' only" in gelu_op.candidate("gelu_f32x4").supports(GeluParams(x, "tanh"))
    assert "approximate='tanh' only" in gelu_op.candidate("gelu_tanh_f32x4").supports(GeluParams(x, "none"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_public_gelu_tunes_and_matches_torch(approximate, dtype, device):
    x = (torch.randn(257, 129, device=device) * 3).to(dtype)
    y = tunekit.gelu(x, approximate=approximate)
    assert y.shape == x.shape and y.dtype == x.dtype
    close(y, F.gelu(x.double(), approximate=approximate), dtype)
    entries = results_store().entries("gelu")
    assert len(entries) == 1 and f"approximate={approximate}" in entries[0].signature


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cached_call_runs_the_runner_of_its_own_approximation(dtype, device, monkeypatch):
    """The fast path keys on ``approximate`` too: each form gets its own choice's runner."""
    x = (torch.randn(257, 129, device=device) * 3).to(dtype)
    module = sys.modules["tunekit.ops.gelu.op"]
    expected_calls = 0
    for approximate in APPROXIMATE:
        tunekit.gelu(x, approximate=approximate)
        chosen = gelu_op.resolve(GeluParams(x, approximate)).candidate
        has_runner = chosen.fast_runner is not None and chosen.fast_runner(GeluParams(x, approximate)) is not None
        expected_calls += 0 if has_runner else 1
    calls = []
    monkeypatch.setattr(module, "_gelu_call", lambda p: calls.append(p) or gelu_op.call(p))
    for approximate in APPROXIMATE:
        close(tunekit.gelu(x, approximate=approximate), F.gelu(x.double(), approximate=approximate), dtype)
    assert len(calls) == expected_calls


def test_the_fast_path_never_mixes_the_two_forms():
    x = torch.randn(4096) * 3
    for first, second in (("none", "tanh"), ("tanh", "none")):
        gelu_op.forget()
        tunekit.gelu(x, approximate=first)
        tunekit.gelu(x, approximate=first)  # its runner is cached
        close(tunekit.gelu(x, approximate=second), F.gelu(x.double(), approximate=second), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_out_and_inplace(approximate, device):
    x = torch.randn(1000, device=device) * 3
    expected = F.gelu(x.double(), approximate=approximate)
    out = torch.full_like(x, float("nan"))
    assert tunekit.gelu(x, approximate=approximate, out=out) is out
    close(out, expected, x.dtype)
    y = x.clone()
    assert tunekit.gelu(y, approximate=approximate, inplace=True).data_ptr() == y.data_ptr()
    close(y, expected, x.dtype)


def test_tanh_form_has_no_nan_for_large_inputs():
    """The seed's fp16 tanh GELU overflowed to NaN for x > ~4: every candidate here computes in fp32."""
    x = torch.tensor([4.0, 5.0, 8.0, 10.0, 20.0, 65504.0, -65504.0], dtype=torch.float16)
    y = tunekit.gelu(x, approximate="tanh")
    assert not torch.isnan(y).any()
    close(y, F.gelu(x.double(), approximate="tanh"), torch.float16)


def _gelu_forms():
    """name -> a function making fresh (args, kwargs) of one call of ``F.gelu`` / ``tunekit.gelu``."""
    x = lambda: torch.randn(10) * 3  # noqa: E731
    return {
        "positional-approximate": lambda: ((x(), "tanh"), {}),
        "unknown-approximate": lambda: ((x(),), {"approximate": "fast"}),
        "approximate-none-object": lambda: ((x(),), {"approximate": None}),
        "integer": lambda: ((torch.arange(10),), {}),
        "integer-tanh": lambda: ((torch.arange(10),), {"approximate": "tanh"}),
        "complex": lambda: ((torch.randn(10, dtype=torch.complex64),), {}),
        "input-keyword": lambda: ((), {"input": x(), "approximate": "tanh"}),
        "out": lambda: ((x(),), {"approximate": "tanh", "out": torch.full((10,), float("nan"))}),
        "out-of-another-shape": lambda: ((x(),), {"out": torch.full((3, 4), float("nan"))}),
        "empty-out": lambda: ((x(),), {"out": torch.empty(0)}),
        "out-of-another-dtype": lambda: ((x(),), {"out": torch.empty(10, dtype=torch.float16)}),
        "expanded-out": lambda: ((x(),), {"out": torch.empty(1).expand(10)}),
        "overlapping-out": lambda: (lambda buf: ((buf[:6],), {"out": buf[2:8]}))(torch.randn(10)),
        "out-is-input": lambda: (lambda t: ((t,), {"out": t}))(x()),
        "out-with-grad": lambda: ((x().requires_grad_(),), {"out": torch.empty(10)}),
        "meta": lambda: ((torch.randn(10, device="meta"),), {"approximate": "tanh"}),
    }


@pytest.mark.parametrize("form", list(_gelu_forms()))
def test_torch_forms_give_torchs_result_warning_or_exception_type(form):
    """Whatever ``F.gelu`` does with a call, tunekit.gelu does (tunekit hands the forms it does not
    compute to torch's own function): its value, its resize warning, its exception type."""
    (targs, tkwargs), (args, kwargs) = twice(_gelu_forms()[form])
    theirs = outcome(F.gelu, *targs, **tkwargs)
    ours = outcome(tunekit.gelu, *args, **kwargs)
    assert_same_outcome(ours, theirs, gelu_tolerance(GeluParams(torch.empty(0))), form)
    if "out" in kwargs and ours.error is None:
        assert ours.returned is kwargs["out"]


@pytest.mark.parametrize("approximate", [*APPROXIMATE, "fast"])
def test_inplace_is_torchs_gelu_(approximate):
    (t,), (ours,) = twice(lambda: (torch.randn(50) * 3,))
    theirs = outcome(torch._C._nn.gelu_, t, approximate=approximate)
    mine = outcome(tunekit.gelu, ours, approximate=approximate, inplace=True)
    assert_same_outcome(mine, theirs, gelu_tolerance(GeluParams(t)), approximate)
    if mine.error is None:
        assert mine.returned is ours
        close(ours, t, t.dtype)
    with pytest.raises(RuntimeError):  # torch's error for in place on an expanded tensor
        tunekit.gelu(torch.ones(1).expand(4), approximate=approximate, inplace=True)
    with pytest.raises(ValueError, match="either out= or inplace"):
        tunekit.gelu(t, approximate=approximate, inplace=True, out=torch.empty(50))


def test_gelu_backward_and_make_params_check_their_arguments():
    x = torch.randn(10)
    with pytest.raises(ValueError, match="approximate must be"):
        tunekit.gelu_backward(x, x, "sigmoid")
    with pytest.raises(ValueError, match="one shape"):
        tunekit.gelu_backward(torch.randn(3), torch.randn(4))
    from tunekit.ops.gelu.op import make_params
    with pytest.raises(ValueError, match="approximate must be"):
        make_params(x, "fast")
    with pytest.raises(ValueError, match="out must be"):
        make_params(x, out=torch.empty(11))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_gradients_match_float64_torch(approximate, dtype, device):
    x = (torch.randn(37, 65, device=device) * 3).to(dtype).requires_grad_()
    dy = torch.randn(37, 65, device=device).to(dtype)
    y = GeluFunction.apply(x, approximate)  # the tuned backward (tunekit.gelu records torch's node: test_grad_call.py)
    assert "GeluFunction" in y.grad_fn.name()
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    F.gelu(x64, approximate=approximate).backward(dy.double())
    close(x.grad, x64.grad, dtype)
    assert len(results_store().entries("gelu_backward")) == 1


@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_gradcheck_in_float64_and_double_backward(approximate):
    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    fn = lambda t: tunekit.gelu(t, approximate=approximate)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))
    dy = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: tunekit.gelu_backward(a, b, approximate), (dy, x))
    assert GeluFunction is not None


def test_no_grad_and_non_contiguous_run_the_right_thing():
    x = torch.randn(64, 33, requires_grad=True)
    with torch.no_grad():
        y = tunekit.gelu(x.t())
    assert y.grad_fn is None
    torch.testing.assert_close(y, F.gelu(x.detach().t()))
    assert y.stride() == F.gelu(x.detach().t()).stride()  # torch's memory format rules
