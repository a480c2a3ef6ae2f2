"""tunekit's public functions under forward-mode AD and torch.func transforms give torch's results.

tunekit's kernels compute values only: a dual tensor's tangent would be dropped, and a functorch
transform's wrapped tensors (``vmap``, ``grad``, ``jvp``) have no data pointer to give a kernel.
Where a signature's choice is not torch's function, such calls go to torch's function
(``ops/_shared/arguments.computes``, ``ops/gemm/checks.pair``, the fast calls). Each case forces a
Triton choice (run in Triton's interpreter on the CPU; a CUDA device runs it compiled) and checks
that a plain call runs it, and that every transform gives torch's answer.
"""

import importlib

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import tunekit
from tunekit.backends import triton as triton_backend
from tunekit.tunable import results_store, validators
from tunekit.tunable.entries import CandidateRecord, Entry
from tunekit.tunable.registry import get_op

pytestmark = pytest.mark.skipif(triton_backend.kernel("activations", "silu_forward_kernel") is None,
                                reason="needs Triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
W = torch.rand(16, dtype=torch.float32) + 0.5
B = torch.randn(64, 32)

#: name: (op, tunekit's function, torch's function, input shape)
CASES = {
    "silu": ("silu", tunekit.silu, F.silu, (8, 16)),
    "gelu_tanh": ("gelu", lambda x: tunekit.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
                  (8, 16)),
    "logsumexp": ("logsumexp", lambda x: tunekit.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1), (8, 16)),
    "rms_norm": ("rms_norm", lambda x: tunekit.rms_norm(x, (16,), W.to(x.device), 1e-6),
                 lambda x: F.rms_norm(x, (16,), W.to(x.device), 1e-6), (8, 16)),
    "mm": ("mm", lambda x: tunekit.mm(x, B.to(x.device)), lambda x: torch.mm(x, B.to(x.device)), (32, 64)),
}


DY = torch.randn(8, 16)
DY_ROWS = torch.randn(8)


def _silu_gradient(dy, x):  # torch's own double-backward formula (aten.silu_backward has no forward AD)
    s = torch.sigmoid(x)
    return dy * s * (1 + x * (1 - s))


#: the public gradient functions, as functions of x (dy fixed; logsumexp's lse computed from x)
BACKWARD = {
    "silu_backward": ("silu_backward", lambda x: tunekit.silu_backward(DY.to(x.device), x),
                      lambda x: _silu_gradient(DY.to(x.device), x), (8, 16)),
    "gelu_backward": ("gelu_backward", lambda x: tunekit.gelu_backward(DY.to(x.device), x),
                      lambda x: torch.ops.aten.gelu_backward(DY.to(x.device), x), (8, 16)),
    "logsumexp_backward": ("logsumexp_backward",
                           lambda x: tunekit.logsumexp_backward(DY_ROWS.to(x.device), x, torch.logsumexp(x, -1), -1),
                           lambda x: DY_ROWS.to(x.device)[..., None] * torch.exp(x - torch.logsumexp(x, -1, keepdim=True)),
                           (8, 16)),
}
CASES_AND_GRADIENTS = {**CASES, **BACKWARD}


