"""FlagGems' accuracy tests for silu, gelu and (by its reduction conventions) logsumexp, ported with
their shapes and tolerances; our own test code.

Source: FlagOpen/FlagGems at commit 532ff438c70343d7aec9becdabb76a71225a0553 (2025-11-21):

- ``tests/accuracy_utils.py``: ``POINTWISE_SHAPES`` [(), (1,), (1024, 1024), (20, 320, 15),
  (16, 128, 64, 60), (16, 7, 57, 32, 29)] (quick mode: [(2, 19, 7)]), ``REDUCTION_SHAPES`` [(1, 2),
  (4096, 256), (200, 40999, 3)] (quick: [(2, 32)]), ``FLOAT_DTYPES`` float16, float32, bfloat16;
  references are the inputs upcast to float64 (``to_reference(x, True)``); ``gems_assert_close``;
- ``src/flag_gems/testing/__init__.py``: ``assert_close(res, ref, dtype, atol=1e-4, reduce_dim=1)``:
  the result has ``dtype``, the reference is cast to it, ``rtol = RESOLUTION[dtype]`` (float16 1e-3,
  float32 1.3e-6, bfloat16 0.016), ``atol = 1e-4 * reduce_dim``, NaN not equal;
- ``tests/test_unary_pointwise_ops.py``: ``test_accuracy_silu``, ``_silu_backward``, ``_silu_``,
  ``_gelu``, ``_gelu_backward``, ``_gelu_`` (both approximations): randn inputs (and randn
  gradients), the tolerance above;
- FlagGems has no logsumexp test: its reductions' conventions stand in. The dims and keepdim of
  ``tests/test_general_reduction_ops.py`` (``KEEPDIM_DIMS``: (True, 0), (False, 1), (True, [0, 1]),
  (False, [1, 0])) over ``REDUCTION_SHAPES``, and the tolerance of ``tests/test_reduction_ops.py``'s
  ``test_accuracy_log_softmax`` / ``_backward`` (``x - logsumexp(x)``: the closest op it tests), the
  default above with ``reduce_dim = 1`` (a log of a sum does not grow its error with the count).

Each case runs the public function (tuning on: whichever candidate wins) and every candidate that
supports the inputs, forced in turn. On the CPU the quick-mode shapes (and () and (1,)) in all three
dtypes (Triton candidates in the interpreter); the full shapes under ``gpu``.
"""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.ops.gelu import GeluBackwardParams, GeluParams, gelu_backward_op, gelu_op
from tunekit.ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, logsumexp_backward_op, logsumexp_op,
                                   normalize_dims)
from tunekit.ops.silu import SiluBackwardParams, SiluParams, silu_backward_op, silu_op

RESOLUTION = {torch.float16: 1e-3, torch.float32: 1.3e-6, torch.bfloat16: 0.016}
FLOAT_DTYPES = [torch.float16, torch.float32, torch.bfloat16]
POINTWISE_SHAPES = [(), (1,), (1024, 1024), (20, 320, 15), (16, 128, 64, 60), (16, 7, 57, 32, 29)]
QUICK_POINTWISE_SHAPES = [(2, 19, 7), (), (1,)]
REDUCTION_SHAPES = [(1, 2), (4096, 256), (200, 40999, 3)]
QUICK_REDUCTION_SHAPES = [(2, 32), (1, 2)]
KEEPDIM_DIMS = [(True, 0), (False, 1), (True, [0, 1]), (False, [1, 0])]
APPROXIMATE = ["none", "tanh"]
#: the Triton interpreter's numpy warnings while it runs candidates on the CPU
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def shapes(full, quick):
    """The quick shapes on the CPU, the full ones on the GPU (each a pytest param with its device)."""
    return ([pytest.param(s, "cpu", id=f"cpu-{s}") for s in quick]
            + [pytest.param(s, "cuda", id=f"cuda-{s}", marks=pytest.mark.gpu) for s in full])


