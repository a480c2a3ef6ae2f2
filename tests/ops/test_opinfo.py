"""torch's own OpInfo samples (``torch.testing._internal.common_methods_invocations.op_db``:
``nn.functional.silu`` and its complex variant, ``nn.functional.gelu``, ``logsumexp``) through tunekit:
the same values as torch (within tolerance), the same gradients, the same exception types.

- the public functions with each sample's arguments, silu's in place form and gelu's / logsumexp's
  ``out=`` (a NaN-filled one of the result's layout, an empty one, one torch resizes with a warning);
  the dtypes the OpInfo supports (values and gradients) and every other dtype (torch's outcome,
  value or exception); the OpInfo's error inputs (its exception type and message);
- ``tunekit.patch()``: torch's functions called while patched, tunekit taking the float samples;
- ``torch.compile(fullgraph=True)`` over the public functions and ``torch.library.opcheck`` of the
  custom ops: a representative subset on the CPU, every sample under ``gpu``;
- every candidate forced in turn (its ``run`` on the params it supports, forward and backward)
  against torch: on the GPU every CUDA C and Triton candidate, on the CPU the Triton ones in the
  interpreter. On the GPU the samples include the OpInfos' reference inputs (large, extremal).

``torch.testing._internal`` needs ``expecttest``; the module is skipped without it.
"""

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("expecttest")
#: the Triton interpreter's numpy warnings while it runs candidates on the CPU
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

import tunekit  # noqa: E402
from elementwise_checks import INTERPRETER_MAX_ELEMENTS, assert_same_outcome, outcome  # noqa: E402
from opinfo_db import ALL_DTYPES, OP_DB  # noqa: E402
from op_spies import CandidateRuns  # noqa: E402
from tunekit.ops.gelu import GeluBackwardParams, GeluParams, gelu_backward_op, gelu_op, gelu_tolerance  # noqa: E402
from tunekit.ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, logsumexp_backward_op,  # noqa: E402
                                   logsumexp_op, normalize_dims)
from tunekit.ops.silu import SiluBackwardParams, SiluParams, silu_backward_op, silu_op  # noqa: E402
from tunekit.tunable.numerics import compare, tolerance  # noqa: E402

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_TORCH_SILU, _TORCH_GELU, _TORCH_LOGSUMEXP = F.silu, F.gelu, torch.logsumexp  # before any patch


@dataclass(frozen=True)
class Spec:
    """How tunekit stands for one OpInfo: its public function, torch's function looked up at call
    time (patched while a patch is active), the tunable ops and how a sample becomes their params."""

    name: str
    public: Callable
    patched: Callable
    ops: tuple
    forward: Callable      # forward(x, args, kwargs) -> params
    backward: Callable     # backward(dy, x, y, args, kwargs) -> params

    def tol(self, x):
        if "gelu" in self.name:
            return gelu_tolerance(GeluParams(x))
        return tolerance(x.dtype)


def _lse_dims(x, args, kwargs):
    bound = dict(zip(("dim", "keepdim"), args), **kwargs)
    return normalize_dims(bound["dim"], x.dim()), bound.get("keepdim", False)


