"""tunekit under torch.compile: the torch.library custom ops each op module registers.

- opcheck (schema, autograd registration, fake vs real metadata, AOT dispatch with gradients) of all
  six ops over dtypes, layouts (odd, dense-but-permuted, non-dense, empty, 0-d) and reduction dims;
- gradcheck / gradgradcheck in float64 (the backward ops' own gradients are hand-written);
- ``torch.compile(fullgraph=True)`` with Inductor and aot_eager against eager torch, forward and
  backward, no graph breaks, no tuning while tracing, the tunable op reached on every run;
- the same through the public functions: ``tunekit.silu`` & co. turn to the custom ops while
  compiling (tests with ``needs_wiring`` in their id fail until the public functions' compile
  branch lands; ``-k "not needs_wiring"`` leaves them out).

Compiling is slow on the CPU: a few small functions, compiled once per module and reused.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend
from torch._subclasses.fake_tensor import FakeTensor
from torch.library import opcheck

import tunekit
from tunekit.ops import CUSTOM_OPS
from tunekit.ops.gelu import compiled_gelu, compiled_gelu_backward
from tunekit.ops.logsumexp import compiled_logsumexp, compiled_logsumexp_backward
from tunekit.ops.silu import compiled_silu, compiled_silu_backward
from tunekit.ops.gelu import gelu_backward_op, gelu_op
from tunekit.ops.logsumexp import logsumexp_backward_op, logsumexp_op
from tunekit.ops.silu import silu_backward_op, silu_op

ops = torch.ops.tunekit
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TUNABLE = [silu_op, silu_backward_op, gelu_op, gelu_backward_op, logsumexp_op, logsumexp_backward_op]
SCHEMAS = {
    "silu": "tunekit::silu(Tensor x) -> Tensor",
    "silu_backward": "tunekit::silu_backward(Tensor dy, Tensor x) -> Tensor",
    "gelu": "tunekit::gelu(Tensor x, str approximate) -> Tensor",
    "gelu_backward": "tunekit::gelu_backward(Tensor dy, Tensor x, str approximate) -> Tensor",
    "logsumexp": "tunekit::logsumexp(Tensor x, int[] dim, bool keepdim) -> Tensor",
    "logsumexp_backward": "tunekit::logsumexp_backward(Tensor dy, Tensor x, Tensor lse, int[] dim, bool keepdim) "
                          "-> Tensor",
    "rms_norm": "tunekit::rms_norm(Tensor x, Tensor weight, SymInt[] normalized_shape, float? eps) -> Tensor",
    "rms_norm_backward": "tunekit::rms_norm_backward(Tensor dy, Tensor x, Tensor weight, SymInt[] normalized_shape, "
                         "float? eps) -> (Tensor, Tensor)",
    "mm": "tunekit::mm(Tensor a, Tensor b, str activation) -> Tensor",
    "addmm": "tunekit::addmm(Tensor c, Tensor a, Tensor b, float beta, float alpha, str activation) -> Tensor",
}


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():  # the Triton interpreter's overflow warnings while tuning on the CPU
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def leaf(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a leaf that requires grad, with its strides kept."""
    return t.detach().requires_grad_()


def layouts(dtype):
    """x of every layout an elementwise op must keep: fake and real strides must agree on each."""
    return {
        "odd": torch.randn(3, 5, 7, dtype=dtype) * 3,
        "permuted": (torch.randn(5, 6, dtype=dtype) * 3).t(),            # dense, not contiguous
        "strided": (torch.randn(10, 6, dtype=dtype) * 3).t()[:, ::2],    # not dense: torch's own layout differs
        "empty": torch.empty(0, 4, dtype=dtype),
        "scalar": torch.tensor(1.5, dtype=dtype),
    }


# -- registration ---------------------------------------------------------------------------------
def test_every_op_is_registered_with_its_schema():
    assert set(CUSTOM_OPS) == set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert str(getattr(ops, name).default._schema) == schema
        assert CUSTOM_OPS[name]._opoverload is getattr(ops, name).default


