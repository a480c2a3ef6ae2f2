"""Checks shared by the elementwise ops' tests (tests/ops/test_silu.py, test_gelu.py): every candidate
of every op, on every input kind it is meant to run, against a float64 reference.

A :class:`Form` is one op with fixed arguments (gelu's ``approximate``): how to build its params and
its float64 reference. :func:`candidate_cases` lists (form, candidate, dtype, device, shape) for
pytest: CUDA C kernels on CUDA in their dtype, Triton on CUDA and (interpreted) on the CPU at small
sizes, the torch candidates everywhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

from tunekit.ops._shared.triton_elementwise import TritonElementwise
from tunekit.tunable.numerics import compare

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1,), (7,), (1003,), (4096,), (2**20 + 3,), (33, 17), (5, 1021), ()]
#: the Triton interpreter runs a program at a time on the CPU: small sizes only there
INTERPRETER_MAX_ELEMENTS = 5000
SPECIAL = [float("nan"), float("inf"), -float("inf"), 20, -20, 100, -100, 0.0, -0.0, 1e-7, 3.5, -3.5, 4.5, 8.0]


@dataclass(frozen=True)
class Form:
    label: str
    op: object
    make: Callable          # make(tensors, out) -> params
    reference: Callable     # reference(*float64 tensors) -> float64 tensor
    n_inputs: int = 1
    arguments: dict = field(default_factory=dict)

    def __repr__(self):
        return self.label


def triton_on_cpu() -> str | None:
    """None when Triton candidates can run on CPU tensors (installed, interpreter on), else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET is not 1"
    return None


def inputs(form: Form, shape, dtype, device) -> list[torch.Tensor]:
    """Fresh random inputs: the incoming gradient (backward ops) ~N(0,1), x ~N(0,9)."""
    ts = [torch.randn(shape, dtype=torch.float32, device=device) for _ in range(form.n_inputs)]
    ts[-1] = ts[-1] * 3
    return [t.to(dtype) for t in ts]


def check(form: Form, actual: torch.Tensor, tensors) -> None:
    """Within the op's tolerance (numerics.TOLERANCES by dtype, or the op's own rule) of the float64
    result rounded to the dtype."""
    expected = form.reference(*(t.double() for t in tensors)).to(tensors[0].dtype)
    rtol, atol = form.op.tolerance(form.make(tensors, None))
    problem = compare(actual, expected, (rtol * 1.5, atol))
    assert problem is None, f"{form.label}: {problem}"


def _applies(form: Form, candidate) -> bool:
    when = getattr(candidate, "when", {})
    return all(form.arguments.get(k) == v for k, v in when.items())


def candidate_cases(forms, shapes=SHAPES):
    """pytest params (form, candidate name, dtype, device, shape) for every candidate of every form."""
    cases = []
    for form in forms:
        for c in form.op.candidates:
            if not _applies(form, c):
                continue
            dtype = getattr(c, "dtype", None)
            runs = ([(d, "cpu") for d in DTYPES] if dtype is None else []) + \
                   [(d, "cuda") for d in ([dtype] if dtype else DTYPES)]
            for d, device in runs:
                for shape in shapes:
                    if device == "cpu" and isinstance(c, TritonElementwise) and math.prod(shape) > INTERPRETER_MAX_ELEMENTS:
                        continue
                    marks = [pytest.mark.gpu] if device == "cuda" else []
                    if device == "cpu" and isinstance(c, TritonElementwise) and triton_on_cpu():
                        marks.append(pytest.mark.skip(reason=triton_on_cpu()))
                    name = str(d).removeprefix("torch.")
                    cases.append(pytest.param(form, c.name, d, device, shape, marks=marks,
                                              id=f"{form.label}-{c.name}-{name}-{device}-{shape}"))
    return cases


def layout_cases(forms):
    """pytest params (form, candidate name, dtype, device) without shapes."""
    out = []
    for p in candidate_cases(forms, shapes=[(7,)]):
        form, name, dtype, device, _ = p.values
        out.append(pytest.param(form, name, dtype, device, marks=p.marks, id=p.id.removesuffix("-(7,)")))
    return out


def check_candidate(form: Form, name: str, dtype, device, shape) -> None:
    """Three runs: into a NaN-filled ``out``, allocating, and in place (into the first input); and
    the candidate's fast runner, where it offers one."""
    c = form.op.candidate(name)
    ts = inputs(form, shape, dtype, device)
    out = torch.full_like(ts[0], float("nan"))
    p = form.make(ts, out)
    assert c.supports(p) is None, c.supports(p)
    got = c.run(p)
    assert got.data_ptr() == out.data_ptr()
    check(form, got, ts)
    check(form, c.run(form.make(ts, None)), ts)
    copies = [t.clone() for t in ts]
    c.run(form.make(copies, copies[0]))
    check(form, copies[0], ts)
    check_runner(form, c, ts)


