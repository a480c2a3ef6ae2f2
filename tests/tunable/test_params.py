"""Params helpers: signatures, exact-layout proxies, NaN-filled trial outputs."""

import math

import pytest
import torch

from tunekit.tunable.params import clone_exact, empty_exact, make_trial, tensor_signature

from fakes import ScaleParams


def test_signature_names_dtype_shape_layout_alignment_and_device():
    x = torch.randn(4, 6)
    assert tensor_signature(x) == "f32[4,6]@0"
    assert tensor_signature(x, shape_matters=False) == "f32[n=24]@0"
    assert tensor_signature(x.t()) == "f32[6,4]/s1,6@0"
    assert tensor_signature(x.view(-1)[1:]) == "f32[23]@4"
    assert tensor_signature(torch.randn(8, dtype=torch.float16)[3:]) == "f16[5]@6"
    assert ScaleParams(x).signature() == "x=f32[4,6]@0 out=new cpu"
    assert ScaleParams(x, x).signature() == "x=f32[4,6]@0 out=inplace cpu"


@pytest.mark.parametrize("make", [
    lambda: torch.randn(7, 5),
    lambda: torch.randn(7, 5).t(),
    lambda: torch.randn(64, dtype=torch.float16)[3:40],
    lambda: torch.randn(10, 12)[1::2, 3:],
    lambda: torch.randn(5, 1).expand(5, 4),
    lambda: torch.randn(0, 3),
    lambda: torch.tensor(3.5),
])
def test_clone_exact_keeps_layout_alignment_and_values(make):
    t = make()
    c = clone_exact(t)
    assert c.shape == t.shape and c.stride() == t.stride() and c.dtype == t.dtype
    if t.numel():
        assert c.data_ptr() % 16 == t.data_ptr() % 16
        assert c.data_ptr() != t.data_ptr()
    torch.testing.assert_close(c, t, rtol=0, atol=0)
    e = empty_exact(t)
    assert e.stride() == t.stride() and (not t.numel() or e.data_ptr() % 16 == t.data_ptr() % 16)


def test_trial_outputs_are_nan_and_inputs_shared_read_only():
    x = torch.randn(100)
    trial = make_trial(ScaleParams(x))
    assert trial.x is x
    assert trial.out.shape == x.shape and torch.isnan(trial.out).all()


def test_trial_copies_a_given_out_layout():
    x = torch.randn(10, 12)
    out = torch.empty(12, 10).t()
    trial = make_trial(ScaleParams(x, out))
    assert trial.out.stride() == out.stride() and trial.out.data_ptr() != out.data_ptr()
    assert torch.isnan(trial.out).all()


def test_trial_of_inplace_params_works_on_a_copy():
    x = torch.randn(100)
    before = x.clone()
    trial = make_trial(ScaleParams(x, x))
    assert trial.out is trial.x and trial.x.data_ptr() != x.data_ptr()
    trial.x.mul_(5)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    assert ScaleParams(x, x).mutated() == ("x",)
    assert ScaleParams(x).mutated() == ()


def test_copy_inputs_gives_independent_input_sets():
    x = torch.randn(100)
    trial = make_trial(ScaleParams(x), copy_inputs=True)
    assert trial.x.data_ptr() != x.data_ptr()
    torch.testing.assert_close(trial.x, x, rtol=0, atol=0)


def test_spec_and_bytes_moved():
    x = torch.randn(4, 6, dtype=torch.float16)[:, 1:]
    p = ScaleParams(x)
    spec = p.spec()
    assert spec["x"] == {"shape": [4, 5], "stride": [6, 1], "dtype": "float16", "align": 2, "device": "cpu"}
    assert spec["out"] is None
    assert p.bytes_moved() == 2 * 20 * 2
    assert not math.isnan(p.bytes_moved())
