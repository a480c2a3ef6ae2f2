"""What the logsumexp tests share: comparing a reduction's result with its float64 reference."""

import torch

from tunekit.tunable.numerics import compare, tolerance


def close(actual, expected, dtype, x=None):
    """Within the dtype's tolerance (rtol x 1.5); for logsumexp values (``x`` given) also within
    rtol x max|x|: lse = max + log(sum) cancels when the result is near 0, so its error scales with
    the inputs' magnitude, not the result's (torch's own float16 result is off by 4e-4 at lse ~ 0.03)."""
    rtol, atol = tolerance(dtype)
    if x is not None:
        finite = x[torch.isfinite(x)]
        atol = max(atol, rtol * float(finite.abs().max())) if finite.numel() else atol
    problem = compare(actual, expected.to(dtype), (rtol * 1.5, atol))
    assert problem is None, problem
