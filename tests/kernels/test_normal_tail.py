"""The constants of ``fast_normal_tail`` (kernels/cuda/elementwise.cuh), which the 16-bit GELU(erf)
kernels use for Phi(-|x|): read from the source and evaluated here in float64 and in fp32 against
the exact tail (``torch.special.log_ndtr``). The kernels themselves are tested on the GPU
(tests/ops/test_gelu.py, the far-tail ulp test)."""

import re

import pytest
import torch

from tunekit.backends import nvrtc

#: storage type -> (fit struct, the range of |x| it must cover, bound on the relative error in
#: float64, in fp32 arithmetic); the bounds are the fit's (scripts/fit_normal_tail.py) with margin,
#: and all far below an ulp: 2^-11 (float16), 2^-8 (bfloat16)
FITS = {
    "float16": ("NormalTailF16", 6.0, 2e-6, 6e-6),
    "bfloat16": ("NormalTailBF16", 13.3, 8e-6, 3e-5),
}
LOG2E_HALF = -0.72134752044448170368


def constants(struct: str) -> dict[str, float]:
    text = nvrtc.source("elementwise.cuh")
    body = re.search(r"struct " + struct + r" \{(.*?)\};", text, re.S)
    assert body, f"{struct} not found in elementwise.cuh"
    values = dict(re.findall(r"\b(p|c[0-5]) = (-?[0-9.e+-]+)f", body.group(1)))
    assert sorted(values) == ["c0", "c1", "c2", "c3", "c4", "c5", "p"], values
    return {k: float(v) for k, v in values.items()}


def tail(z: torch.Tensor, k: dict[str, float], dtype) -> torch.Tensor:
    """The kernel's formula, every operation rounded to ``dtype`` (exp2 and the reciprocal exact)."""
    z = z.to(dtype)
    c = {name: torch.tensor(v, dtype=dtype) for name, v in k.items()}
    t = 1 / (c["p"] * z + 1)
    poly = c["c5"]
    for name in ("c4", "c3", "c2", "c1", "c0"):
        poly = poly * t + c[name]
    exponent = z * z * torch.tensor(LOG2E_HALF, dtype=dtype) + poly
    return (t * torch.exp2(exponent)).double()


@pytest.mark.parametrize("storage", FITS)
def test_relative_error_over_the_whole_range_of_the_storage_type(storage):
    struct, z_max, bound64, bound32 = FITS[storage]
    k = constants(struct)
    z = torch.linspace(0, z_max, 400_001, dtype=torch.float64)
    exact = torch.special.log_ndtr(-z).exp()
    error64 = (tail(z, k, torch.float64) / exact - 1).abs().max().item()
    error32 = (tail(z, k, torch.float32) / exact - 1).abs().max().item()
    assert error64 <= bound64, (storage, error64)
    assert error32 <= bound32, (storage, error32)


def test_the_textbook_form_it_replaces_fails_the_same_bound():
    """Abramowitz & Stegun 7.1.26 (the backward's fast_normal_cdf) has a small absolute but a large
    relative error in the tail: the check above would catch a return to it."""
    z = torch.linspace(0, 13.3, 100_001, dtype=torch.float64)
    t = 1 / (1 + 0.3275911 / 2**0.5 * z)
    half_poly = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
    approx = half_poly * torch.exp2(z * z * LOG2E_HALF)
    error = (approx / torch.special.log_ndtr(-z).exp() - 1).abs().max().item()
    assert error > 1e-2
