"""tunekit.nn.SiLU / GELU: torch's modules in every way one can look at a module, tunekit's forward
(checked against float64 and torch, with gradients), torch's forward for what tunekit does not take."""

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F

import tunekit
from op_spies import CandidateRuns
from tunekit.backends import fast_grad
from tunekit.tunable.numerics import tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MODULES = [  # (tunekit module, the torch module it replaces, the float64 reference)
    (lambda: tunekit.nn.SiLU(), lambda: torch.nn.SiLU(), lambda x: x * torch.sigmoid(x)),
    (lambda: tunekit.nn.GELU(), lambda: torch.nn.GELU(), lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))),
    (lambda: tunekit.nn.GELU("tanh"), lambda: torch.nn.GELU(approximate="tanh"),
     lambda x: 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))),
]
IDS = ["silu", "gelu", "gelu_tanh"]


@pytest.fixture
def runs(monkeypatch):
    spies = CandidateRuns(monkeypatch, "silu", "gelu", "silu_backward", "gelu_backward")
    yield spies
    spies.close()


def rand(shape, dtype, requires_grad=False):
    return (torch.randn(shape) * 3).to(dtype).requires_grad_(requires_grad)


def assert_close(actual, expected, dtype, gelu=False):
    rtol, atol = tolerance(dtype)
    if gelu and dtype == torch.float32:
        atol = 8e-6  # tunekit's gelu float32 tolerance (tunekit/ops/gelu.py says why)
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=2 * rtol, atol=2 * atol)


def op_of(module) -> str:
    return "silu" if isinstance(module, torch.nn.SiLU) else "gelu"


# -- the module as torch sees it ----------------------------------------------------------------
@pytest.mark.parametrize("make, make_torch, _", MODULES, ids=IDS)
def test_modules_look_like_torchs(make, make_torch, _):
    m, t = make(), make_torch()
    assert isinstance(m, type(t)) and isinstance(m, torch.nn.Module)
    assert repr(m) == repr(t) and m.extra_repr() == t.extra_repr()
    assert m.state_dict() == t.state_dict() == {}
    m.load_state_dict(t.state_dict())
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(clone) is type(m) and repr(clone) == repr(m)
    buffer = io.BytesIO()
    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 3), m), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded[1]) is type(m) and repr(loaded) == repr(torch.nn.Sequential(torch.nn.Linear(3, 3), t))


def test_constructor_arguments_are_torchs():
    assert tunekit.nn.SiLU(True).inplace and tunekit.nn.SiLU(inplace=True).inplace and not tunekit.nn.SiLU().inplace
    assert repr(tunekit.nn.SiLU(inplace=True)) == repr(torch.nn.SiLU(inplace=True)) == "SiLU(inplace=True)"
    assert tunekit.nn.GELU("tanh").approximate == tunekit.nn.GELU(approximate="tanh").approximate == "tanh"
    assert repr(tunekit.nn.GELU(inplace=True)) == "GELU(approximate='none', inplace=True)"
    with pytest.raises(TypeError):
        tunekit.nn.GELU("tanh", True)  # inplace is keyword-only: torch's positional form stays unambiguous