def gems_assert_close(res, ref, dtype, atol=1e-4, reduce_dim=1):
    """FlagGems' ``assert_close``: ``res`` has ``dtype``; ``ref`` (float64) cast to it; rtol by dtype."""
    assert res.dtype == dtype
    torch.testing.assert_close(res, ref.to(dtype), atol=atol * reduce_dim, rtol=RESOLUTION[dtype], equal_nan=False)


def torch_logsumexp_atol(x) -> float:
    """torch's own 16-bit logsumexp misses FlagGems' tolerance (its kernels compute in float32):
    torch's composite rounds ``max`` and ``x - max`` to 16 bits, so a result near 0 is off by up to
    an ulp of max|x| (float16 5e-4, bfloat16 4e-3 at |x| ~ 1-2: a CPU example in
    ``test_torchs_own_16_bit_logsumexp_misses_flaggems_tolerance``). Its candidate, and the public
    function (which runs it on the CPU and while a signature tunes), are held to ``rtol x max|x|``."""
    return max(1e-4, RESOLUTION[x.dtype] * float(x.abs().max())) if x.numel() else 1e-4


def every_candidate(op, params, ref, dtype, torch_atol=1e-4) -> int:
    """Each candidate of ``op`` that supports ``params``, into a NaN-filled ``out``: FlagGems'
    tolerance (torch's own candidates: ``torch_atol``). How many ran."""
    ran = 0
    for c in op.candidates:
        out = torch.full(ref.shape, float("nan"), dtype=dtype, device=ref.device)
        p = params.replace(out=out)
        if c.supports(p) is not None:
            continue
        assert c.run(p).data_ptr() == out.data_ptr(), c.name
        try:
            gems_assert_close(out, ref, dtype, atol=torch_atol if c.name.startswith("torch_") else 1e-4)
        except AssertionError as e:
            raise AssertionError(f"{c.name}: {e}") from None
        ran += 1
    return ran


# -- silu -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_silu(shape, device, dtype):
    inp = torch.randn(shape, dtype=dtype, device=device)
    ref_out = F.silu(inp.double())
    gems_assert_close(tunekit.silu(inp), ref_out, dtype)
    assert every_candidate(silu_op, SiluParams(inp), ref_out, dtype) >= 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_silu_backward(shape, device, dtype):
    inp = torch.randn(shape, dtype=dtype, device=device)
    grad = torch.randn_like(inp)
    ref_in_grad = torch.ops.aten.silu_backward(grad.double(), inp.double())
    gems_assert_close(tunekit.silu_backward(grad, inp), ref_in_grad, dtype)
    assert every_candidate(silu_backward_op, SiluBackwardParams(grad, inp), ref_in_grad, dtype) >= 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_silu_(shape, device, dtype):
    inp = torch.randn(shape, dtype=dtype, device=device)
    ref_out = F.silu(inp.double(), inplace=True)
    res_out = tunekit.silu(inp, inplace=True)
    assert res_out.data_ptr() == inp.data_ptr()
    gems_assert_close(res_out, ref_out, dtype)


# -- gelu -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", APPROXIMATE)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_gelu(shape, device, dtype, approximate):
    inp = torch.randn(shape, dtype=dtype, device=device)
    ref_out = F.gelu(inp.double(), approximate=approximate)
    gems_assert_close(tunekit.gelu(inp, approximate=approximate), ref_out, dtype, atol=1e-4)
    assert every_candidate(gelu_op, GeluParams(inp, approximate), ref_out, dtype) >= 1


@pytest.mark.parametrize("approximate", APPROXIMATE)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_gelu_backward(shape, device, dtype, approximate):
    inp = torch.randn(shape, dtype=dtype, device=device)
    grad = torch.randn_like(inp)
    ref_in_grad = torch.ops.aten.gelu_backward(grad.double(), inp.double(), approximate=approximate)
    gems_assert_close(tunekit.gelu_backward(grad, inp, approximate), ref_in_grad, dtype)
    params = GeluBackwardParams(grad, inp, approximate)
    assert every_candidate(gelu_backward_op, params, ref_in_grad, dtype) >= 1


