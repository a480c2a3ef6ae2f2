"""GEMM calls tuned to torch's own kernels go to torch's own function (``ops/gemm/routes.py``,
``backends/fast_gemm.cpp``): when they are routed, what the key tells apart, and that a routed call is
torch's call (result, autograd node, gradients), while everything else stays on tunekit's path."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tunekit
from tunekit.ops.gemm import addmm_op, functions, mm_op, routes
from tunekit.tunable.entries import CandidateRecord, Entry

pytestmark = pytest.mark.skipif(not routes.ready(), reason="the C++ GEMM routes could not be built here")

CALLS = {  # form: (tunekit's function, torch's, operands of shapes that fold)
    "linear": (tunekit.linear, F.linear, lambda: (torch.randn(5, 7), torch.randn(3, 7), torch.randn(3))),
    "mm": (tunekit.mm, torch.mm, lambda: (torch.randn(5, 7), torch.randn(7, 3))),
    "addmm": (tunekit.addmm, torch.addmm, lambda: (torch.randn(5, 3), torch.randn(5, 7), torch.randn(7, 3))),
    "bmm": (tunekit.bmm, torch.bmm, lambda: (torch.randn(2, 5, 7), torch.randn(2, 7, 3))),
    "baddbmm": (tunekit.baddbmm, torch.baddbmm, lambda: (torch.randn(3), torch.randn(2, 5, 7), torch.randn(2, 7, 3))),
    "matmul": (tunekit.matmul, torch.matmul, lambda: (torch.randn(2, 5, 7), torch.randn(7, 3))),
}


@pytest.fixture
def general_calls(monkeypatch):
    """How many calls took tunekit's general path (its ``_product``, where every taken GEMM goes)."""
    calls = []
    product = functions._product

    def counted(*args, **kwargs):
        calls.append(args)
        return product(*args, **kwargs)
    monkeypatch.setattr(functions, "_product", counted)
    return calls


@pytest.mark.parametrize("form", list(CALLS))
def test_a_call_decided_for_torch_kernels_is_routed_to_torch_from_its_second_call(form, general_calls):
    ours, theirs, make = CALLS[form]
    operands = make()
    first = ours(*operands)
    assert len(general_calls) == 1 and list(routes.routed_keys().values()) == [True]
    for _ in range(3):
        again = ours(*operands)
    assert len(general_calls) == 1  # routed: tunekit's path never ran again
    assert torch.equal(again, theirs(*operands)) and torch.equal(first, again)
    assert getattr(routes, form).key(*operands) in routes.routed_keys()


def test_a_routed_call_under_autograd_is_torchs_call_once_its_backward_gemms_are_decided(general_calls):
    x, w, b = (torch.randn(5, 7, requires_grad=True), torch.randn(3, 7, requires_grad=True),
               torch.randn(3, requires_grad=True))
    dy = torch.randn(5, 3)
    y = tunekit.linear(x, w, b)
    assert type(y.grad_fn).__name__ == "GemmFunctionBackward" and routes.routed_keys() == {}  # backward not run
    y.backward(dy)
    tunekit.linear(x, w, b).backward(dy)  # 2nd call: looked at again, now with the backward's GEMMs decided
    assert list(routes.routed_keys().values()) == [True]
    for t in (x, w, b):
        t.grad = None
    y = tunekit.linear(x, w, b)
    assert type(y.grad_fn).__name__ == "AddmmBackward0" and len(general_calls) == 2  # torch's own node
    y.backward(dy)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    F.linear(xr, wr, br).backward(dy)
    for got, expected in ((x, xr), (w, wr), (b, br)):
        assert torch.equal(got.grad, expected.grad)


def test_grad_mode_and_which_operands_require_grad_are_part_of_the_key():
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    wg = w.clone().requires_grad_()
    keys = {routes.linear.key(x, w, None), routes.linear.key(x, wg, None)}
    with torch.no_grad():
        keys.add(routes.linear.key(x, wg, None))  # under no_grad: as a weight without grad
    assert len(keys) == 2 and routes.linear.key(x, w, None) == routes.linear.key(x, wg.detach(), None)


