"""tunekit.silu: every candidate against a float64 reference, the public API's semantics, tuning on real data."""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.ops.silu import SiluParams, silu_op
from tunekit.tunable import results_store, tuning
from tunekit.tunable.numerics import compare, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [(1,), (7,), (1003,), (4096,), (2**20 + 3,), (33, 17), (5, 1021), ()]


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


def candidate_cases():
    """(candidate, dtype, device) for every candidate and every input kind it is meant to run."""
    cases = []
    for c in silu_op.candidates:
        dtype = getattr(c, "dtype", None)
        if dtype is None:  # the torch candidates: every dtype, every device
            for d in DTYPES:
                cases += [pytest.param(c.name, d, "cpu", id=f"{c.name}-{d}-cpu"),
                          pytest.param(c.name, d, "cuda", id=f"{c.name}-{d}-cuda", marks=pytest.mark.gpu)]
        else:
            cases.append(pytest.param(c.name, dtype, "cuda", id=f"{c.name}-cuda", marks=pytest.mark.gpu))
    return cases


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, dtype, device", candidate_cases())
def test_every_candidate_matches_float64(name, dtype, device, shape):
    c = silu_op.candidate(name)
    x = inputs(shape, dtype, device)
    p = SiluParams(x, torch.full_like(x, float("nan")))
    assert c.supports(p) is None
    out = c.run(p)
    assert out.data_ptr() == p.out.data_ptr()
    check(out, x)
    check(c.run(SiluParams(x)), x)
    y = x.clone()
    c.run(SiluParams(y, y))  # in place
    check(y, x)


@pytest.mark.parametrize("name, dtype, device", candidate_cases())
def test_every_candidate_on_awkward_layouts_and_values(name, dtype, device):
    c = silu_op.candidate(name)
    base = inputs((4099,), dtype, device)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 20, -20, 100, -100, 0.0, -0.0, 1e-7],
                           dtype=torch.float32, device=device).to(dtype)
    cases = [
        base[1:],                                    # misaligned for 16-byte vectors
        base[3:1003],
        base[8:4099],                                # aligned again (for 2-byte types), odd length
        inputs((64, 33), dtype, device).t(),         # non-contiguous
        inputs((64, 33), dtype, device)[:, 1::2],    # strided
        torch.empty(0, 5, device=device, dtype=dtype),
        special,
    ]
    ran = 0
    for x in cases:
        out = torch.full_like(x, float("nan"))
        why = c.supports(SiluParams(x, out))
        if why is not None:  # only layouts a CUDA kernel cannot take may be declined
            assert "aligned" in why or "contiguous" in why, why
            continue
        assert c.run(SiluParams(x, out)).data_ptr() == out.data_ptr()
        check(out, x)
        ran += 1
    assert ran >= 3


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


def test_bad_arguments_get_clear_errors():
    x = torch.randn(10)
    with pytest.raises(TypeError, match="floating-point"):
        tunekit.silu(torch.arange(10))
    with pytest.raises(TypeError, match="must be a tensor"):
        tunekit.silu([1.0, 2.0])
    with pytest.raises(ValueError, match="shape, dtype and device"):
        tunekit.silu(x, out=torch.empty(11))
    with pytest.raises(ValueError, match="shape, dtype and device"):
        tunekit.silu(x, out=torch.empty(10, dtype=torch.float64))
    with pytest.raises(ValueError, match="either out= or inplace"):
        tunekit.silu(x, out=torch.empty(10), inplace=True)
    buf = torch.randn(20)
    with pytest.raises(ValueError, match="partially overlaps"):
        tunekit.silu(buf[:10], out=buf[5:15])
    with pytest.raises(ValueError, match="overlapping elements"):
        tunekit.silu(x, out=torch.empty(1).expand(10))


def test_float64_runs_the_default_correctly():
    x = torch.randn(100, dtype=torch.float64)
    torch.testing.assert_close(tunekit.silu(x), x * torch.sigmoid(x))


def test_autograd_falls_back_to_torch_with_correct_gradients():
    x = torch.randn(50, dtype=torch.float64, requires_grad=True)
    y = tunekit.silu(x)
    y.sum().backward()
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(x.grad, s * (1 + x.detach() * (1 - s)))
    assert torch.autograd.gradcheck(tunekit.silu, (torch.randn(8, dtype=torch.float64, requires_grad=True),))
    leaf = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError):
        tunekit.silu(leaf, inplace=True)  # as F.silu: a leaf that needs grad cannot be changed in place


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
    for name in ("silu_f16x8_pack", "silu_f16"):
        out = torch.full_like(x, float("nan"))
        silu_op.candidate(name).run(SiluParams(x, out))
        for sl in (slice(0, 4096), slice(n - 4096, n)):
            check(out[sl], x[sl])
        del out
