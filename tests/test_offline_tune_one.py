"""Tuning one recorded signature offline (``offline/tune_one.py``): every candidate warmed outside the
budget, a retry with twice the budget until the entry completes, the given tensors never written.
Fake ops on a fake clock: exact on a CPU machine."""

import math
import sys

import pytest
import torch

from tunekit import offline
from tunekit.offline import tune_one
from tunekit.tunable import tuning
from tunekit.tunable.find_fastest import find_fastest

from fakes import FakeClock, ScaleParams, make_op

#: enough budget that the fake signatures tune completely
BUDGET = 5000.0


# -- warm-up ---------------------------------------------------------------------------------------
#: the default budget, which a first-use compile of ``COMPILE_MS`` overruns on its own
DEFAULT_BUDGET, COMPILE_MS = 50.0, 200.0


def _compiling_op():
    """A fake op (``op.clock`` a FakeClock) whose "jit" candidate, the fastest, costs ``COMPILE_MS``
    on its first run in the "process" (a first-use compilation) and 0.5 ms on every later one."""
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0})
    op.clock = clock

    def jit(p):
        clock.advance(0.5 if op.runs["jit"] else COMPILE_MS)
        op.runs["jit"] += 1
        return torch.mul(p.x, 2, out=p.out if p.out is not None else torch.empty_like(p.x))

    op.add(jit, name="jit")
    return op


def test_online_tuning_still_counts_first_use_compilation():
    op = _compiling_op()
    with tuning(max_tuning_ms=DEFAULT_BUDGET, tuning_step_ms=math.inf):  # the whole tuning in this call
        resolved = op.resolve(ScaleParams(torch.randn(64)))
    assert not resolved.entry.complete and "budget exhausted" in resolved.why
    assert op.runs["jit"] == 2  # its check (which paid the compile) and its probe: no separate warm-up run


def test_warm_up_keeps_first_use_compilation_out_of_the_offline_budget(monkeypatch):
    op = _compiling_op()
    attempts = []
    monkeypatch.setattr(tune_one, "find_fastest", lambda *a, **k: attempts.append(1) or find_fastest(*a, **k))
    with tuning(max_tuning_ms=DEFAULT_BUDGET) as s:
        start = op.clock()
        entry = offline.tune_params(op, ScaleParams(torch.randn(64)), s)
    assert entry.complete and entry.choice == "jit" and len(attempts) == 1
    assert entry.tuning_ms <= DEFAULT_BUDGET and (op.clock() - start) * 1e3 >= COMPILE_MS + entry.tuning_ms
    assert entry.candidates["jit"].time_ms == pytest.approx(0.5)


def test_a_retry_doubles_the_budget_until_the_entry_completes(monkeypatch):
    """Checks, probes and rounds of 2-4 ms candidates take 36 ms: a 20 ms budget leaves the first
    attempt incomplete, the retry's 40 ms completes it (offline, nobody waits for the call)."""
    budgets = []
    monkeypatch.setattr(tune_one, "find_fastest", lambda op, p, s, **k: budgets.append(s.max_tuning_ms)
                        or find_fastest(op, p, s, **k))
    clock = FakeClock()
    op = make_op(clock, {"ref": 4.0, "fast": 2.0, "mid": 3.0})
    op.clock = clock
    with tuning(max_tuning_ms=20.0) as s:
        entry = offline.tune_params(op, ScaleParams(torch.randn(64)), s)
    assert budgets == [20.0, 40.0] and s.max_tuning_ms == 20.0  # the caller's settings untouched
    assert entry.complete and entry.choice == "fast" and 20.0 + 20.0 < entry.tuning_ms <= 20.0 + 40.0  # both attempts
    budgets.clear()
    with tuning(max_tuning_ms=20.0) as s:
        entry = offline.tune_params(op, ScaleParams(torch.randn(64)), s, attempts=1)
    assert budgets == [20.0] and not entry.complete


