"""``torch_addmm_epilogue`` (torch._addmm_activation: the bias and the activation in cuBLASLt's epilogue
on CUDA) run directly against a float64 reference: ReLU on the CPU, GELU (tanh form) and ReLU on a
GPU; odd sizes, transposed, sliced and misaligned operands, a bias or a full C, alpha / beta, out=
pre-filled with NaN; and what its support refuses."""

import pytest
import torch

from gemm_checks import bound, check, matrix, nans, randn
from tunekit.ops.gemm import AddmmParams, addmm_op
from tunekit.ops.gemm.torch_candidates import epilogue_support, torch_addmm_epilogue

LAYOUTS = ["row", "col", "sliced", "misaligned"]


def _params(device, dtype, layout_a, layout_b, act, bias=True, alpha=1.0, beta=1.0, out=False, M=37, N=29, K=70):
    a = matrix(M, K, dtype, device, layout_a, seed=1)
    b = matrix(K, N, dtype, device, layout_b, seed=2)
    c = randn((N,) if bias else (M, N), dtype, device, seed=3)
    return AddmmParams(c, a, b, alpha, beta, nans((M, N), dtype, device) if out else None, act), (a, b, c)


def _run_and_check(p, operands, act, alpha=1.0, beta=1.0):
    assert epilogue_support(p) is None
    y = torch_addmm_epilogue(p)
    if p.out is not None:
        assert y is p.out
    check(y, *operands, alpha, beta, act)


@pytest.mark.parametrize("layout_a", LAYOUTS)
@pytest.mark.parametrize("layout_b", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_on_the_cpu(layout_a, layout_b, dtype):
    p, operands = _params("cpu", dtype, layout_a, layout_b, "relu", out=layout_a == "row")
    _run_and_check(p, operands, "relu")


@pytest.mark.parametrize("bias, alpha, beta", [(True, 1.0, 1.0), (False, 0.5, -2.0), (True, 2.0, 0.0)])
def test_relu_with_c_and_scalars_on_the_cpu(bias, alpha, beta):
    p, operands = _params("cpu", torch.float32, "row", "col", "relu", bias=bias, alpha=alpha, beta=beta, out=True)
    _run_and_check(p, operands, "relu", alpha, beta)


def test_what_it_refuses():
    cpu, _ = _params("cpu", torch.float32, "row", "col", "gelu_tanh")
    assert "CUDA only" in epilogue_support(cpu)  # torch's CPU _addmm_activation is the erf GELU
    for act in ("none", "silu", "gelu"):
        assert "gelu_tanh and relu only" in epilogue_support(_params("cpu", torch.float32, "row", "row", act)[0])
    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(5)
    assert "2-D" in epilogue_support(AddmmParams(c, a, b, activation="relu"))
    c2 = torch.randn(3, 5)
    assert "in place" in epilogue_support(AddmmParams(c2, a[0], b[0], out=c2, activation="relu"))
    other = torch.empty(3, 5, dtype=torch.float64)
    assert "dtype" in epilogue_support(AddmmParams(c2, a[0], b[0], out=other, activation="relu"))
    shared = torch.randn(40)
    x, out = shared[:12].view(3, 4), shared[6:21].view(3, 5)  # out overlaps the input
    assert "overlaps" in epilogue_support(AddmmParams(c2, x, b[0], out=out, activation="relu"))


def test_it_is_a_candidate_of_addmm_and_decides_nothing_wrong_on_the_cpu():
    from tunekit.tunable import tuning
    p, operands = _params("cpu", torch.float32, "row", "col", "relu")
    assert addmm_op.candidate("torch_addmm_epilogue").supports(p) is None
    with tuning(results=":memory:", max_tuning_ms=2000.0, tuning_step_ms=float("inf")):
        check(addmm_op(p), *operands, act="relu")
        assert addmm_op.decision(p) is not None


def _no_worse_than_torch(p, operands, act):
    """On a GPU torch's own 16-bit addmm with a bias does not meet gemm_checks' bound (it rounds the
    product before the bias: 72x the bound in bfloat16 at this size, H200); the rule is the GEMM
    numerical check's: at most 2x the error of the default (torch's addmm, then the activation)."""
    assert epilogue_support(p) is None
    ref, allowed = bound(*operands, act=act, out_dtype=p.a.dtype)
    y = torch_addmm_epilogue(p)
    if p.out is not None:
        assert y is p.out
    default = addmm_op.default.run(p.replace(out=None))
    err, base = ((t.double() - ref).abs() / allowed for t in (y, default))
    assert torch.equal(y.isnan(), default.isnan()) and torch.equal(y.isinf(), default.isinf())  # torch's NaN / inf
    assert torch.equal(y[y.isinf()], default[default.isinf()])
    finite = ref.isfinite() & default.isfinite()
    assert float(err[finite].max()) <= 2 * float(base[finite].max()) + 1.0, (err.max(), base.max())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("act, dtype", [("gelu_tanh", torch.float32), ("gelu_tanh", torch.bfloat16),
                                        ("relu", torch.float32), ("relu", torch.float16), ("relu", torch.bfloat16)])
@pytest.mark.parametrize("layouts", [("row", "col"), ("row", "row"), ("col", "sliced"), ("misaligned", "col")])
def test_gpu_epilogue(act, dtype, layouts):
    p, operands = _params("cuda", dtype, *layouts, act, M=129, N=257, K=200, out=layouts == ("row", "col"))
    _no_worse_than_torch(p, operands, act)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_float16_gelu_is_refused():
    p, _ = _params("cuda", torch.float16, "row", "col", "gelu_tanh")
    assert "float16" in epilogue_support(p)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_epilogue_nan_and_inf():
    p, (a, b, c) = _params("cuda", torch.bfloat16, "row", "col", "gelu_tanh", M=64, N=128, K=64)
    a[3, 5], a[7, 0], c[9], c[11] = float("nan"), float("inf"), float("nan"), float("-inf")
    _no_worse_than_torch(p, (a, b, c), "gelu_tanh")
