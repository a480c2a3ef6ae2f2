"""The GEMM family under torch.compile: the custom ops ``tunekit::mm`` / ``tunekit::addmm`` (schema,
opcheck: fake vs real, autograd registration, AOT dispatch) and the public functions compiled with
``fullgraph=True`` (no graph break, the custom ops in the graph, values and gradients as eager torch's,
no tuning while tracing). Compiling is slow on the CPU: small functions, compiled once each."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import tunekit
from gemm_checks import randn
from tunekit.ops.gemm import addmm_op, mm_op
from tunekit.ops.gemm.custom_ops import addmm_custom, mm_custom

ops = torch.ops.tunekit
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def leaf(t):
    return t.detach().requires_grad_()


def test_schemas():
    assert str(ops.mm.default._schema) == "tunekit::mm(Tensor a, Tensor b, str activation) -> Tensor"
    assert str(ops.addmm.default._schema) == ("tunekit::addmm(Tensor c, Tensor a, Tensor b, float beta, float alpha, "
                                              "str activation) -> Tensor")
    assert mm_custom._opoverload is ops.mm.default and addmm_custom._opoverload is ops.addmm.default
    assert tunekit.ops.CUSTOM_OPS["mm"] is mm_custom and tunekit.ops.CUSTOM_OPS["addmm"] is addmm_custom


MM_CASES = [
    ("2d", lambda d: (randn((5, 7), d), randn((7, 6), d, seed=1), "none")),
    ("transposed", lambda d: (randn((7, 5), d).t(), randn((6, 7), d, seed=1).t(), "gelu")),
    ("batched", lambda d: (randn((2, 5, 7), d), randn((2, 7, 6), d, seed=1), "silu")),
    ("k0", lambda d: (randn((5, 0), d), randn((0, 6), d), "relu")),
]
ADDMM_CASES = [
    ("bias", lambda d: (randn(6, d, seed=2), randn((5, 7), d), randn((6, 7), d, seed=1).t(), 1.0, 1.0, "gelu_tanh")),
    ("full", lambda d: (randn((5, 6), d, seed=2), randn((5, 7), d), randn((7, 6), d, seed=1), 0.5, -2.0, "none")),
    ("batched", lambda d: (randn((5, 1), d, seed=2), randn((2, 5, 7), d), randn((2, 7, 6), d, seed=1), 2.0, 1.0,
                           "relu")),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, make", MM_CASES, ids=[c[0] for c in MM_CASES])
def test_opcheck_mm(name, make, dtype):
    a, b, act = make(dtype)
    with tunekit.tuning(tuning=False):
        opcheck(ops.mm.default, (leaf(a), leaf(b), act))
        opcheck(ops.mm.default, (a, b, act))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, make", ADDMM_CASES, ids=[c[0] for c in ADDMM_CASES])
def test_opcheck_addmm(name, make, dtype):
    c, a, b, beta, alpha, act = make(dtype)
    with tunekit.tuning(tuning=False):
        opcheck(ops.addmm.default, (leaf(c), leaf(a), leaf(b), beta, alpha, act))


def test_custom_op_values_and_errors():
    a, b, c = randn((5, 7)), randn((7, 6), seed=1), randn(6, seed=2)
    torch.testing.assert_close(ops.mm(a, b, "silu"), F.silu(a @ b))
    torch.testing.assert_close(ops.addmm(c, a, b, 0.5, 2.0, "none"), torch.addmm(c, a, b, beta=0.5, alpha=2.0))
    assert ops.mm(a.t().contiguous().t(), b, "none").is_contiguous()
    with pytest.raises(RuntimeError, match="matching inner sizes"):
        ops.mm(a, a, "none")
    with pytest.raises(ValueError, match="activation"):
        ops.mm(a, b, "tanh")


# -- torch.compile -----------------------------------------------------------------------------
def ours(x, w, bias, w2):
    h = tunekit.linear_act(x, w, bias, "gelu_tanh")
    y = tunekit.matmul(h, w2) + tunekit.linear(h, w2.t())
    return tunekit.addmm(bias[:1], y.flatten(0, 1), w2.t(), beta=0.5).sum(-1)


def theirs(x, w, bias, w2):
    h = F.gelu(F.linear(x, w, bias), approximate="tanh")
    y = torch.matmul(h, w2) + F.linear(h, w2.t())
    return torch.addmm(bias[:1], y.flatten(0, 1), w2.t(), beta=0.5).sum(-1)


def inputs():
    return [randn((2, 3, 8)), randn((16, 8), seed=1), randn(16, seed=2), randn((16, 8), seed=3)]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager_torch_with_gradients(backend):
    compiled = torch.compile(ours, fullgraph=True, backend=backend, dynamic=False)
    a, b = [leaf(t) for t in inputs()], [leaf(t) for t in inputs()]
    ya, yb = compiled(*a), theirs(*b)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
    g = randn(tuple(yb.shape), seed=4)  # seeded: the global RNG's state depends on the tests run before
    ya.backward(g)
    yb.backward(g)
    for p, q in zip(a, b):  # Inductor fuses gelu_tanh's gradient in another order: ~200 float32 ulps apart seen
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # inference: the fused epilogue's custom op
        torch.testing.assert_close(compiled(*inputs()), theirs(*inputs()), rtol=1e-5, atol=1e-5)


def test_no_graph_breaks_and_the_custom_ops_are_in_the_graph():
    explanation = torch._dynamo.explain(ours)(*[leaf(t) for t in inputs()])
    assert explanation.graph_break_count == 0, explanation.break_reasons
    targets = {str(node.target).removesuffix(".default") for g in explanation.graphs for node in g.graph.nodes}
    assert {"tunekit.mm", "tunekit.addmm"} <= targets, targets


def test_forms_left_to_torch_trace_torchs_ops():
    def f(x, v):
        return tunekit.matmul(x, v) + tunekit.mm(x[0], x[0].t()).sum() + tunekit.linear(v, x[0])

    x, v = randn((2, 4, 4)), randn(4, seed=1)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, v), torch.matmul(x, v) + torch.mm(x[0], x[0].t()).sum() + F.linear(v, x[0]))


def test_tracing_does_not_tune(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensor
    seen = []
    for op in (mm_op, addmm_op):
        def spy(params, s=None, _resolve=op.resolve, **kw):
            seen.append(any(isinstance(getattr(params, n), FakeTensor) for n in params.inputs))
            return _resolve(params, s, **kw)
        monkeypatch.setattr(op, "resolve", spy)
        op.forget()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager", dynamic=False)
    with tunekit.tuning(tuning=False):
        compiled(*inputs())
    assert seen and not any(seen)
    for op in (mm_op, addmm_op):
        op.forget()
