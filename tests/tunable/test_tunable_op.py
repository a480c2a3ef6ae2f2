"""TunableOp: the call path, the results store behind it, settings, proxies, threads, explain."""

import threading
import time

import pytest
import torch

import tunekit
from tunekit.tunable import context
from tunekit.tunable import explain, results_store, tuning
from tunekit.tunable import tunable_op as tunable_op_module

from fakes import FakeClock, ScaleParams, make_op



@pytest.fixture(autouse=True)
def tune_in_one_call(monkeypatch):
    """These tests are about the cache and the store: each signature is tuned in its first call
    (tests/tunable/test_session.py covers tuning spread over calls)."""
    monkeypatch.setenv("TUNEKIT_TUNING_STEP_MS", "inf")
    context.reload_environment()

def fresh_op(costs=None, **kw):
    clock = FakeClock()
    op = make_op(clock, costs or {"ref": 2.0, "fast": 1.0}, **kw)
    op.clock = clock
    return op


def test_first_call_tunes_and_later_calls_use_the_cache():
    op = fresh_op()
    x = torch.randn(100)
    torch.testing.assert_close(op(ScaleParams(x)), 2 * x)
    tuning_runs = sum(op.runs.values())
    assert tuning_runs > 2
    for _ in range(5):
        op(ScaleParams(x))
    assert op.runs["fast"] == tuning_runs - op.runs["ref"] + 5  # five more runs, all of the winner
    entry = results_store().get("scale", ScaleParams(x).signature(), op.resolve(ScaleParams(x)).device)
    assert entry is not None and entry.choice == "fast" and entry.complete


def test_signature_separates_alignment_and_layout():
    op = fresh_op()
    base = torch.randn(101)
    op(ScaleParams(base[:100]))
    op(ScaleParams(base[1:]))  # 4-byte offset: another alignment class
    op(ScaleParams(torch.randn(10, 10).t()))  # not contiguous
    assert len(results_store().entries("scale")) == 3


def test_stored_result_is_used_by_a_new_process_without_tuning():
    op = fresh_op()
    x = torch.randn(100)
    op(ScaleParams(x))
    op.forget()  # what a new process starts with: nothing in memory
    op.runs.clear()
    op(ScaleParams(x))
    assert dict(op.runs) == {"fast": 1}


def test_validator_mismatch_retunes_that_entry_alone():
    op = fresh_op()
    x, y = torch.randn(100), torch.randn(200)
    op(ScaleParams(x))
    op(ScaleParams(y))
    store = results_store()
    stale, other = (store.get("scale", ScaleParams(t).signature(), op.resolve(ScaleParams(t)).device) for t in (x, y))
    stale.validators["torch"] = "0.0.1"
    store.put(stale)
    op.forget()
    r = op.resolve(ScaleParams(x))
    assert "torch 0.0.1 ->" in r.why and r.entry.validators["torch"] == torch.__version__
    assert store.get("scale", other.signature, other.device).tuned_at == other.tuned_at


def test_changed_candidate_source_retunes():
    op = fresh_op()
    x = torch.randn(100)
    op(ScaleParams(x))
    changed = fresh_op()
    changed.candidate("fast")._hash = "edited"
    r = changed.resolve(ScaleParams(x))
    assert "candidate fast changed" in r.why


def test_tuning_off_runs_the_default_and_records_untuned():
    op = fresh_op()
    x = torch.randn(100)
    with tuning(tuning=False, record_untuned=True):
        torch.testing.assert_close(op(ScaleParams(x)), 2 * x)
        op(ScaleParams(x))
    assert dict(op.runs) == {"ref": 2}
    untuned = results_store().untuned("scale")
    assert [u.signature for u in untuned] == [ScaleParams(x).signature()]
    assert untuned[0].spec["x"]["shape"] == [100]


def test_tuning_off_uses_stored_results():
    op = fresh_op()
    x = torch.randn(100)
    op(ScaleParams(x))
    op.runs.clear()
    with tuning(tuning=False):
        op(ScaleParams(x))
    assert dict(op.runs) == {"fast": 1}


def test_tuning_off_cache_learns_of_later_tuning():
    op = fresh_op()
    x = torch.randn(100)
    with tuning(tuning=False):
        op(ScaleParams(x))
    op(ScaleParams(x))  # tunes
    op.runs.clear()
    with tuning(tuning=False):
        op(ScaleParams(x))
    assert dict(op.runs) == {"fast": 1}


def test_disabled_runs_the_default_without_lookup():
    op = fresh_op()
    with tuning(enabled=False):
        op(ScaleParams(torch.randn(100)))
    assert dict(op.runs) == {"ref": 1}
    assert len(results_store()) == 0