def force_triton(case, monkeypatch, kind="triton"):
    """Tune the case's signature, then store a candidate of ``kind`` (in its name) that supports it as
    its choice; the candidate's runs, counted (a CUDA C choice runs through its cached runner: not
    counted)."""
    name, ours, theirs, shape = CASES_AND_GRADIENTS[case]
    op = get_op(name)
    seen = []
    resolve = op.resolve
    monkeypatch.setattr(op, "resolve", lambda params, *a, **k: seen.append(params) or resolve(params, *a, **k))
    ours(torch.randn(shape, device=DEVICE))
    params = seen[0]
    choice = next(c for c in op.candidates if kind in c.name and c.supports(params) is None)
    results_store().put(Entry(op=op.name, signature=params.signature(), device=validators.device_name(params.device),
                              choice=choice.name, complete=True,
                              validators=validators.validators_for(params.device, op.candidates),
                              candidates={choice.name: CandidateRecord("chosen", 0.01)}, tuned_at=0.0,
                              tuning_ms=1.0))
    op.forget()
    runs = []
    run = choice.run
    monkeypatch.setattr(choice, "run", lambda *a, **k: runs.append(1) or run(*a, **k))
    x = torch.randn(shape, device=DEVICE)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert runs or kind != "triton", f"premise: the plain call runs the forced {choice.name}"
    return runs


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def check_dual(ours, theirs, x, t):
    """A dual tensor's primal and tangent through ``ours`` are torch's."""
    with fwAD.dual_level():
        got, want = (fwAD.unpack_dual(f(fwAD.make_dual(x, t))) for f in (ours, theirs))
    assert got.tangent is not None, "the tangent was dropped"
    close(got.primal, want.primal)
    close(got.tangent, want.tangent)


def check_vmap(ours, theirs, shape):
    batch = torch.randn(3, *shape, device=DEVICE)
    close(torch.func.vmap(ours)(batch), torch.func.vmap(theirs)(batch))


@pytest.mark.parametrize("case", list(CASES))
def test_a_dual_tensors_tangent_is_torchs(case, monkeypatch):
    force_triton(case, monkeypatch)
    _, ours, theirs, shape = CASES[case]
    check_dual(ours, theirs, torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("transform", ["vmap", "jvp", "grad"])
def test_torch_func_transforms_give_torchs_results(case, transform, monkeypatch):
    force_triton(case, monkeypatch)
    _, ours, theirs, shape = CASES[case]
    x, t = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
    if transform == "vmap":
        check_vmap(ours, theirs, shape)
    elif transform == "jvp":
        for got, want in zip(torch.func.jvp(ours, (x,), (t,)), torch.func.jvp(theirs, (x,), (t,))):
            close(got, want)
    else:
        close(torch.func.grad(lambda z: ours(z).sum())(x), torch.func.grad(lambda z: theirs(z).sum())(x))


@pytest.mark.parametrize("case", list(BACKWARD))
@pytest.mark.parametrize("transform", ["dual", "vmap"])
def test_the_gradient_functions_under_forward_ad_and_vmap_give_torchs_results(case, transform, monkeypatch):
    force_triton(case, monkeypatch)
    _, ours, theirs, shape = BACKWARD[case]
    if transform == "vmap":
        check_vmap(ours, theirs, shape)
    else:
        check_dual(ours, theirs, torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["silu", "gelu_tanh"])
def test_with_a_cuda_c_choice_every_transform_gives_torchs_results(case, monkeypatch):
    """A CUDA C choice has a runner the C++ fast call runs: it must refuse a dual tensor and a
    transform's wrapped tensors too."""
    force_triton(case, monkeypatch, kind="_f32")
    name, ours, theirs, shape = CASES[case]
    x, t = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
    op = get_op(name)
    assert (op.fast_call(x) if case == "silu" else op.fast_call(x, "tanh")) is not None, "premise: the runner is cached"
    check_dual(ours, theirs, x, t)
    check_vmap(ours, theirs, shape)
    close(torch.func.jvp(ours, (x,), (t,))[1], torch.func.jvp(theirs, (x,), (t,))[1])
    close(torch.func.grad(lambda z: ours(z).sum())(x), torch.func.grad(lambda z: theirs(z).sum())(x))


def test_plain_calls_after_a_transform_run_the_choice_again(monkeypatch):
    runs = force_triton("silu", monkeypatch)
    before = len(runs)
    torch.func.vmap(tunekit.silu)(torch.randn(2, 8, 16, device=DEVICE))
    assert len(runs) == before  # torch's function ran under vmap
    tunekit.silu(torch.randn(8, 16, device=DEVICE))
    assert len(runs) == before + 1


importlib.import_module("tunekit.ops.silu")  # the families registered (get_op above)