SPECS = {
    "nn.functional.silu": Spec("silu", tunekit.silu, lambda *a, **k: F.silu(*a, **k), (silu_op, silu_backward_op),
                               lambda x, a, k: SiluParams(x), lambda dy, x, y, a, k: SiluBackwardParams(dy, x)),
    "nn.functional.gelu": Spec("gelu", tunekit.gelu, lambda *a, **k: F.gelu(*a, **k), (gelu_op, gelu_backward_op),
                               lambda x, a, k: GeluParams(x, k.get("approximate", "none")),
                               lambda dy, x, y, a, k: GeluBackwardParams(dy, x, k.get("approximate", "none"))),
    "logsumexp": Spec("logsumexp", tunekit.logsumexp, lambda *a, **k: torch.logsumexp(*a, **k),
                      (logsumexp_op, logsumexp_backward_op),
                      lambda x, a, k: LogsumexpParams(x, *_lse_dims(x, a, k)),
                      lambda dy, x, y, a, k: LogsumexpBackwardParams(dy, x, y, *_lse_dims(x, a, k))),
}
OPINFOS = [op for op in OP_DB if op.name in SPECS]
IDS = [op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") for op in OPINFOS]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def samples(op, device, dtype, requires_grad=False, reference=False):
    """The OpInfo's samples (and reference inputs, on the GPU) as (input, args, kwargs)."""
    gen = op.reference_inputs if reference else op.sample_inputs
    return [(s.input, tuple(s.args), dict(s.kwargs)) for s in gen(device, dtype, requires_grad=requires_grad)]


def close(spec, actual, expected, x, what):
    """Within twice the op's tolerance of torch's result (both are within it of the exact value);
    logsumexp also within rtol x max|x| (lse = max + log(sum) cancels near 0)."""
    rtol, atol = spec.tol(x)
    if spec.name == "logsumexp" and x.numel():
        finite = x.detach()[torch.isfinite(x.detach())]
        atol = max(atol, rtol * float(finite.abs().max())) if finite.numel() else atol
    problem = compare(actual, expected, (2 * rtol, 2 * atol))
    assert problem is None, f"{spec.name} {what}: {problem}"


def check_sample(spec, op, x, args, kwargs, what):
    """tunekit's public function on one sample: torch's outcome; and its gradient where x requires grad."""
    xt = x.detach().clone().requires_grad_(x.requires_grad)
    theirs = outcome(op.op, xt, *args, **kwargs)
    ours = outcome(spec.public, x, *args, **kwargs)
    if theirs.error is not None or x.dtype not in FLOATS:
        assert_same_outcome(ours, theirs, what=what)
        return
    assert ours.error is None, f"{what}: {ours.error!r}"
    assert (ours.result.shape, ours.result.dtype) == (theirs.result.shape, theirs.result.dtype), what
    close(spec, ours.result, theirs.result, x, what)
    if x.requires_grad:
        dy = torch.randn_like(theirs.returned)
        (want,) = torch.autograd.grad(theirs.returned, xt, dy)
        (got,) = torch.autograd.grad(ours.returned, x, dy)
        close(spec, got, want, x, f"{what} gradient")


# -- the public functions -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_samples_give_torchs_values_and_gradients(op, dtype, device):
    spec = SPECS[op.name]
    cases = samples(op, device, dtype, requires_grad=op.supports_autograd and dtype in op.supported_backward_dtypes(
        torch.device(device).type))
    if device == "cuda":
        cases += samples(op, device, dtype, reference=True)
    for i, (x, args, kwargs) in enumerate(cases):
        check_sample(spec, op, x, args, kwargs, f"sample {i} {list(x.shape)} {args} {kwargs}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_every_other_dtype_gives_torchs_outcome(op, device):
    """Integers, bool, complex (whatever the OpInfo supports or not): torch's value or exception type."""
    spec = SPECS[op.name]
    for dtype in sorted(ALL_DTYPES - set(FLOATS), key=str):
        for i, (x, args, kwargs) in enumerate(samples(op, device, dtype)):
            check_sample(spec, op, x, args, kwargs, f"{dtype} sample {i} {list(x.shape)} {args} {kwargs}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_error_inputs_raise_torchs_exception(op, device):
    spec = SPECS[op.name]
    if op.error_inputs_func is None:
        pytest.skip(f"{op.name} has no error inputs")
    for e in op.error_inputs(device):
        s = e.sample_input
        with pytest.raises(e.error_type, match=e.error_regex):
            spec.public(s.input, *s.args, **s.kwargs)


def _out_forms(result):
    """out= tensors: the result's layout NaN-filled, empty, another shape (torch resizes, warning)."""
    nan = float("nan") if result.is_floating_point() or result.is_complex() else 0
    return {"same": lambda: torch.full_like(result, nan), "empty": lambda: result.new_empty(0),
            "resized": lambda: torch.full((result.numel() + 3,), nan, dtype=result.dtype, device=result.device)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.complex64], ids=str)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_out_and_inplace_forms_give_torchs_outcome(op, dtype, device):
    spec = SPECS[op.name]
    for i, (x, args, kwargs) in enumerate(samples(op, device, dtype)):
        what = f"sample {i} {list(x.shape)} {args} {kwargs}"
        if op.inplace_variant is not None:  # silu: F.silu(x, inplace=True)
            theirs = outcome(_TORCH_SILU, x.clone(), inplace=True)
            ours = outcome(spec.public, x.clone(), inplace=True)
            assert_same_outcome(ours, theirs, spec.tol(x), f"{what} in place")
        if not op.supports_out:
            continue
        reference = outcome(op.op, x, *args, **kwargs)
        if reference.error is not None:
            continue
        for form, make in _out_forms(reference.result).items():
            out_t, out_o = make(), make()
            theirs = outcome(op.op, x, *args, **kwargs, out=out_t)
            ours = outcome(spec.public, x, *args, **kwargs, out=out_o)
            assert_same_outcome(ours, theirs, spec.tol(x) if dtype in FLOATS else None, f"{what} out {form}")
            if ours.error is None:
                assert ours.returned is out_o, f"{what} out {form}: out= returns out itself"


# -- tunekit.patch() ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64], ids=str)
@pytest.mark.parametrize("op", OPINFOS, ids=IDS)
def test_patched_torch_functions_give_torchs_outcome(op, dtype, device, monkeypatch):
    spec = SPECS[op.name]
    runs = CandidateRuns(monkeypatch, spec.name)
    cases = samples(op, device, dtype)
    expected = [outcome(op.op, x, *args, **kwargs) for x, args, kwargs in cases]
    try:
        with tunekit.tuning(tuning=False), tunekit.patch():
            for i, ((x, args, kwargs), theirs) in enumerate(zip(cases, expected)):
                what = f"sample {i} {list(x.shape)} {args} {kwargs}"
                ours = outcome(spec.patched, x, *args, **kwargs)
                tol = spec.tol(x) if dtype in FLOATS and theirs.error is None else None
                assert_same_outcome(ours, theirs, tol, what)
                if op.method_variant is not None:
                    assert_same_outcome(outcome(lambda t, *a, **k: t.logsumexp(*a, **k), x, *args, **kwargs), theirs,
                                        tol, f"{what} method")
    finally:
        runs.close()
    assert (runs.count(spec.name) > 0) == (dtype in FLOATS), runs.counts()


# -- every candidate forced in turn ---------------------------------------------------------------
BASE_OPINFOS = [op for op in OPINFOS if not op.variant_test_name]
BASE_IDS = [op.name for op in BASE_OPINFOS]


def _torch_gradient(op, x, args, kwargs, dy):
    xg = x.detach().clone().requires_grad_()
    (dx,) = torch.autograd.grad(op.op(xg, *args, **kwargs), xg, dy)
    return dx


def _run_forced(spec, tunable, params, expected, x, what) -> list[str]:
    """Every candidate of ``tunable`` that supports ``params``, allocating and into a NaN-filled
    ``out``: torch's values. The names of those that ran."""
    ran = []
    for c in tunable.candidates:
        if c.supports(params) is not None:
            continue
        close(spec, c.run(params), expected, x, f"{c.name} {what}")
        out = torch.full_like(expected, float("nan"))
        p_out = params.replace(out=out)
        if c.supports(p_out) is None:
            assert c.run(p_out).data_ptr() == out.data_ptr(), c.name
            close(spec, out, expected, x, f"{c.name} {what} out=")
        ran.append(c.name)
    return ran


def check_every_candidate(op, device, dtype, reference=False) -> set:
    spec = SPECS[op.name]
    forward_op, backward_op = spec.ops
    ran = set()
    cases = samples(op, device, dtype) + (samples(op, device, dtype, reference=True) if reference else [])
    for i, (x, args, kwargs) in enumerate(cases):
        if device == "cpu" and x.numel() > INTERPRETER_MAX_ELEMENTS:
            continue
        what = f"sample {i} {list(x.shape)} {args} {kwargs}"
        y = op.op(x, *args, **kwargs)
        ran.update(_run_forced(spec, forward_op, spec.forward(x, args, kwargs), y, x, what))
        dy = torch.randn_like(y)
        dx = _torch_gradient(op, x, args, kwargs, dy)
        ran.update(_run_forced(spec, backward_op, spec.backward(dy, x, y, args, kwargs), dx, x, f"{what} backward"))
    return ran


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_every_candidate_on_the_samples_on_the_cpu(op, dtype):
    """torch's candidates and, in Triton's interpreter, the Triton ones (CUDA C declines CPU tensors)."""
    ran = check_every_candidate(op, "cpu", dtype)
    assert ran, "no candidate ran"
    from elementwise_checks import triton_on_cpu
    if triton_on_cpu() is None and dtype != torch.float64:
        assert any("triton" in name for name in ran), sorted(ran)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_every_cuda_and_triton_candidate_on_the_samples_and_reference_inputs(op, dtype, cuda):
    ran = check_every_candidate(op, "cuda", dtype, reference=True)
    if dtype != torch.float64:
        kinds = {"triton" if "triton" in n else "torch" if n.startswith("torch_") else "cuda" for n in ran}
        assert {"triton", "cuda"} <= kinds, sorted(ran)


# -- torch.compile and opcheck --------------------------------------------------------------------
def _distinct(cases):
    """One sample per argument form (shape, args, kwargs): compiling once per form is the cost."""
    seen, out = set(), []
    for x, args, kwargs in cases:
        key = (tuple(x.shape), repr(args), repr(sorted(kwargs.items())))
        if key not in seen:
            seen.add(key)
            out.append((x, args, kwargs))
    return out


def check_compiled(op, device, dtype, backend, every=False):
    """``torch.compile(fullgraph=True)`` of the public function: torch's values and gradients, and
    the tunable op running inside the compiled graph."""
    spec = SPECS[op.name]
    torch._dynamo.reset()
    cases = samples(op, device, dtype, requires_grad=True)
    for i, (x, args, kwargs) in enumerate(cases if every else _distinct(cases)):
        compiled = torch.compile(lambda t, a=args, k=kwargs: spec.public(t, *a, **k), fullgraph=True,
                                 backend=backend, dynamic=False)
        xt = x.detach().clone().requires_grad_()
        y = compiled(xt)
        close(spec, y, op.op(x.detach(), *args, **kwargs), x, f"compiled sample {i}")
        dy = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, xt, dy)
        close(spec, dx, _torch_gradient(op, x, args, kwargs, dy), x, f"compiled sample {i} gradient")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_compiled_public_function_on_a_subset_on_the_cpu(op, monkeypatch):
    runs = CandidateRuns(monkeypatch, SPECS[op.name].name)
    try:
        check_compiled(op, "cpu", torch.float32, "aot_eager")
    finally:
        runs.close()
    assert runs.count(SPECS[op.name].name) > 0  # the compiled graph calls tunekit's op


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_compiled_public_function_on_every_sample(op, dtype, backend, cuda):
    check_compiled(op, "cuda", dtype, backend, every=True)


def _custom_call(op, x, args, kwargs):
    """(custom op, its arguments) for a sample: tunekit::silu / gelu / logsumexp."""
    name = SPECS[op.name].name
    if name == "silu":
        return torch.ops.tunekit.silu.default, (x,)
    if name == "gelu":
        return torch.ops.tunekit.gelu.default, (x, kwargs.get("approximate", "none"))
    dims, keepdim = _lse_dims(x, args, kwargs)
    return torch.ops.tunekit.logsumexp.default, (x, list(dims), keepdim)


def check_opcheck(op, device, dtype, every=False):
    cases = samples(op, device, dtype, requires_grad=True) + samples(op, device, dtype)
    for x, args, kwargs in cases if every else _distinct(cases):
        custom, custom_args = _custom_call(op, x, args, kwargs)
        torch.library.opcheck(custom, custom_args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_opcheck_on_a_subset_on_the_cpu(op, dtype):
    with tunekit.tuning(tuning=False):
        check_opcheck(op, "cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", BASE_OPINFOS, ids=BASE_IDS)
def test_opcheck_on_every_sample(op, dtype, cuda):
    check_opcheck(op, "cuda", dtype, every=True)