@pytest.mark.parametrize("other", ["transposed", "sliced", "misaligned", "float16", "bias", "tf32", "deterministic"])
def test_the_key_tells_apart_every_layout_and_setting_a_signature_does(other, monkeypatch):
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    base = routes.linear.key(x, w, None)
    if other == "transposed":
        key = routes.linear.key(x, w.t().contiguous().t(), None)
    elif other == "sliced":
        key = routes.linear.key(torch.randn(6, 16)[:, :8], w, None)
    elif other == "misaligned":
        key = routes.linear.key(torch.randn(6 * 8 + 1)[1:].view(6, 8), w, None)
    elif other == "float16":
        key = routes.linear.key(x.half(), w.half(), None)
    elif other == "bias":
        key = routes.linear.key(x, w, torch.randn(4))
    elif other == "tf32":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", not torch.backends.cuda.matmul.allow_tf32)
        key = routes.linear.key(x, w, None)
    else:
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(not previous)
        try:
            key = routes.linear.key(x, w, None)
        finally:
            torch.use_deterministic_algorithms(previous)
    assert key is not None and key != base


class Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("case", ["subclass", "float64", "int", "mixed dtypes", "count", "meta"])
def test_calls_a_route_does_not_take_have_no_key(case):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    operands = {"subclass": (x.as_subclass(Sub), w, None), "float64": (x.double(), w.double(), None),
                "int": (x.int(), w.int(), None), "mixed dtypes": (x, w.half(), None), "count": (x, w),
                "meta": (x.to("meta"), w.to("meta"), None)}[case]
    assert routes.linear.key(*operands) is None and routes.linear(*operands) is None


