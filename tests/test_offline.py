"""Offline tuning: rebuilding recorded inputs, tune_recorded / tune_file, resumability after a kill,
claims (leases, live and dead owners), and tune_parallel with real worker processes on the CPU. One
signature's warm-up and retries: test_offline_tune_one.py."""

import functools
import io
import json
import math
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import tunekit
from tunekit import offline
from tunekit.offline import claims as _claims, parallel, tune_one
from tunekit.ops.gelu import GeluBackwardParams, GeluParams
from tunekit.ops.logsumexp import LogsumexpBackwardParams, LogsumexpParams
from tunekit.ops.silu import SiluBackwardParams, SiluFunction, SiluParams
from tunekit.tunable import ResultsImportError, explain, results_store, tuning, validators
from tunekit.tunable.registry import get_op

import offline_workers

CPU = validators.device_name(torch.device("cpu"))
#: enough budget that tiny CPU signatures (Triton in its interpreter) tune completely
BUDGET = 5000.0


def _lse_backward():
    x = torch.randn(3, 5, 7)
    lse = torch.logsumexp(x, (0, 1), keepdim=True)
    return LogsumexpBackwardParams(torch.randn_like(lse), x, lse, (0, 1), True)


PARAMS = {
    "silu contiguous": lambda: SiluParams(torch.randn(64)),
    "silu strided f16, 2-byte offset": lambda: SiluParams(torch.randn(4, 6, dtype=torch.float16)[:, 1:]),
    "silu in place": lambda: (lambda x: SiluParams(x, out=x))(torch.randn(10)),
    "silu out= given": lambda: SiluParams(torch.randn(9), out=torch.empty(10)[1:]),
    "silu_backward, expanded dy": lambda: SiluBackwardParams(torch.ones(()).expand(32), torch.randn(32)),
    "silu_backward into dy": lambda: (lambda dy: SiluBackwardParams(dy, torch.randn(12), out=dy))(torch.randn(12)),
    "gelu tanh bf16": lambda: GeluParams(torch.randn(33, dtype=torch.bfloat16), "tanh"),
    "gelu_backward": lambda: GeluBackwardParams(torch.randn(5, 4), torch.randn(5, 4), "none"),
    "logsumexp dims keepdim": lambda: LogsumexpParams(torch.randn(3, 5, 7), (0, 1), True),
    "logsumexp 0-d": lambda: LogsumexpParams(torch.randn(()), (0,), False),
    "logsumexp_backward": _lse_backward,
}


@pytest.mark.parametrize("case", list(PARAMS))
def test_rebuild_gives_the_recorded_layout_on_fresh_random_values(case):
    original = PARAMS[case]()
    op = get_op(original.op_name)
    spec = json.loads(json.dumps(original.spec()))  # what the store keeps
    rebuilt = offline.rebuild_params(op, spec, "cpu")
    assert type(rebuilt) is type(original) and rebuilt.signature() == original.signature()
    for name in original.inputs + original.outputs:
        a, b = getattr(original, name), getattr(rebuilt, name)
        if a is None:
            assert b is None
            continue
        assert (b.shape, b.stride(), b.dtype, b.data_ptr() % 16) == (a.shape, a.stride(), a.dtype, a.data_ptr() % 16)
        assert b.data_ptr() != a.data_ptr()
        if b.numel() > 1 and name in original.inputs:
            assert torch.count_nonzero(b) > 0 and not torch.equal(a, b)
    for out in original.outputs:
        alias = [i for i in original.inputs if getattr(original, i) is getattr(original, out)]
        assert [i for i in rebuilt.inputs if getattr(rebuilt, i) is getattr(rebuilt, out)] == alias
    if case == "logsumexp_backward":
        torch.testing.assert_close(rebuilt.lse, torch.logsumexp(rebuilt.x, (0, 1), keepdim=True))