def test_a_candidate_that_fails_in_warm_up_is_still_tried_and_rejected():
    clock = FakeClock()
    op = make_op(clock, {"ref": 1.0, "bad": 0.5, "gone": 0.5}, behaviours={"bad": "raises", "gone": "unsupported"})
    op.clock = clock
    x = torch.randn(64)
    assert offline.warm_candidates(op, ScaleParams(x)) == ["ref"]
    assert dict(op.runs) == {"ref": 1, "bad": 1}  # an unsupported candidate is not run
    with tuning(max_tuning_ms=BUDGET) as s:
        entry = offline.tune_params(op, ScaleParams(x), s, attempts=1)
    assert op.runs["bad"] == 3  # warmed again, then checked by find_fastest
    assert entry.complete and entry.choice == "ref"
    assert (entry.candidates["bad"].status, entry.candidates["bad"].reason) == ("error", "RuntimeError: kernel exploded")
    assert entry.candidates["gone"].status == "unsupported" and op.runs["gone"] == 0

    def out_of_memory(p):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    op.add(out_of_memory, name="huge")
    with pytest.raises(torch.cuda.OutOfMemoryError):  # as in find_fastest: not a candidate's failure
        offline.warm_candidates(op, ScaleParams(x))


def test_warm_up_never_writes_the_given_tensors_and_runs_their_layout():
    op = make_op(None, {"ref": 0.0, "a": 0.0})
    seen = []

    def spy(p):
        seen.append(p)
        return torch.mul(p.x, 2, out=p.out)

    op.add(spy, name="spy")
    x = torch.randn(40)[1:]  # 4-byte offset
    before = x.clone()
    out = torch.full((41,), math.nan)[2:]  # 8-byte offset
    for params in (ScaleParams(x, out), ScaleParams(x, out=x)):
        assert offline.warm_candidates(op, params) == ["ref", "a", "spy"]
        assert torch.equal(x, before) and torch.isnan(out).all()
    assert dict(op.runs) == {"ref": 2, "a": 2}
    given, inplace = seen
    assert given.out.data_ptr() != out.data_ptr() and given.x is x  # a fresh output; the read-only input shared
    assert (given.out.stride(), given.out.data_ptr() % 16) == (out.stride(), out.data_ptr() % 16)
    torch.testing.assert_close(given.out, 2 * x)
    assert inplace.out is inplace.x and inplace.x.data_ptr() != x.data_ptr()  # a copy of the mutated input
    assert inplace.x.data_ptr() % 16 == x.data_ptr() % 16


def test_warm_up_runs_the_numerical_check_on_the_defaults_output(monkeypatch):
    """The check's first use in a process loads kernels (0.1 s on an H200): warming pays it, outside
    the budget, on the outputs the check will compare."""
    op = make_op(None, {"ref": 0.0, "a": 0.0})
    compared = []
    op._numerics = lambda params, got, expected: compared.append((params, got, expected))
    x = torch.randn(33)
    offline.warm_candidates(op, ScaleParams(x))
    (params, (actual,), (expected,)), = compared
    assert actual is expected and actual.shape == x.shape and torch.equal(actual, 2 * x)
    assert params.x is x


def test_a_retry_never_doubles_the_budget_past_what_settings_allow(monkeypatch):
    budgets = []

    def never_complete(op, p, s, **k):  # every attempt reported incomplete: all three retries run
        budgets.append(s.max_tuning_ms)
        report = find_fastest(op, p, s, **k)
        report.complete = False
        return report

    monkeypatch.setattr(tune_one, "find_fastest", never_complete)
    clock = FakeClock()
    op = make_op(clock, {"ref": 4.0, "fast": 2.0})
    op.clock = clock
    with tuning(max_tuning_ms=1e308) as s:
        entry = offline.tune_params(op, ScaleParams(torch.randn(64)), s)
    assert budgets == [1e308, sys.float_info.max, sys.float_info.max] and not entry.complete
