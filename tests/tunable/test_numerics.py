"""numerics.compare: tolerances per dtype, NaN and infinity placement, unwritten outputs."""

import pytest
import torch

from tunekit.tunable.numerics import TOLERANCES, compare, tolerance

nan, inf = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_within_and_beyond_tolerance(dtype):
    rtol, atol = TOLERANCES[dtype]
    e = torch.tensor([1.0, -3.0, 100.0], dtype=torch.float64)
    inside = e * (1 + rtol / 2)
    outside = e * (1 + rtol * 4)
    assert compare(outside.to(torch.float64), e, (rtol, atol)) is not None
    assert compare(inside.to(torch.float64), e, (rtol, atol)) is None
    # and the same through the dtype's own tolerance: one rounding step is always accepted
    one_ulp = e.to(dtype) * (1 + torch.finfo(dtype).eps)
    assert compare(one_ulp, e.to(dtype)) is None


def test_nan_must_sit_where_the_reference_has_nan():
    e = torch.tensor([1.0, nan, 2.0])
    assert compare(torch.tensor([1.0, nan, 2.0]), e) is None
    assert "NaN where the reference is not" in compare(torch.tensor([nan, nan, 2.0]), e)
    assert "not NaN where the reference is NaN" in compare(torch.tensor([1.0, 0.0, 2.0]), e)


def test_infinities_must_match_in_place_and_sign():
    e = torch.tensor([inf, -inf, 1.0])
    assert compare(torch.tensor([inf, -inf, 1.0]), e) is None
    assert "infinities" in compare(torch.tensor([-inf, -inf, 1.0]), e)
    assert "infinities" in compare(torch.tensor([inf, -inf, inf]), e)


def test_reports_the_worst_element_and_handles_0d_and_empty():
    e = torch.zeros(3, 4)
    a = e.clone()
    a[2, 1] = 1.0
    assert "worst at (2, 1)" in compare(a, e)
    assert compare(torch.tensor(1.0), torch.tensor(1.0)) is None
    assert compare(torch.tensor(2.0), torch.tensor(1.0)) is not None
    assert compare(torch.empty(0, 3), torch.empty(0, 3)) is None
    assert "shape" in compare(torch.empty(2), torch.empty(3))
    assert "dtype" in compare(torch.empty(2, dtype=torch.float16), torch.empty(2))


def test_integer_outputs_compare_exactly():
    assert tolerance(torch.int32) == (0.0, 0.0)
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2])) is None
    assert "1 of 2" in compare(torch.tensor([1, 3]), torch.tensor([1, 2]))


def test_the_compare_warm_up_is_every_ops_default_and_loads_nothing_on_the_cpu(monkeypatch):
    """warm_compare (the check's first kernel loads, off the budget) is a TunableOp's default
    warm_numerics; CPU tensors have nothing to load, so it computes nothing there."""
    from fakes import ScaleParams, make_op, FakeClock
    from tunekit.tunable import numerics

    assert make_op(FakeClock(), {"ref": 1.0}).warm_numerics is numerics.warm_compare
    ran = []
    monkeypatch.setattr(numerics, "compare", lambda *a: ran.append(a))
    numerics.warm_compare(ScaleParams(torch.randn(8)))
    assert not ran


@pytest.mark.gpu
def test_the_compare_warm_up_runs_once_per_cuda_device_and_dtype(monkeypatch):
    from fakes import ScaleParams
    from tunekit.tunable import numerics

    monkeypatch.setattr(numerics, "_warmed", set())
    ran = []
    real = numerics.compare
    monkeypatch.setattr(numerics, "compare", lambda *a: ran.append(a[0].dtype) or real(*a))
    x = torch.randn(8, device="cuda", dtype=torch.float16)
    numerics.warm_compare(ScaleParams(x))
    numerics.warm_compare(ScaleParams(x))
    numerics.warm_compare(ScaleParams(x.float()))
    assert ran == [torch.float16, torch.float32]