def test_incomplete_entry_is_retuned_next_process_and_used_when_tuning_is_off():
    op = fresh_op({"ref": 4.0, "a": 4.0, "b": 4.0})
    x = torch.randn(100)
    with tuning(max_tuning_ms=5.0):
        op(ScaleParams(x))
    assert results_store().entries("scale")[0].complete is False
    op.forget()
    with tuning(tuning=False):
        assert "incomplete" in op.resolve(ScaleParams(x)).why
    r = op.resolve(ScaleParams(x))
    assert r.why.startswith("tuned now (stored entry ignored: stored entry is incomplete)")
    assert r.entry.complete


def test_an_incomplete_online_entry_is_recorded_for_offline_tuning():
    op = fresh_op({"ref": 4.0, "a": 4.0, "b": 4.0})
    x = torch.randn(100)
    with tuning(max_tuning_ms=5.0, record_untuned=True):
        op(ScaleParams(x))
    assert results_store().entries("scale")[0].complete is False
    assert [u.signature for u in results_store().untuned("scale")] == [ScaleParams(x).signature()]
    with tuning(record_untuned=True):  # a complete tuning records nothing
        op(ScaleParams(torch.randn(50)))
    assert len(results_store().untuned("scale")) == 1


def test_inplace_tuning_leaves_user_data_as_an_untuned_call_would():
    """PreTuning/PostTuning: candidates run on proxies, so x is doubled exactly once."""
    op = fresh_op({"ref": 2.0, "fast": 1.0, "faster": 0.9})
    x = torch.randn(1000)
    expected = 2 * x
    result = op(ScaleParams(x, out=x))
    assert result.data_ptr() == x.data_ptr()
    assert sum(op.runs.values()) > 5
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


def test_out_buffer_is_written_once_with_the_right_values():
    op = fresh_op()
    x = torch.randn(64)
    out = torch.full_like(x, float("nan"))
    assert op(ScaleParams(x, out)) is out
    torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)


def test_concurrent_first_calls_tune_once(monkeypatch):
    calls = []
    real = tunable_op_module.TuningSession

    def counting(*args, **kwargs):
        calls.append(1)
        time.sleep(0.05)  # widen the race window
        return real(*args, **kwargs)

    monkeypatch.setattr(tunable_op_module, "TuningSession", counting)
    op = fresh_op()
    x = torch.randn(100)
    barrier = threading.Barrier(8)
    results, errors = [], []

    def worker():
        try:
            barrier.wait()
            results.append(op(ScaleParams(x)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == 1
    assert len(results) == 8 and all(torch.equal(r, 2 * x) for r in results)


def test_results_setting_points_at_another_store(tmp_path):
    op = fresh_op()
    other = tmp_path / "other.sqlite"
    with tuning(results=other):
        op(ScaleParams(torch.randn(100)))
        assert len(results_store()) == 1
    assert len(results_store()) == 0
    assert len(results_store(other)) == 1


def test_use_stored_false_ignores_stored_results():
    op = fresh_op()
    x = torch.randn(100)
    op(ScaleParams(x))
    op.runs.clear()
    with tuning(use_stored=False):
        op(ScaleParams(x))
    assert op.runs["ref"] > 1  # tuned again


def test_explain_names_the_choice_and_every_other_candidate():
    op = fresh_op({"ref": 2.0, "fast": 1.0, "wrong": 0.5, "nope": 0.5, "sluggish": 10.0},
                  behaviours={"wrong": "wrong", "nope": "unsupported"})
    e = explain(op, torch.randn(100))
    assert e.chosen == "fast" and e.signature == "x=f32[100]@0 out=new cpu"
    assert e.candidates["wrong"][0] == "numerics"
    assert e.candidates["nope"] == ("unsupported", None, "needs a device this test does not have")
    assert e.candidates["sluggish"][0] == "pruned"
    assert e.candidates["ref"][0] == "slower" and e.candidates["ref"][1] == pytest.approx(2.0)
    text = str(e)
    for word in ("fast", "numerics", "unsupported", "pruned", "slower", "x=f32[100]@0"):
        assert word in text


def test_explain_without_tuning_says_why_the_default_runs():
    op = fresh_op()
    with tuning(tuning=False):
        e = explain(op, torch.randn(100))
    assert e.chosen == "ref" and "tuning is off" in e.why
    assert e.candidates["fast"][0] == "not tuned"
    assert sum(op.runs.values()) == 0  # explain never runs the op on the caller's tensors


def test_explain_by_name_for_a_builtin_op():
    e = tunekit.explain("silu", torch.randn(33))
    assert e.op == "silu" and e.chosen in ("torch_silu", "torch_x_sigmoid")


def test_registration_rules():
    op = fresh_op()
    with pytest.raises(ValueError, match="already has a candidate"):
        op.add(lambda p: None, name="fast")
    with pytest.raises(ValueError, match="already has a default"):
        op.add(lambda p: None, name="other", default=True)
    with pytest.raises(KeyError, match="no candidate"):
        op.candidate("missing")