def test_a_torch_function_mode_sees_every_call_and_nothing_is_routed_under_it():
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    tunekit.linear(x, w)
    assert list(routes.routed_keys().values()) == [True]
    seen = []

    class Log(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Log():
        assert routes.linear.key(x, w, None) is None
        assert torch.equal(tunekit.linear(x, w), F.linear(x, w))
    assert seen  # tunekit's path called torch's functions, and the mode saw them


def test_nothing_is_routed_while_tunekit_is_disabled_or_under_other_settings(tmp_path):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    tunekit.linear(x, w)
    key = routes.linear.key(x, w, None)
    assert routes.routed_keys() == {key: True} and routes.linear(x, w, None) is not None
    with tunekit.tuning(enabled=False):
        assert routes.linear(x, w, None) is None
        x2 = torch.randn(6, 7)
        assert torch.equal(tunekit.linear(x2, w), F.linear(x2, w))
        assert routes.routed_keys() == {key: True}  # nothing learnt while disabled
    with tunekit.tuning(results=tmp_path / "other.sqlite"):
        assert routes.linear(x, w, None) is None and routes.routed_keys() == {}


@pytest.mark.parametrize("op", [mm_op, addmm_op], ids=["mm", "addmm"])
def test_routes_are_dropped_with_the_choices_they_came_from(op):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    tunekit.linear(x, w)
    assert routes.routed_keys() != {}
    op.forget()
    assert routes.routed_keys() == {} and routes.linear(x, w, None) is None


class FakeOp:
    """An op whose decision is ``decided`` (None: undecided); ``times``: the entry's {name: ms}."""

    def __init__(self, decided, times=None):
        self.default, self.decided = Named("default"), decided and Named(decided)
        self.times = times

    def decision(self, params, s):
        if self.decided is None:
            return None
        records = {n: CandidateRecord("chosen" if n == self.decided.name else "slower", time_ms=t)
                   for n, t in (self.times or {}).items()}
        entry = None if self.times is None else Entry("mm", "sig", "dev", self.decided.name, True, {}, records, 0.0)
        candidate = self.default if self.decided.name == "default" else self.decided
        return type("R", (), {"candidate": candidate, "entry": entry})()


class Named:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("decisions, expected", [
    (["default", "default"], True), (["default", "triton"], False), ([None, "default"], None),
    ([None, "triton"], False), ([], True)])
def test_verdict_routes_only_when_every_gemm_is_decided_for_its_default(decisions, expected):
    assert routes.verdict([(FakeOp(d), None) for d in decisions], None) is expected


@pytest.mark.parametrize("saving_ms, products, expected", [
    (0.005, 2, True), (0.005, 1, False), (0.012, 2, False), (None, 2, False)],
    ids=["slight-recorded", "slight-unrecorded", "large-recorded", "untimed-recorded"])
def test_a_call_autograd_records_keeps_torch_kernels_unless_the_challenger_saves_the_floor(saving_ms, products, expected):
    """Recorded calls run tunekit's Python autograd path with a challenger: worth it only for a saving of
    CHALLENGER_HOST_MS (10 us); a call autograd does not record is planned instead (never routed to torch)."""
    assert routes.CHALLENGER_HOST_MS == 0.010
    times = None if saving_ms is None else {"default": 0.050, "triton": 0.050 - saving_ms}
    made = [(FakeOp("triton", times), None)] + [(FakeOp("default"), None)] * (products - 1)
    assert routes.verdict(made, None) is expected


def test_a_key_left_undecided_is_looked_at_again_only_after_a_new_gemm_decision(monkeypatch):
    looked, decided = [], {"count": 0}
    monkeypatch.setattr(mm_op, "decisions", lambda s: decided["count"])
    monkeypatch.setattr(addmm_op, "decisions", lambda s: 0)

    class Route:
        def key(self, *operands):
            return b"k"

    def call(n, decision=None):
        routes.learn(Route(), (), lambda: looked.append(n) or [(FakeOp(decision), None)])

    for n in range(1, 100):
        call(n)
    assert looked == [1]  # nothing was decided meanwhile: no lookup on calls 2-99
    decided["count"] = 1  # some GEMM signature was decided
    call(100)
    call(101)
    assert looked == [1, 100]
    decided["count"] = 2
    call(102, decision="default")
    assert routes.routed_keys() == {b"k": True}
    call(103)  # routed keys are never looked at again
    assert looked == [1, 100, 102]


def test_a_key_decided_for_another_candidate_is_never_routed(monkeypatch, general_calls):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    monkeypatch.setattr(routes, "verdict", lambda products, s, is_recorded=None: False)
    for _ in range(3):
        tunekit.linear(x, w)
    assert routes.routed_keys() == {routes.linear.key(x, w, None): False} and len(general_calls) == 3


def test_patched_functions_and_modules_are_routed_and_torch_compile_never_traces_a_route():
    x, layer = torch.randn(4, 6, 8), torch.nn.Linear(8, 5)
    with tunekit.patch(["gemm"]), torch.no_grad():  # with grad, routed once a backward ran (test above)
        for _ in range(2):
            y = layer(x)
            z = F.linear(x, layer.weight, layer.bias)
            m = torch.matmul(x, layer.weight.t())
        assert len(routes.routed_keys()) == 2 and all(routes.routed_keys().values())  # linear, matmul
        compiled = torch.compile(lambda t: F.linear(t, layer.weight, layer.bias), backend="eager", fullgraph=True)
        assert torch.allclose(compiled(x), z)
    with torch.no_grad():
        expected = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(y.detach(), expected) and torch.equal(z.detach(), expected)
    assert torch.equal(m, torch.matmul(x, layer.weight.t()))


@pytest.mark.gpu
def test_routed_cuda_calls_are_torchs_and_capture_in_a_cuda_graph(cuda):
    x = torch.randn(64, 96, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(80, 96, device=cuda, dtype=torch.bfloat16)
    b = torch.randn(80, device=cuda, dtype=torch.bfloat16)
    with tunekit.tuning(tuning=False):  # the default is decided: routed from the second call
        for _ in range(3):
            y = tunekit.linear(x, w, b)
        assert routes.routed_keys() == {routes.linear.key(x, w, b): True}
        assert torch.equal(y, F.linear(x, w, b))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tunekit.linear(x, w, b)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, y)
