"""The fast path of a cached call: runners cached next to choices, run by ``op.fast_call(x)`` (in C
and in Python, the same behaviour), dropped with the choices; and the host tie-break timing what a
cached call runs (``cached_call``)."""

import pytest
import torch

from tunekit.backends import fast_call
from tunekit.tunable import context
from tunekit.tunable import TunableOp, current, fast_path, tuning
from tunekit.tunable.host_time import cached_call
from tunekit.tunable.params import make_trial

from fakes import FakeClock, ScaleParams


class FastScaleParams(ScaleParams):
    """ScaleParams keyed as the elementwise ops' fast path keys them, whose public function would
    take the fast path for a new output."""

    def cache_key(self):
        x = self.x
        if self.fast_form():
            return (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
        return super().cache_key()

    def fast_form(self):
        return self.out is None and self.x.is_contiguous()



@pytest.fixture(autouse=True)
def tune_in_one_call(monkeypatch):
    """These tests are about the cache and the store: each signature is tuned in its first call
    (tests/tunable/test_session.py covers tuning spread over calls)."""
    monkeypatch.setenv("TUNEKIT_TUNING_STEP_MS", "inf")
    context.reload_environment()

def make_fast_op(costs, implementation="native"):
    """Candidates computing 2x at the given fake costs; each offers a runner that logs its calls."""
    clock = FakeClock()
    op = TunableOp("scale_fast", FastScaleParams, fast_calls=fast_call.make_fast_call)
    op.clock = clock
    op.log = []
    for name, cost in costs.items():
        def run(p, cost=cost):
            clock.advance(cost)
            out = p.out if p.out is not None else torch.empty_like(p.x)
            return torch.mul(p.x, 2, out=out)

        def fast_runner(p, name=name):
            def runner(x):
                op.log.append((name, x))
                return x * 2
            return runner

        op.add(run, name=name, default=(name == "ref"), fast_runner=fast_runner)
    if implementation == "python":
        op.fast_call = fast_path.python_fast_call(op._runners)
        op._fast_call_made = True  # keep it: the op would otherwise switch to C at the first runner
    return op


IMPLEMENTATIONS = ["native", "python"]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request):
    if request.param == "native" and fast_call.load() is None:
        pytest.skip("the C extension is unavailable here")
    return request.param


def test_the_op_switches_to_the_injected_fast_call_at_its_first_runner():
    op = make_fast_op({"ref": 2.0, "fast": 1.0})
    assert op.fast_call(torch.randn(4)) is None
    op(FastScaleParams(torch.randn(100)))
    module = fast_call._load_in_background().result(timeout=600)  # installed once built (a worker builds it)
    assert module is None or type(op.fast_call) is module.FastCall
    assert module is not None or op.fast_call.__name__ == "fast_call"  # the Python one


def test_the_runner_of_the_choice_runs_for_every_tensor_of_the_key(implementation):
    op = make_fast_op({"ref": 2.0, "fast": 1.0}, implementation)
    x = torch.randn(100)
    assert op.fast_call(x) is None  # nothing decided yet
    op(FastScaleParams(x))  # tunes: "fast" wins
    other = torch.randn(100)  # another tensor of the same key
    torch.testing.assert_close(op.fast_call(other), 2 * other)
    assert op.log == [("fast", other)]
    assert op.fast_call(torch.randn(101)) is None  # another key: nothing cached for it
    assert op.fast_call(torch.randn(100, dtype=torch.float64)) is None
    assert op.fast_call(torch.randn(101)[1:]) is None  # 4 bytes off: another alignment class
    assert len(op.log) == 1


def test_what_the_fast_call_leaves_to_the_general_path(implementation):
    op = make_fast_op({"ref": 2.0, "fast": 1.0}, implementation)
    x = torch.randn(10, 10)
    op(FastScaleParams(x))
    assert op.fast_call(x.t()) is None  # not contiguous
    assert op.fast_call(x.clone().requires_grad_()) is None  # autograd
    assert op.fast_call(torch.nn.Parameter(x.clone(), requires_grad=False)) is None  # a subclass
    assert op.fast_call([1.0, 2.0]) is None and op.fast_call(None) is None
    assert op.fast_call(x, "an argument the key has not") is None
    assert op.fast_call(x, ["unhashable"]) is None
    assert op.log == []
    op.fast_call(x)
    assert len(op.log) == 1


def test_a_differentiable_runner_takes_a_tensor_that_requires_grad(implementation):
    """A runner the op names differentiable (torch's own function: its result and autograd node, as
    silu's and gelu's torch kernels) takes x requiring grad; the others leave it to the general path."""
    def twice(x):  # one object, cached for the key: a differentiable torch computation
        return x * 2

    op = make_fast_op({"ref": 2.0, "fast": 1.0}, implementation)
    op.differentiable_runners = frozenset({twice})
    op.candidate("fast").fast_runner = lambda p: twice
    if implementation == "python":
        op.fast_call = fast_path.python_fast_call(op._runners, op.differentiable_runners)
    else:
        op._fast_call_made = False  # made again at the first runner, with the set
    x = torch.randn(10, 10)
    op(FastScaleParams(x))
    if implementation == "native":
        op.fast_call = fast_call.load().FastCall(op._runners, context._current, context, torch.Tensor,
                                                 op.differentiable_runners)
    leaf = x.clone().requires_grad_()
    y = op.fast_call(leaf)
    assert y is not None and y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(leaf.grad, torch.full_like(x, 2.0))
    with torch.no_grad():
        assert op.fast_call(leaf).grad_fn is None  # torch's function under no_grad: no node, as torch
    op.differentiable_runners = frozenset()
    fresh = fast_path.python_fast_call(op._runners) if implementation == "python" else \
        fast_call.load().FastCall(op._runners, context._current, context, torch.Tensor)
    assert fresh(leaf) is None and fresh(x) is not None  # not named differentiable: the general path