# -- opcheck --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["odd", "permuted", "strided", "empty", "scalar"])
def test_opcheck_elementwise(dtype, layout):
    x = layouts(dtype)[layout]
    dy = torch.randn_like(x)  # contiguous when x is not dense: a layout unlike x's
    with tunekit.tuning(tuning=layout == "odd"):  # tuning on CPU tensors is slow-ish: one layout tunes
        opcheck(ops.silu.default, (leaf(x),))
        opcheck(ops.silu_backward.default, (leaf(dy), leaf(x)))
        for approximate in ("none", "tanh"):
            opcheck(ops.gelu.default, (leaf(x), approximate))
            opcheck(ops.gelu_backward.default, (leaf(dy), leaf(x), approximate))
        opcheck(ops.silu.default, (x,))  # no autograd


REDUCTIONS = [  # shape or layout, dim, keepdim
    ((3, 5, 7), [-1], False), ((3, 5, 7), [-1], True), ((3, 5, 7), [0], False), ((3, 5, 7), [1, 2], False),
    ((3, 5, 7), [0, 2], True), ("strided", [0], False), ("permuted", [1], True), ((4, 0), [1], False),
    ((0, 5), [1], True), ((), [0], False), ((1, 9), [1], True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, dim, keepdim", REDUCTIONS, ids=str)
def test_opcheck_logsumexp(dtype, shape, dim, keepdim):
    x = layouts(dtype)[shape] if isinstance(shape, str) else torch.randn(shape, dtype=dtype) * 3
    lse = torch.logsumexp(x, dim, keepdim)
    dy = torch.randn_like(lse)
    with tunekit.tuning(tuning=shape == (3, 5, 7)):
        opcheck(ops.logsumexp.default, (leaf(x), dim, keepdim))
        opcheck(ops.logsumexp_backward.default, (leaf(dy), leaf(x), leaf(lse), dim, keepdim))
        opcheck(ops.logsumexp.default, (x, dim, keepdim))


def test_real_results_equal_torch_and_have_the_fake_strides():
    for x in layouts(torch.float32).values():
        y = ops.silu(x)
        torch.testing.assert_close(y, F.silu(x))
        assert y.stride() == torch.empty_like(x).stride()
        torch.testing.assert_close(ops.gelu(x, "tanh"), F.gelu(x, approximate="tanh"))
    x = layouts(torch.float32)["permuted"].unsqueeze(0).permute(2, 0, 1)
    y = ops.logsumexp(x, [1, 2], True)
    torch.testing.assert_close(y, torch.logsumexp(x, (1, 2), True))
    assert y.stride() == torch.empty(y.shape).stride()


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="floating-point"):
        ops.silu(torch.arange(3))
    with pytest.raises(ValueError, match="approximate"):
        ops.gelu(torch.randn(3), "fast")
    with pytest.raises(ValueError, match="one shape"):
        ops.silu_backward(torch.randn(3), torch.randn(4))
    with pytest.raises(ValueError, match="at least one"):
        ops.logsumexp(torch.randn(3, 4), [], False)
    with pytest.raises(ValueError, match="out of range"):
        ops.logsumexp(torch.randn(3, 4), [2], False)
    with pytest.raises(ValueError, match="reduced shape"):
        ops.logsumexp_backward(torch.randn(4), torch.randn(3, 4), torch.randn(3), [1], False)


# -- gradients, float64 ---------------------------------------------------------------------------
def test_gradcheck_and_gradgradcheck():
    x = leaf(torch.randn(4, 5, dtype=torch.float64) * 3)
    dy = leaf(torch.randn(4, 5, dtype=torch.float64))
    cases = [(ops.silu, (x,)), (ops.silu_backward, (dy, x))]
    for approximate in ("none", "tanh"):
        cases += [(lambda x, a=approximate: ops.gelu(x, a), (x,)),
                  (lambda dy, x, a=approximate: ops.gelu_backward(dy, x, a), (dy, x))]
    for dim, keepdim in (([1], False), ([0, 1], True)):
        lse = leaf(torch.logsumexp(x, dim, keepdim))
        dl = leaf(torch.randn_like(lse))
        cases += [(lambda x, d=dim, k=keepdim: ops.logsumexp(x, d, k), (x,)),
                  (lambda dy, x, lse, d=dim, k=keepdim: ops.logsumexp_backward(dy, x, lse, d, k), (dl, x, lse))]
    for fn, args in cases:
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_double_backward_matches_torch_in_16_bit(dtype):
    x = leaf(torch.randn(64, dtype=dtype) * 3)
    for ours, theirs in ((ops.silu, F.silu), (lambda t: ops.gelu(t, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
                         (lambda t: ops.gelu(t, "none"), F.gelu)):
        results = []
        for fn in (ours, theirs):
            (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
            results.append((g, torch.autograd.grad(g.sum(), x)[0]))
        for a, b in zip(*results):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


# -- torch.compile --------------------------------------------------------------------------------
def through_ops(x):
    y = ops.silu(x) * 2 + ops.gelu(x, "tanh")
    return ops.logsumexp(y, [-1], False) + ops.gelu(x, "none").sum(-1)


def through_public(x):
    y = tunekit.silu(x) * 2 + tunekit.gelu(x, approximate="tanh")
    return tunekit.logsumexp(y, -1) + tunekit.gelu(x).sum(-1)


def with_torch(x):
    y = F.silu(x) * 2 + F.gelu(x, approximate="tanh")
    return torch.logsumexp(y, -1) + F.gelu(x).sum(-1)


_compiled = {}


def compiled(fn, backend):
    """One torch.compile per (function, backend) for the whole module."""
    key = (fn, backend)
    if key not in _compiled:
        _compiled[key] = torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)
    return _compiled[key]


def teardown_module():
    _compiled.clear()
    torch._dynamo.reset()


def check_against_torch(fn, x):
    """fn(x) and its gradient equal eager torch's within x.dtype's tolerance."""
    tol = {torch.float32: (1e-5, 1e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}[x.dtype]
    a, b = leaf(x), leaf(x)
    ya, yb = fn(a), with_torch(b)
    torch.testing.assert_close(ya, yb, rtol=tol[0], atol=tol[1])
    g = torch.randn_like(yb)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(a.grad, b.grad, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("fn", [through_ops, pytest.param(through_public, id="public_needs_wiring")])
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_equals_eager_torch(fn, backend):
    x = torch.randn(6, 37) * 3
    check_against_torch(compiled(fn, backend), x)
    with torch.no_grad():  # inference graph: no autograd
        torch.testing.assert_close(compiled(fn, backend)(x), with_torch(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_compiled_16_bit(dtype):
    check_against_torch(compiled(through_ops, "aot_eager"), torch.randn(6, 37, dtype=dtype) * 3)


def test_compiled_dynamic_shapes():
    """Symbolic sizes reach the fake implementations (one graph for both shapes)."""
    model = torch.compile(through_ops, fullgraph=True, backend="aot_eager", dynamic=True)
    for shape in ((6, 37), (3, 5)):
        check_against_torch(model, torch.randn(shape) * 3)


@pytest.mark.parametrize("fn", [through_ops, pytest.param(through_public, id="public_needs_wiring")])
def test_no_graph_breaks(fn):
    explanation = torch._dynamo.explain(fn)(leaf(torch.randn(4, 9)))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    targets = {str(node.target).removesuffix(".default") for g in explanation.graphs for node in g.graph.nodes}
    assert {"tunekit.silu", "tunekit.gelu", "tunekit.logsumexp"} <= targets, targets


@pytest.mark.parametrize("fn", [through_ops, pytest.param(through_public, id="public_needs_wiring")])
def test_tracing_does_not_tune_and_every_run_reaches_the_tunable_op(fn, monkeypatch):
    phase = ["tracing"]
    resolved = []  # (op, phase, saw a fake tensor) of every choice the runtime made
    for op in TUNABLE:
        def spy(params, s=None, _op=op, _resolve=op.resolve):
            fake = any(isinstance(getattr(params, n), FakeTensor) for n in params.inputs)
            resolved.append((_op.name, phase[0], fake))
            return _resolve(params, s)
        monkeypatch.setattr(op, "resolve", spy)

    def backend(gm, example_inputs):
        phase[0] = "compiling"
        run = lookup_backend("aot_eager")(gm, example_inputs)
        phase[0] = "compiled"

        def running(*args):
            phase[0] = "running"
            return run(*args)
        return running

    x = leaf(torch.randn(3, 11))
    model = torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)
    model(x).sum().backward()
    assert phase[0] == "running" and resolved
    assert {op for op, _, _ in resolved} == {"silu", "gelu", "logsumexp", "silu_backward", "gelu_backward",
                                             "logsumexp_backward"}
    assert all(p == "running" and not fake for _, p, fake in resolved), resolved
    assert silu_op._choices and logsumexp_backward_op._choices  # the choice caches eager calls use

    calls = []  # later runs: the cached path, the chosen candidate every time
    chosen = next(iter(next(iter(silu_op._choices.values())).values()))
    monkeypatch.setattr(chosen, "run", lambda p, _run=chosen.run: calls.append(p.x.shape) or _run(p))
    with torch.no_grad():
        model(x.detach())  # a new graph for no-grad (traced without tuning, too)
        model(x.detach())
    assert calls == [x.shape, x.shape]
    assert all(p == "running" and not fake for _, p, fake in resolved), resolved


def test_settings_apply_at_run_time():
    """tunekit.tuning() around a compiled call governs the run, as it does eager calls."""
    model = compiled(through_ops, "aot_eager")
    x = torch.randn(6, 37) * 3
    with tunekit.tuning(enabled=False):
        model(x)
    assert not silu_op._choices  # disabled: the default ran, nothing was looked up or cached
    model(x)
    assert silu_op._choices


# -- the public functions' compile branch (each op module's compiled_*) ------------------------
def test_compiled_functions_without_compiling():
    """The compiled_* functions are plain functions too: same results as the eager public API."""
    x = torch.randn(4, 6)
    dy = torch.randn(4, 6)
    torch.testing.assert_close(compiled_silu(x), tunekit.silu(x))
    torch.testing.assert_close(compiled_gelu(x, approximate="tanh"), tunekit.gelu(x, approximate="tanh"))
    torch.testing.assert_close(compiled_silu_backward(dy, x), tunekit.silu_backward(dy, x))
    torch.testing.assert_close(compiled_gelu_backward(dy, x, "tanh"), tunekit.gelu_backward(dy, x, "tanh"))
    lse = compiled_logsumexp(x, (0, -1), keepdim=True)
    torch.testing.assert_close(lse, torch.logsumexp(x, (0, 1), True))
    torch.testing.assert_close(compiled_logsumexp_backward(torch.ones_like(lse), x, lse, (0, 1), True),
                               tunekit.logsumexp_backward(torch.ones_like(lse), x, lse, (0, 1), True))
    torch.testing.assert_close(compiled_logsumexp(torch.arange(6).view(2, 3), 1),
                               torch.logsumexp(torch.arange(6).view(2, 3), 1))  # integers: torch's promotion
    with pytest.raises(IndexError):
        compiled_logsumexp(x, 5)  # invalid dims: torch's error


def out_and_inplace(x, out):
    a = tunekit.silu(x, out=out)
    b = tunekit.gelu(x.clone(), approximate="tanh", inplace=True)
    return a + b + tunekit.silu(x.clone(), inplace=True)


def test_public_out_and_inplace_under_compile_needs_wiring():
    x = torch.randn(5, 8)
    out = torch.empty_like(x)
    expected = F.silu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
    torch.testing.assert_close(compiled(out_and_inplace, "aot_eager")(x, out), expected)
    torch.testing.assert_close(out, F.silu(x))


def test_compiled_out_and_inplace_forms():
    x = torch.randn(5, 8)
    out = torch.empty_like(x)
    assert compiled_silu(x, out=out) is out
    torch.testing.assert_close(out, F.silu(x))
    assert compiled_gelu(x, approximate="tanh", out=out) is out
    torch.testing.assert_close(out, F.gelu(x, approximate="tanh"))
    y = x.clone()
    assert compiled_gelu(y, inplace=True) is y
    torch.testing.assert_close(y, F.gelu(x))
    with pytest.raises(ValueError, match="not both"):
        compiled_silu(x, out=out, inplace=True)
    with pytest.warns(UserWarning, match="resized"):  # torch's out= rules: a wrong shape is resized
        assert compiled_silu(x, out=out[:2].clone()).shape == x.shape
    with pytest.raises(RuntimeError):  # torch's error: out of another dtype
        compiled_silu(x, out=out.double())