def check_runner(form: Form, c, ts) -> bool:
    """The runner ``c`` makes for allocating params of ``ts`` (the public functions' fast path)
    computes what ``run`` does, on those inputs and on fresh ones of the same key. False when ``c``
    has no runner for them."""
    p = form.make(ts, None)
    make = getattr(c, "fast_runner", None)
    runner = make(p) if make is not None and p.fast_form() else None
    if runner is None:
        return False
    for tensors in (ts, [t.clone() for t in ts]):  # the runner binds the key, never the tensors
        poison = torch.full_like(tensors[0], float("nan"))
        del poison  # the allocator's next block of this size holds NaN: an unwritten element fails
        got = runner(*tensors)
        assert got.shape == tensors[0].shape and got.dtype == tensors[0].dtype
        check(form, got, tensors)
    return True


def check_candidate_on_awkward_inputs(form: Form, name: str, dtype, device, special_values=SPECIAL) -> None:
    """Misaligned views, odd lengths, non-contiguous, empty, special values; declines only layouts."""
    c = form.op.candidate(name)

    def make_all(shape, view=lambda t: t):
        return [view(t) for t in inputs(form, shape, dtype, device)]

    special = torch.tensor(special_values, dtype=torch.float32, device=device).to(dtype)
    cases = [
        make_all((4099,), lambda t: t[1:]),              # misaligned for 16-byte vectors
        make_all((4099,), lambda t: t[3:1003]),
        make_all((4099,), lambda t: t[8:4099]),          # aligned again (2-byte types), odd length
        make_all((64, 33), lambda t: t.t()),             # non-contiguous
        make_all((64, 33), lambda t: t[:, 1::2]),        # strided
        make_all((0, 5)),
        [special] * form.n_inputs if form.n_inputs == 1 else [torch.ones_like(special), special],
        [special.flip(0), special] if form.n_inputs == 2 else [-special],
    ]
    ran = 0
    for ts in cases:
        out = torch.full_like(ts[0], float("nan"))
        why = c.supports(form.make(ts, out))
        if why is not None:  # only layouts a kernel cannot take may be declined
            assert "aligned" in why or "contiguous" in why, why
            continue
        assert c.run(form.make(ts, out)).data_ptr() == out.data_ptr()
        check(form, out, ts)
        if all(t.is_contiguous() for t in ts) and c.supports(form.make(ts, None)) is None:
            check_runner(form, c, ts)
        ran += 1
    assert ran >= 4


# -- torch fidelity: the same result, warning or exception type as torch's own function ---------------
@dataclass
class Outcome:
    """What one call did: its result (cloned, with the returned object's identity), or its exception,
    and the categories and texts of the warnings it raised."""

    result: object = None
    error: BaseException | None = None
    warnings: list = field(default_factory=list)
    returned: object = None


def outcome(fn, *args, **kwargs) -> Outcome:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            y = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - compared with torch's by the caller
            return Outcome(error=e, warnings=[(w.category, str(w.message)) for w in caught])
    result = y.detach().clone() if isinstance(y, torch.Tensor) else y
    return Outcome(result, None, [(w.category, str(w.message)) for w in caught], y)


def resize_warnings(o: Outcome) -> list:
    return [category for category, text in o.warnings if "resized" in text]


def assert_same_outcome(ours: Outcome, theirs: Outcome, tol=None, what="") -> None:
    """Both raised the same exception type, or both returned a tensor of one shape, dtype and
    device with values within ``tol`` ((rtol, atol); None: equal) and NaN in the same places, and
    both warned of a resized output or neither did."""
    if theirs.error is not None or ours.error is not None:
        assert ours.error is not None, f"{what}: torch raised {theirs.error!r}, tunekit returned"
        assert theirs.error is not None, f"{what}: tunekit raised {ours.error!r}, torch returned"
        assert type(ours.error) is type(theirs.error), f"{what}: tunekit raised {ours.error!r}, torch {theirs.error!r}"
        return
    assert resize_warnings(ours) == resize_warnings(theirs), (what, ours.warnings, theirs.warnings)
    a, b = ours.result, theirs.result
    assert type(a) is type(b), (what, type(a), type(b))
    if isinstance(b, torch.Tensor):
        assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device), (what, a.shape, a.dtype, b.shape, b.dtype)
        if b.device.type == "meta":
            return
        rtol, atol = tol or (0, 0)
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert a == b, (what, a, b)


def twice(make):
    """Two independent results of ``make()`` with the same random values (one for torch's call, one
    for tunekit's: in-place and ``out=`` forms change their arguments), fresh for every test."""
    seed = int(torch.randint(0, 2**62, ()))
    copies = []
    for _ in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            copies.append(make())
    return copies