@pytest.mark.parametrize("approximate", APPROXIMATE)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(POINTWISE_SHAPES, QUICK_POINTWISE_SHAPES))
def test_accuracy_gelu_(shape, device, dtype, approximate):
    inp = torch.randn(shape, dtype=dtype, device=device)
    ref_out = torch.ops.aten.gelu_.default(inp.double(), approximate=approximate)
    res_out = tunekit.gelu(inp, approximate=approximate, inplace=True)
    assert res_out.data_ptr() == inp.data_ptr()
    gems_assert_close(res_out, ref_out, dtype)


# -- logsumexp (FlagGems' reduction conventions) ----------------------------------------------------
@pytest.mark.parametrize("keepdim, dim", KEEPDIM_DIMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(REDUCTION_SHAPES, QUICK_REDUCTION_SHAPES))
def test_accuracy_logsumexp(shape, device, dtype, dim, keepdim):
    inp = torch.randn(shape, dtype=dtype, device=device)
    ref_out = torch.logsumexp(inp.double(), dim=dim, keepdim=keepdim)
    torch_atol = 1e-4 if dtype == torch.float32 else torch_logsumexp_atol(inp)
    gems_assert_close(tunekit.logsumexp(inp, dim=dim, keepdim=keepdim), ref_out, dtype, atol=torch_atol)
    params = LogsumexpParams(inp, normalize_dims(dim, inp.dim()), keepdim)
    assert every_candidate(logsumexp_op, params, ref_out, dtype, torch_atol) >= 1


#: inputs whose torch logsumexp over dim 0 misses FlagGems' tolerance (found by search, exact in the dtype)
TORCH_MISSES = {
    torch.float16: [[-0.6982421875, 0.55712890625, 0.8974609375], [-0.60546875, 0.2098388671875, -0.103759765625]],
    torch.bfloat16: [[1.4765625, -0.1298828125, 0.310546875], [0.90234375, -2.125, 0.11474609375]],
}


@pytest.mark.parametrize("dtype", list(TORCH_MISSES), ids=str)
def test_torchs_own_16_bit_logsumexp_misses_flaggems_tolerance(dtype):
    """Why torch's candidate gets ``torch_logsumexp_atol``: a result near 0 (float16 0.042,
    bfloat16 -0.0024) comes out of torch's own CPU kernel further from float64 than FlagGems'
    tolerance allows (if torch computes it in float32 one day, the exception can go)."""
    x = torch.tensor(TORCH_MISSES[dtype], dtype=dtype)
    ref = torch.logsumexp(x.double(), 0)
    with pytest.raises(AssertionError):
        gems_assert_close(torch.logsumexp(x, 0), ref, dtype)
    gems_assert_close(torch.logsumexp(x, 0), ref, dtype, atol=torch_logsumexp_atol(x))
    params = LogsumexpParams(x, (0,), False)
    assert every_candidate(logsumexp_op, params, ref, dtype, torch_logsumexp_atol(x)) >= 1


@pytest.mark.parametrize("keepdim, dim", KEEPDIM_DIMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape, device", shapes(REDUCTION_SHAPES, QUICK_REDUCTION_SHAPES))
def test_accuracy_logsumexp_backward(shape, device, dtype, dim, keepdim):
    """The gradient ``dy * exp(x - lse)`` through autograd and each backward candidate, against
    float64 from the same (rounded) ``lse`` the forward returned, as autograd uses it."""
    inp = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    lse = tunekit.logsumexp(inp, dim=dim, keepdim=keepdim)
    grad = torch.randn_like(lse)
    (res_in_grad,) = torch.autograd.grad(lse, inp, grad)
    x = inp.detach()
    dims = normalize_dims(dim, x.dim())
    dy64, lse64 = grad.double(), lse.detach().double()
    if not keepdim:
        for d in dims:
            dy64, lse64 = dy64.unsqueeze(d), lse64.unsqueeze(d)
    ref_in_grad = dy64 * torch.exp(x.double() - lse64)
    gems_assert_close(res_in_grad, ref_in_grad, dtype)
    params = LogsumexpBackwardParams(grad, x, lse.detach(), dims, keepdim)
    assert every_candidate(logsumexp_backward_op, params, ref_in_grad, dtype) >= 1
