"""torch's own OpInfo samples (``op_db``) for the ops tunekit stands in for beyond the activations and
logsumexp (``test_opinfo.py``): ``mm``, ``addmm`` (and its ``decomposed`` variant), ``bmm``,
``baddbmm``, ``nn.functional.linear``, ``matmul`` and ``nn.functional.rms_norm``, through tunekit's
public functions with each sample's arguments:

- float dtypes: torch's values within tolerance, and torch's gradients for every input that requires
  grad (each tensor argument, not only the first);
- every other dtype: torch's outcome (the value, or the same exception type);
- the OpInfos' error inputs: torch's exception type and message;
- ``out=`` (where tunekit's function takes it): NaN-filled of the result's layout, empty, and one
  torch resizes with a warning: torch's outcome, and the result is ``out`` itself;
- ``tunekit.patch(["gemm"])`` / ``(["rms_norm"])``: ``F.linear``, ``torch.matmul`` and ``F.rms_norm``
  called while patched give the unpatched functions' values, gradients and exceptions, and tunekit's
  candidates ran for the float samples.

On the CPU, tuning runs as everywhere in the tests (each test its own results file); the GEMM samples
are small (5 to 10 rows), so the Triton candidates run in the interpreter within seconds.
"""


import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("expecttest")
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

import tunekit  # noqa: E402
from elementwise_checks import assert_same_outcome, outcome  # noqa: E402
from op_spies import CandidateRuns  # noqa: E402
from opinfo_db import ALL_DTYPES, OP_DB  # noqa: E402
from tunekit.tunable.numerics import compare, tolerance  # noqa: E402

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
#: OpInfo name -> (tunekit's function, torch's function, tunekit's function takes out=)
PUBLIC = {
    "mm": (tunekit.mm, torch.mm, True),
    "addmm": (tunekit.addmm, torch.addmm, True),
    "bmm": (tunekit.bmm, torch.bmm, True),
    "baddbmm": (tunekit.baddbmm, torch.baddbmm, True),
    "nn.functional.linear": (tunekit.linear, F.linear, False),
    "matmul": (tunekit.matmul, torch.matmul, True),
    "nn.functional.rms_norm": (tunekit.rms_norm, F.rms_norm, False),
}
#: bmm's "triton_optimized" variant is Inductor's sample set for its own kernel: no out=, no autograd
OPINFOS = [op for op in OP_DB if op.name in PUBLIC and op.variant_test_name != "triton_optimized"]
IDS = [op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") for op in OPINFOS]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def samples(op, device, dtype, requires_grad=False):
    return [(s.input, tuple(s.args), dict(s.kwargs)) for s in op.sample_inputs(device, dtype, requires_grad=requires_grad)]


def _tensors(x, args, kwargs) -> list:
    return [t for t in (x, *args, *kwargs.values()) if isinstance(t, torch.Tensor)]


def _tol(dtype) -> tuple[float, float]:
    """Twice tunekit's tolerance for the dtype (both results are within it of the exact value), the
    absolute part 8x more for the sums of products (the samples' reductions run over 2 to 25 terms)."""
    rtol, atol = tolerance(dtype)
    return 2 * rtol, 16 * atol


def _fresh(x, args, kwargs):
    """Copies of the sample's tensors with the same requires_grad (each call its own leaves)."""
    copy = lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return copy(x), tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


def check_sample(ours_fn, theirs_fn, x, args, kwargs, what):
    """``ours_fn`` on one sample: ``theirs_fn``'s outcome, and its gradients where inputs require grad."""
    xt, at, kt = _fresh(x, args, kwargs)
    xo, ao, ko = _fresh(x, args, kwargs)
    theirs = outcome(theirs_fn, xt, *at, **kt)
    ours = outcome(ours_fn, xo, *ao, **ko)
    if theirs.error is not None or x.dtype not in FLOATS:
        assert_same_outcome(ours, theirs, what=what)
        return
    assert ours.error is None, f"{what}: {ours.error!r}"
    assert (ours.result.shape, ours.result.dtype) == (theirs.result.shape, theirs.result.dtype), what
    tol = _tol(x.dtype)
    assert compare(ours.result, theirs.result, tol) is None, f"{what}: {compare(ours.result, theirs.result, tol)}"
    leaves_t = [t for t in _tensors(xt, at, kt) if t.requires_grad]
    if leaves_t:
        dy = torch.randn_like(theirs.returned)
        want = torch.autograd.grad(theirs.returned, leaves_t, dy)
        got = torch.autograd.grad(ours.returned, [t for t in _tensors(xo, ao, ko) if t.requires_grad], dy)
        for i, (g, w) in enumerate(zip(got, want)):
            assert compare(g, w, tol) is None, f"{what} gradient {i}: {compare(g, w, tol)}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_samples_give_torchs_values_and_gradients(op, dtype, device):
    grad = op.supports_autograd and dtype in op.supported_backward_dtypes(torch.device(device).type)
    for i, (x, args, kwargs) in enumerate(samples(op, device, dtype, requires_grad=grad)):
        check_sample(*PUBLIC[op.name][:2], x, args, kwargs,
                     f"sample {i} {list(x.shape)} {[getattr(a, 'shape', a) for a in args]} {kwargs}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_every_other_dtype_gives_torchs_outcome(op, device):
    """Integers, bool, complex: torch's value or exception type (tunekit computes none of them)."""
    for dtype in sorted(ALL_DTYPES - set(FLOATS), key=str):
        for i, (x, args, kwargs) in enumerate(samples(op, device, dtype)):
            check_sample(*PUBLIC[op.name][:2], x, args, kwargs, f"{dtype} sample {i} {list(x.shape)}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", [op for op in OPINFOS if op.error_inputs_func is not None],
                         ids=lambda op: op.name)
def test_error_inputs_raise_torchs_exception(op, device):
    ours_fn = PUBLIC[op.name][0]
    for e in op.error_inputs(device):
        s = e.sample_input
        with pytest.raises(e.error_type, match=e.error_regex):
            ours_fn(s.input, *s.args, **s.kwargs)


def _out_forms(result):
    """out= tensors: the result's layout NaN-filled, empty, another shape (torch resizes, warning)."""
    fill = float("nan") if result.is_floating_point() or result.is_complex() else 0
    return {"same": lambda: torch.full_like(result, fill), "empty": lambda: result.new_empty(0),
            "resized": lambda: torch.full((result.numel() + 3,), fill, dtype=result.dtype, device=result.device)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=str)
@pytest.mark.parametrize("op", [op for op in OPINFOS if op.supports_out and PUBLIC[op.name][2]],
                         ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""))
def test_out_forms_give_torchs_outcome(op, dtype, device):
    ours_fn, theirs_fn, _ = PUBLIC[op.name]
    for i, (x, args, kwargs) in enumerate(samples(op, device, dtype)):
        reference = outcome(theirs_fn, x, *args, **kwargs)
        if reference.error is not None:
            continue
        for form, make in _out_forms(reference.result).items():
            out_t, out_o = make(), make()
            theirs = outcome(theirs_fn, x, *args, **kwargs, out=out_t)
            ours = outcome(ours_fn, x, *args, **kwargs, out=out_o)
            what = f"sample {i} {list(x.shape)} out {form}"
            assert_same_outcome(ours, theirs, _tol(dtype) if dtype in FLOATS else None, what)
            if ours.error is None:
                assert ours.returned is out_o, f"{what}: out= returns out itself"


# -- tunekit.patch() ------------------------------------------------------------------------------
#: OpInfo name -> (the patch family, torch's function looked up at call time, the op whose runs prove tunekit ran)
PATCHED = {"nn.functional.linear": ("gemm", lambda *a, **k: F.linear(*a, **k), "mm"),
           "matmul": ("gemm", lambda *a, **k: torch.matmul(*a, **k), "mm"),
           "nn.functional.rms_norm": ("rms_norm", lambda *a, **k: F.rms_norm(*a, **k), "rms_norm")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("op", [op for op in OPINFOS if op.name in PATCHED], ids=lambda op: op.name)
def test_patched_torch_functions_give_torchs_values_and_gradients(op, dtype, device, monkeypatch):
    """torch's functions while patched, against the originals: the same values, gradients and
    exception types; and tunekit computed the float samples (its candidates ran)."""
    family, patched, tunable = PATCHED[op.name]
    original = PUBLIC[op.name][1]  # bound at import, before any patch
    runs = CandidateRuns(monkeypatch, tunable)
    grad = dtype.is_floating_point and op.supports_autograd
    try:
        with tunekit.patch([family]):
            for i, (x, args, kwargs) in enumerate(samples(op, device, dtype, requires_grad=grad)):
                check_sample(patched, original, x, args, kwargs, f"patched sample {i} {list(x.shape)}")
    finally:
        runs.close()
    assert (runs.count(tunable) > 0) == dtype.is_floating_point, runs.runs.keys()
