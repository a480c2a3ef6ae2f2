"""Fit the normal-tail approximation that the 16-bit GELU(erf) kernels use (kernels/cuda/elementwise.cuh,
``fast_normal_cdf``), and print its constants. Needs numpy and scipy (not tunekit's dependencies: this
is a one-off derivation, kept so the constants can be re-derived; tests/kernels/test_normal_tail.py
checks the constants in the source without it).

The form, for z = |x| >= 0:

    Phi(-z) = t * 2^(-z^2 log2(e) / 2 + P(t)),   t = 1 / (1 + p z),   P a polynomial of degree 5,

i.e. P(t) ~ log2(Phi(-z) e^(z^2/2) / t). The fit minimises the largest error of P, which is the
largest *relative* error of Phi(-z) (times ln 2), over the range of z where the storage type can
hold a nonzero x Phi(x):

- float16: z <= 6 (|x| Phi(-|x|) is below half of float16's smallest subnormal beyond ~5.8);
- bfloat16: z <= 13.3 (beyond ~13.2 the fp32 result is subnormal, and the kernels flush it to zero).

Abramowitz & Stegun 7.1.26, which the kernels used before, bounds the *absolute* error (1.5e-7);
its relative error in the tail grows to 0.05% at x = -4, 0.16% at -5 and 2% at -10: several
bfloat16 ulps for x < -6. The relative fit keeps every stored result well inside one ulp.

    python scripts/fit_normal_tail.py
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.special import log_ndtr

DEGREE = 5
RANGES = {"float16": 6.0, "bfloat16": 13.3}


def log2_target(t: np.ndarray, p: float) -> np.ndarray:
    z = (1.0 / t - 1.0) / p
    return (log_ndtr(-z) + z * z / 2) / np.log(2) - np.log2(t)


def minimax(p: float, z_max: float, points: int = 2000) -> tuple[float, np.ndarray]:
    """Coefficients (t^0 first) minimising max |P(t) - target| on t in [1/(1 + p z_max), 1], by
    linear programming over Chebyshev points; returns (largest relative error of Phi, coefficients)."""
    t_min = 1.0 / (1.0 + p * z_max)
    k = np.arange(points)
    t = (t_min + 1) / 2 + (1 - t_min) / 2 * np.cos(np.pi * (k + 0.5) / points)
    f = log2_target(t, p)
    v = np.vander(t, DEGREE + 1, increasing=True)
    ones = np.ones((points, 1))
    cost = np.zeros(DEGREE + 2)
    cost[-1] = 1.0
    result = linprog(cost, A_ub=np.block([[v, -ones], [-v, -ones]]), b_ub=np.concatenate([f, -f]),
                     bounds=[(None, None)] * (DEGREE + 1) + [(0, None)], method="highs")
    if result.status != 0:
        return float("inf"), np.zeros(DEGREE + 1)
    return result.x[-1] * np.log(2), result.x[:-1]


def best_p(z_max: float) -> float:
    grid = np.geomspace(0.05, 5, 60)
    p = min(grid, key=lambda q: minimax(q, z_max, 400)[0])
    for width in (0.1, 0.01):
        grid = np.linspace(p * (1 - width), p * (1 + width), 41)
        p = min(grid, key=lambda q: minimax(q, z_max, 800)[0])
    return float(np.float32(p))


def fp32_check(p: float, coeffs: np.ndarray, z_max: float) -> float:
    """Largest relative error of Phi(-z) with the constants rounded to fp32 and the arithmetic in fp32
    (exp2 and the reciprocal exact, then rounded: the hardware's approximations add ~2^-22 each)."""
    f32 = np.float32
    z = np.linspace(0, z_max, 200001).astype(f32)
    x = -z
    t = (f32(1) / (f32(p) * z + f32(1))).astype(f32)
    poly = f32(coeffs[-1])
    for c in coeffs[-2::-1]:
        poly = (poly * t + f32(c)).astype(f32)
    exponent = (x * x * f32(-0.72134752044448170368) + poly).astype(f32)
    phi = (t * np.exp2(exponent.astype(np.float64)).astype(f32)).astype(np.float64)
    exact = np.exp(log_ndtr(x.astype(np.float64)))
    return float(np.max(np.abs(phi / exact - 1)))


def main() -> None:
    for storage, z_max in RANGES.items():
        p = best_p(z_max)
        error, coeffs = minimax(p, z_max, 6000)
        print(f"{storage}: z <= {z_max}, p = {p!r}, fit error {error:.3g}, fp32 {fp32_check(p, coeffs, z_max):.3g}")
        print("  P(t), t^0 first: " + ", ".join(f"{float(np.float32(c))!r}f" for c in coeffs))


if __name__ == "__main__":
    main()