def test_the_extra_argument_is_part_of_the_key(implementation):
    op = make_fast_op({"ref": 2.0}, implementation)
    x = torch.randn(100)
    key = FastScaleParams(x).cache_key()
    op._runners[current().cache_id] = {(key, "tanh"): lambda t: ("tanh", t), key: lambda t: ("plain", t)}
    assert op.fast_call(x, "tanh")[0] == "tanh" and op.fast_call(x)[0] == "plain"
    assert op.fast_call(x, "none") is None


def test_no_runner_for_params_outside_the_fast_form():
    op = make_fast_op({"ref": 2.0, "fast": 1.0})
    x = torch.randn(100)
    op(FastScaleParams(x, out=torch.empty_like(x)))
    op(FastScaleParams(torch.randn(10, 10).t()))
    assert not any(op._runners.values())
    assert op._choices  # the choices themselves are cached as before


def test_a_candidate_without_a_runner_leaves_the_fast_path_empty():
    op = make_fast_op({"ref": 2.0, "fast": 1.0})
    op.add(lambda p: torch.mul(p.x, 2, out=p.out if p.out is not None else torch.empty_like(p.x)), name="plain")
    for name in ("ref", "fast"):  # only "plain" can win: the others cost more on the fake clock
        op.candidate(name).run = lambda p, run=op.candidate(name).run: (op.clock.advance(5.0), run(p))[1]
    x = torch.randn(100)
    op(FastScaleParams(x))
    assert op.resolve(FastScaleParams(x)).candidate.name == "plain"
    assert op.fast_call(x) is None and op.log == []


def test_runners_follow_the_settings_they_were_decided_under(implementation):
    op = make_fast_op({"ref": 2.0, "fast": 1.0}, implementation)
    x = torch.randn(100)
    op(FastScaleParams(x))
    assert op.fast_call(x) is not None
    with tuning(enabled=False):
        assert op.fast_call(x) is None  # disabled: the default runs, never a cached choice
    with tuning(results=":memory:"):
        assert op.fast_call(x) is None  # another store: its own choices
    op.forget()
    assert op.fast_call(x) is None


def test_tuning_a_signature_drops_the_tuning_off_runners_of_that_store(implementation):
    op = make_fast_op({"ref": 2.0, "fast": 1.0}, implementation)
    x = torch.randn(100)
    with tuning(tuning=False):
        op(FastScaleParams(x))  # the default, decided with tuning off
        op.fast_call(x)
    assert op.log[-1][0] == "ref"
    op(FastScaleParams(x))  # tunes
    with tuning(tuning=False):
        assert op.fast_call(x) is None  # the stale default is gone...
        op(FastScaleParams(x))
        op.fast_call(x)
    assert op.log[-1][0] == "fast"  # ...and the tuned choice replaces it


def test_errors_of_the_runner_itself_reach_the_caller(implementation):
    op = make_fast_op({"ref": 2.0}, implementation)
    x = torch.randn(100)

    def broken(t):
        raise RuntimeError("kernel exploded")

    op._runners[current().cache_id] = {FastScaleParams(x).cache_key(): broken}
    with pytest.raises(RuntimeError, match="kernel exploded"):
        op.fast_call(x)


def test_cached_call_times_the_runner_for_a_new_output_and_run_otherwise():
    op = make_fast_op({"ref": 2.0})
    c = op.candidate("ref")
    x = torch.randn(64)
    params = FastScaleParams(x)
    base = make_trial(params)
    assert isinstance(base.out, torch.Tensor)  # tuning's proxies carry an output...
    cached_call(c, params, base)()
    assert op.log and op.log[-1][1] is base.x  # ...the cached call allocates: the runner, on the proxy input
    op.log.clear()
    given = FastScaleParams(x, out=torch.empty_like(x))
    before = op.clock()
    cached_call(c, given, make_trial(given))()
    assert op.log == [] and op.clock() > before  # an out= call runs run(), into the proxy output


def test_an_unhashable_runner_is_not_named_differentiable(implementation):
    """Both fast calls give None for x requiring grad when the runner cannot be looked up in the set."""
    class Unhashable:
        __hash__ = None

        def __call__(self, x):
            return x * 2

    x = torch.randn(8)
    runners = {context.current().cache_id: {(x.dtype, x.numel(), x.data_ptr() & 15, x.device): Unhashable()}}
    differentiable = frozenset({abs})
    fc = fast_path.python_fast_call(runners, differentiable) if implementation == "python" else \
        fast_call.load().FastCall(runners, context._current, context, torch.Tensor, differentiable)
    torch.testing.assert_close(fc(x), 2 * x)
    assert fc(x.requires_grad_()) is None
