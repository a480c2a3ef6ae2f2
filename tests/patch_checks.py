"""What tests/test_patch*.py share: every attribute a patch may replace, torch's originals as they were when
this module was first imported (before any test patched anything), the fixture that checks each test leaves torch
as it found it, the candidate-run spies and the tolerances."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from op_spies import CandidateRuns
from tunekit.tunable.numerics import tolerance

patch_module = importlib.import_module("tunekit.torch_compat.patch")

MISSING = object()
SLOTS = {  # (owner, name) of everything a patch may replace, by op
    "silu": [(F, "silu"), (torch.nn.SiLU, "forward")],
    "gelu": [(F, "gelu"), (torch.nn.GELU, "forward")],
    "logsumexp": [(torch, "logsumexp"), (torch.Tensor, "logsumexp")],
    "rms_norm": [(F, "rms_norm"), (torch.nn.RMSNorm, "forward")],
    "gemm": [(F, "linear"), (torch, "matmul"), (torch.nn.Linear, "forward")],
}


def raw_state() -> dict:
    """Each slot's own entry (MISSING when inherited, as Tensor.logsumexp is), by (owner, name)."""
    return {(owner, name): vars(owner).get(name, MISSING) for slots in SLOTS.values() for owner, name in slots}


ORIGINAL = raw_state()  # taken at import, before any test patches anything
TORCH_SILU, TORCH_GELU, TORCH_LOGSUMEXP = F.silu, F.gelu, torch.logsumexp
TORCH_LINEAR = F.linear
TENSOR_LOGSUMEXP = torch.Tensor.logsumexp
ALL_OPS = ("silu", "gelu", "logsumexp", "silu_backward", "gelu_backward", "logsumexp_backward")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_torch_untouched():
    state = raw_state()
    for key, value in ORIGINAL.items():
        assert state[key] is value, f"{key[0]}.{key[1]} is not torch's original"
    assert "logsumexp" not in vars(torch.Tensor)


def patched_ops() -> set:
    """The ops whose every slot holds something else than torch's original."""
    state = raw_state()
    out = set()
    for op, slots in SLOTS.items():
        changed = [state[s] is not ORIGINAL[s] for s in slots]
        assert all(changed) or not any(changed), f"{op}: only some of its attributes are patched"
        if all(changed):
            out.add(op)
    return out


@pytest.fixture(autouse=True)
def torch_as_it_was():
    assert_torch_untouched()
    yield
    assert_torch_untouched()  # every test leaves torch as it found it


@pytest.fixture
def runs(monkeypatch):
    spies = CandidateRuns(monkeypatch, *ALL_OPS)
    yield spies
    spies.close()


def rand(shape, dtype, scale=3.0, **kw):
    return (torch.randn(shape) * scale).to(dtype).requires_grad_(kw.get("requires_grad", False))


def close(actual, expected, dtype, op=""):
    rtol, atol = tolerance(dtype)
    if op == "gelu" and dtype == torch.float32:
        atol = 8e-6  # tunekit's gelu float32 tolerance (tunekit/ops/gelu.py says why)
    torch.testing.assert_close(actual, expected, rtol=2 * rtol, atol=2 * atol)


def float64_refs(x):
    x64 = x.detach().double()
    return {"silu": x64 * torch.sigmoid(x64), "gelu": TORCH_GELU(x64), "gelu_tanh": TORCH_GELU(x64, approximate="tanh"),
            "lse1": torch.special.logsumexp(x64, 1), "lse01": torch.special.logsumexp(x64, (0, 1), keepdim=True)}