def test_rebuild_refuses_specs_it_cannot_honour():
    spec = SiluParams(torch.randn(8)).spec()
    with pytest.raises(ValueError, match="recorded on cuda, cannot rebuild it on cpu"):
        offline.rebuild_params("silu", {**spec, "x": {**spec["x"], "device": "cuda"}}, "cpu")
    with pytest.raises(ValueError, match="alignment 3 is impossible"):
        offline.rebuild_params("silu", {**spec, "x": {**spec["x"], "align": 3}}, "cpu")
    with pytest.raises(ValueError, match="takes no argument"):
        offline.rebuild_params("silu", {**spec, "arguments": {"approximate": "tanh"}}, "cpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        offline.rebuild_params("silu", {**spec, "x": {**spec["x"], "dtype": "float99"}}, "cpu")


def _record_mixed(path):
    with tuning(results=str(path), tuning=False, record_untuned=True):
        tunekit.silu(torch.randn(40))
        tunekit.gelu(torch.randn(8, 8, dtype=torch.float16), approximate="tanh")
        tunekit.logsumexp(torch.randn(4, 16), -1)
        tunekit.silu(torch.randn(24), inplace=True)
        x = torch.randn(20, requires_grad=True)
        # records silu (n=20) and silu_backward with an expanded dy (the Function: tunekit.silu under
        # autograd records torch's own node, whose backward is torch's)
        SiluFunction.apply(x).sum().backward()


def test_record_then_tune_offline_then_the_stored_results_run(isolated_results):
    _record_mixed(isolated_results)
    store = results_store()
    recorded = store.untuned()
    assert len(recorded) == 6
    calls = []
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_recorded(store, progress=lambda *a: calls.append(a))
    assert (summary.total, summary.tuned, summary.already, summary.failed, summary.remaining) == (6, 6, 0, [], 0)
    assert calls[0][:2] == (0, 6) and calls[-1] == (6, 6, "done") and len(calls) == 7
    assert store.untuned() == []
    for r in recorded:
        entry = store.get(r.op, r.signature, r.device)
        assert entry is not None and offline.entry_problems(get_op(r.op), entry, "cpu") == []
    with tuning(tuning=False):
        assert explain("silu", torch.randn(40)).why == "stored result"
        assert explain("logsumexp", torch.randn(4, 16), -1).why == "stored result"
    again = offline.tune_recorded(store)  # resumable: nothing left to do
    assert (again.total, again.tuned, again.already) == (0, 0, 0)


def test_records_with_a_valid_entry_are_dropped_without_retuning(isolated_results):
    offline_workers.record(isolated_results, [30, 31])
    with tuning(max_tuning_ms=BUDGET, tuning_step_ms=math.inf):
        tunekit.silu(torch.randn(30))  # tuned online meanwhile, in this one call
    store = results_store()
    online = store.get("silu", SiluParams(torch.randn(30)).signature(), CPU)
    assert online.complete
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_recorded(store)
    assert (summary.already, summary.tuned) == (1, 1)
    assert store.get(online.op, online.signature, CPU).tuned_at == online.tuned_at
    assert store.untuned() == []


def test_failures_are_reported_kept_and_retried_by_the_next_run_only(isolated_results):
    store = results_store()
    spec = SiluParams(torch.randn(16)).spec()
    store.record_untuned("silu", "not the signature of that spec", CPU, spec)
    store.record_untuned("no_such_op", "sig", CPU, spec)
    store.record_untuned("silu", "x=f32[n=16]@0 out=new cuda", "NVIDIA H200", spec)
    summary = offline.tune_recorded(store)
    reasons = {op: why for op, _, why in summary.failed}
    assert "rebuilt inputs give signature" in reasons["silu"] and "no_such_op" in reasons["no_such_op"]
    assert (summary.total, summary.remaining, summary.other_devices) == (2, 2, 1)
    assert len(store.untuned()) == 3
    assert len(offline.tune_recorded(store).failed) == 2  # a new run tries again


def test_ops_filter_and_unknown_op_names(isolated_results):
    _record_mixed(isolated_results)
    with pytest.raises(KeyError, match="no tunekit op named"):
        offline.tune_recorded(ops=["silu", "nope"])
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_recorded(ops=["silu"])
    assert summary.tuned == 3 and {r.op for r in results_store().untuned()} == {"gelu", "logsumexp", "silu_backward"}


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from tunekit import offline

    def progress(done, total, label):
        if done == 2 and label != "done":  # the third signature is claimed: die holding it
            os.kill(os.getpid(), signal.SIGKILL)

    offline.tune_recorded(sys.argv[1], progress=progress)
""")


def test_a_killed_run_loses_only_the_signature_in_progress(isolated_results, tmp_path):
    offline_workers.record(isolated_results, [11, 12, 13, 14])
    env = {**os.environ, "TUNEKIT_MAX_TUNING_MS": str(BUDGET)}
    done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(isolated_results)], env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    store = results_store()
    first = {(e.op, e.signature): e.tuned_at for e in store.entries()}
    assert len(first) == 2 and len(store.untuned()) == 2
    claims = store._read(f"SELECT owner, state FROM {_claims.CLAIMS_TABLE}")
    assert len(claims) == 1 and claims[0][1] == "claimed"  # the dead process's claim, retaken below
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_recorded(store)
    assert (summary.total, summary.tuned, summary.remaining) == (2, 2, 0)
    assert len(store.entries()) == 4 and store.untuned() == []
    assert all(store.get(op, sig, CPU).tuned_at == t for (op, sig), t in first.items())  # nothing redone


def test_claims_of_live_owners_are_respected_until_their_lease_ends(isolated_results):
    offline_workers.record(isolated_results, [50, 51, 52])
    store = results_store()
    first, second, third = _claims.pending(store, CPU)[0]
    alive_here = f"{socket.gethostname()}:{os.getppid()}"
    assert _claims.claim_next(store, CPU, owner=alive_here, run="other", lease_s=3600) == first
    assert _claims.claim_next(store, CPU, owner="elsewhere:1", run="other", lease_s=3600) == second
    assert _claims.claim_next(store, CPU, owner="elsewhere:2", run="other", lease_s=-1) == third  # already expired
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_recorded(store)
    assert (summary.tuned, summary.remaining) == (1, 2)
    assert [r.signature for r in store.untuned()] == sorted([first.signature, second.signature])


def test_owner_liveness():
    host = socket.gethostname()
    assert _claims.owner_alive(f"{host}:{os.getpid()}") and _claims.owner_alive("another-host:1")
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    pid = p.pid
    assert p.wait() == 0
    assert not _claims.owner_alive(f"{host}:{pid}")


def test_export_untuned_and_tune_the_file_elsewhere(isolated_results, tmp_path):
    offline_workers.record(isolated_results, [20, 21, 22])
    path = tmp_path / "untuned.jsonl"
    assert offline.export_untuned(results_store(), path) == 3
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {tuple(sorted(d)) for d in lines} == {("device", "first_seen", "op", "signature", "spec")}
    other = tmp_path / "other.sqlite"
    with tuning(max_tuning_ms=BUDGET):
        summary = offline.tune_file(path, str(other))
    assert summary.tuned == 3 and len(results_store(str(other)).entries()) == 3
    assert len(results_store().untuned()) == 3  # the source store is untouched
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n[1, 2]\n{\"op\": \"silu\"}\n")
    with pytest.raises(ResultsImportError) as err:
        offline.read_untuned(bad)
    assert [row for row, _ in err.value.errors] == [2, 3]


def test_text_progress_draws_a_bar():
    stream = io.StringIO()
    bar = offline.text_progress(stream, width=10)
    bar(0, 4, "silu x")
    bar(2, 4, "gelu y")
    bar(4, 4, "done")
    assert stream.getvalue().splitlines() == ["[----------] 0/4 silu x", "[#####-----] 2/4 gelu y",
                                              "[##########] 4/4 done"]


def test_parse_gpus_without_gpus():
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without GPUs")
    assert parallel.parse_gpus(None) == []
    with pytest.raises(ValueError, match="0 visible GPU"):
        parallel.parse_gpus("all")


# -- several processes ----------------------------------------------------------------------------
def _check_complete(store, n):
    rows = store._read("SELECT op, signature, device FROM entries")
    assert len(rows) == len(set(rows)) == n
    assert store.untuned() == [] and all(e.complete for e in store.entries())


@pytest.mark.parametrize("start_method", [None, "spawn"])  # None: fork here (Linux, no CUDA initialised)
def test_two_worker_processes_share_the_work(isolated_results, start_method):
    offline_workers.record(isolated_results, range(60, 68))
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    with tuning(max_tuning_ms=BUDGET):
        summary = parallel.tune_parallel(str(isolated_results), None, workers=2, local_worker=False,
                                         initializer=functools.partial(offline_workers.meet_then_slow, barrier, 0.2),
                                         start_method=start_method)
    _check_complete(results_store(), 8)
    assert summary.tuned == 8 and summary.failed == []  # each signature tuned exactly once
    spawned = [w for w in summary.workers if w["where"] == "spawned"]
    assert len(spawned) == 2 and all(w["exitcode"] == 0 and w["tuned"] >= 1 for w in spawned), summary.workers


def test_a_killed_workers_signature_is_retaken(isolated_results):
    offline_workers.record(isolated_results, range(70, 76))
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    with tuning(max_tuning_ms=BUDGET):
        summary = parallel.tune_parallel(str(isolated_results), None, workers=2, local_worker=False,
                                         initializer=functools.partial(offline_workers.die_on_first_item, 1, barrier))
    _check_complete(results_store(), 6)
    assert summary.tuned == 6
    victim = next(w for w in summary.workers if w["worker"] == 1)
    assert victim["exitcode"] == -9 and "tuned" not in victim


def test_workers_fork_unless_cuda_is_initialised_here(monkeypatch):
    import sys

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert parallel._start_method() == ("fork" if sys.platform.startswith("linux") else "spawn")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a forked CUDA context is unusable
    assert parallel._start_method() == "spawn"


def test_this_process_works_too_and_progress_counts_every_worker(isolated_results):
    offline_workers.record(isolated_results, range(80, 84))
    calls = []
    with tuning(max_tuning_ms=BUDGET):
        summary = parallel.tune_parallel(str(isolated_results), None, workers=2,
                                         progress=lambda *a: calls.append(a))
    _check_complete(results_store(), 4)
    assert summary.tuned == 4 and calls[-1] == (4, 4, "done")
    local, spawned = summary.workers[:2]
    assert local["where"] == "this process" and local["tuned"] + spawned.get("tuned", 0) == 4
    assert spawned["exitcode"] == 0 or spawned["stopped"]  # ended early when nothing was left for it
    with pytest.raises(ValueError, match="not a usable results file"):
        parallel.tune_parallel(":memory:", None)


@pytest.mark.gpu
def test_tune_parallel_on_every_gpu(isolated_results, cuda):
    gpus = list(range(torch.cuda.device_count()))
    with tuning(tuning=False, record_untuned=True):
        for n in (1 << 16, (1 << 16) + 64, 1 << 18, 1 << 20):
            tunekit.silu(torch.randn(n, device="cuda", dtype=torch.float16))
        tunekit.logsumexp(torch.randn(256, 1024, device="cuda"), -1)
    keys = [(r.op, r.signature, r.device) for r in results_store().untuned()]
    assert len(keys) == 5
    with tuning(max_tuning_ms=500):
        summary = parallel.tune_parallel(str(isolated_results), gpus)
    assert summary.failed == [] and summary.tuned + summary.incomplete == 5
    assert all(results_store().get(*k) is not None for k in keys)


def test_the_tune_entry_point_picks_this_process_and_takes_a_file(isolated_results, tmp_path):
    from tunekit.offline import run as tune

    offline_workers.record(tmp_path / "elsewhere.sqlite", [90, 91])
    offline.export_untuned(results_store(str(tmp_path / "elsewhere.sqlite")), tmp_path / "u.jsonl")
    offline_workers.record(isolated_results, [92])
    with tuning(max_tuning_ms=BUDGET):
        summary = tune.run(file=tmp_path / "u.jsonl")  # only the file's two, not the store's own record
    assert (summary.total, summary.tuned) == (2, 2)
    assert [r.signature for r in results_store().untuned()] == [SiluParams(torch.randn(92)).signature()]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="0 visible GPU"):
            tune.run(gpus="all")


def test_a_results_file_that_fails_mid_run_stops_the_run_loudly(isolated_results):
    """Falling back to memory would let the run go on 'tuning' into nothing: it stops, and says why."""
    import sqlite3
    import warnings

    from tunekit.offline import recorded
    from tunekit.tunable.errors import ResultsStoreError, TunekitWarning

    offline_workers.record(isolated_results, [60, 61, 62])
    store = results_store()

    def break_the_file(kind, label):
        if kind == "tuned":  # the first entry is saved; then someone damages the file
            conn = sqlite3.connect(isolated_results)
            conn.execute("DROP TABLE entries")
            conn.commit()
            conn.close()

    settings = tune_one.offline_settings(tunekit.TuningSettings(max_tuning_ms=BUDGET), store)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ResultsStoreError) as raised:
        warnings.simplefilter("always")
        recorded.work(store, torch.device("cpu"), settings, run="r", event=break_the_file)
    assert f"cannot save tuning results: results file '{isolated_results}' failed while in use" in str(raised.value)
    assert [str(w.message) for w in caught if issubclass(w.category, TunekitWarning)][0].startswith(
        f"tunekit results file '{isolated_results}' failed while in use (no such table: entries)")
    with pytest.raises(ResultsStoreError, match="cannot tune"):
        offline.tune_recorded(store)  # and any later run on this store stops before tuning anything


def test_a_failed_worker_is_in_the_summary_and_fails_it():
    summary = offline.TuneSummary(device="cpu", tuned=2)
    assert summary.ok and "failed:" not in str(summary)
    summary.workers = [{"worker": 0, "device": "cpu", "tuned": 2},
                       {"worker": 1, "device": "cpu", "error": "Traceback ...\n  ...\nResultsStoreError: cannot tune\n"}]
    assert not summary.ok and summary.worker_errors == ["worker 1 [cpu]: ResultsStoreError: cannot tune"]
    assert str(summary).splitlines()[-1] == "  failed: worker 1 [cpu]: ResultsStoreError: cannot tune"