# -- forward and backward go through tunekit ------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make, make_torch, reference", MODULES, ids=IDS)
def test_forward_runs_tunekit_and_matches_float64(make, make_torch, reference, dtype, runs):
    m = make()
    x = rand((33, 130), dtype)
    with tunekit.tuning(tuning=False):
        y = m(x)
    assert runs.counts()[op_of(m)] == 1 and sum(runs.counts().values()) == 1
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, reference(x.double()), dtype, gelu=op_of(m) == "gelu")
    assert_close(m(x), make_torch()(x), dtype, gelu=op_of(m) == "gelu")  # tuning on: whichever candidate wins


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make, make_torch, reference", MODULES, ids=IDS)
def test_gradients_through_the_modules(make, make_torch, reference, dtype, runs):
    m, t = make(), make_torch()
    x = rand((21, 64), dtype, requires_grad=True)
    dy = torch.randn(21, 64).to(dtype)
    (dx_torch,) = torch.autograd.grad(t(x), x, dy)
    x64 = x.detach().double().requires_grad_()
    (dx64,) = torch.autograd.grad(reference(x64), x64, dy.double())
    with tunekit.tuning(tuning=False):
        y = m(x)
        (dx,) = torch.autograd.grad(y, x, dy)
    # torch's own node from C++ (ops/_shared/grad_call.py; conftest builds it), else tunekit's Function
    taken = fast_grad.load() is not None
    assert runs.count(op_of(m) + "_backward") == (0 if taken else 1)
    assert ("Backward0" if taken else "Function") in y.grad_fn.name()
    assert_close(dx, dx_torch, dtype, gelu=op_of(m) == "gelu")
    assert_close(dx, dx64, dtype, gelu=op_of(m) == "gelu")


def test_in_place_modules_write_into_their_input_and_keep_autograd(runs):
    x = rand((17, 40), torch.float32)
    for module, want in ((tunekit.nn.SiLU(inplace=True), F.silu(x)),
                         (tunekit.nn.GELU("tanh", inplace=True), F.gelu(x, approximate="tanh"))):
        a = x.clone()
        with tunekit.tuning(tuning=False):
            out = module(a)
        assert out.data_ptr() == a.data_ptr()
        assert_close(a, want, torch.float32, gelu=True)
    assert runs.count("silu") == 1 and runs.count("gelu") == 1
    # in place on an intermediate under autograd: torch's kernel and rules, the same gradients
    w = torch.randn(40, 40, requires_grad=True)
    x = rand((8, 40), torch.float32)
    grads = []
    for act in (tunekit.nn.SiLU(inplace=True), torch.nn.SiLU(inplace=True)):
        act(x @ w).sum().backward()
        grads.append(w.grad)
        w.grad = None
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_a_model_of_tunekit_modules_trains_like_torchs(runs):
    torch.manual_seed(0)
    make = lambda act: torch.nn.Sequential(torch.nn.Linear(16, 32), act, torch.nn.Linear(32, 8))  # noqa: E731
    ours = make(tunekit.nn.GELU("tanh"))
    theirs = copy.deepcopy(ours)
    theirs[1] = torch.nn.GELU("tanh")
    x = torch.randn(64, 16)
    for model in (ours, theirs):
        model(x).square().mean().backward()
    assert runs.count("gelu") >= 1  # the backward: torch's node (ops/_shared/grad_call.py), else tunekit's
    assert runs.count("gelu_backward") == 0 if fast_grad.load() is not None else runs.count("gelu_backward") >= 1
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-5, atol=1e-6)


# -- what tunekit does not take runs torch's forward --------------------------------------------
class Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize("make, make_torch, _", MODULES, ids=IDS)
def test_inputs_tunekit_does_not_take_run_torchs_forward(make, make_torch, _, runs):
    m, t = make(), make_torch()
    x = rand((6, 5), torch.float32)
    sub = x.as_subclass(Subclass)
    y = m(sub)
    assert type(y) is Subclass and torch.equal(y, t(sub))
    ints = torch.randint(-3, 3, (4,))
    with pytest.raises(RuntimeError) as from_torch:
        t(ints)
    with pytest.raises(RuntimeError) as from_ours:
        m(ints)
    assert str(from_ours.value) == str(from_torch.value)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), t(x))
    assert runs.counts() == {"silu": 0, "gelu": 0, "silu_backward": 0, "gelu_backward": 0}


def test_gelu_in_place_fallback_uses_torchs_in_place_kernel(runs):
    x = rand((5, 7), torch.float32)
    sub = x.clone().as_subclass(Subclass)
    out = tunekit.nn.GELU(inplace=True)(sub)
    assert out.data_ptr() == sub.data_ptr() and runs.count("gelu") == 0
    assert torch.equal(sub.as_subclass(torch.Tensor), F.gelu(x))
