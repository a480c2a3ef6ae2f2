"""A tuning session's own slow work (tunable/session.py): the support screen (its first run imports the backends and
asks cuBLASLt's heuristic: 0.2-0.45 s of a GEMM signature's first call on the H100) and the op's ``warm_numerics``
(the check's first kernel loads: 0.2-0.5 s once per process) are never charged to the budget. An online session of an
op that makes its work safe off the caller's thread (``op.off_thread``: ``backends/thread_context.off_thread``; its
wrapper's ``worth(params)`` says where a worker pays) runs both on preparation workers: the screen while calls run the
default, the warm-up started before any compile and no candidate checked until it ended. Otherwise, or where the
warm-up failed on its worker, they run in the call."""

import threading
import time

import pytest
import torch

from tunekit.tunable import preparations, session, tuning
from tunekit.tunable.errors import TunekitWarning
from tunekit.tunable.find_fastest import find_fastest

from fakes import ScaleParams
from test_session import compiled_on_release, fresh_op, wait_until


def worker_safe(worth: bool = True):
    """A fake ``op.off_thread``: the function as it is, worth a worker or not."""
    def wrap(fn):
        def job(params):
            return fn(params)
        job.worth = lambda params: worth
        return job
    return wrap


def blocking_warm_up(threads: list, fail_first: bool = False):
    """A warm_numerics that blocks until the returned Event is set; ``threads`` gets the thread of each run; with
    ``fail_first`` its first run raises."""
    release = threading.Event()

    def warm(params):
        threads.append(threading.current_thread())
        if fail_first and len(threads) == 1:
            raise RuntimeError("the warm-up failed on the worker")
        release.wait(timeout=30)

    return warm, release


def screened_with(op, name: str, hook) -> None:
    """Candidate ``name`` calls ``hook()`` first whenever its supports() is asked (the support screen)."""
    wrapped = op.candidate(name)

    class Screened:  # the fake candidate, its supports() hooked
        def __init__(self):
            self.name, self.run, self.source_hash = wrapped.name, wrapped.run, wrapped.source_hash

        @staticmethod
        def supports(params):
            hook()
            return wrapped.supports(params)

    op.candidates[op.candidates.index(wrapped)] = op._by_name[name] = Screened()


def resolve_until_decided(op, x, seconds: float = 30.0):
    """Calls until the signature is decided (the workers finish on their own: a parked call returns at once)."""
    deadline = time.monotonic() + seconds
    while True:
        r = op.resolve(ScaleParams(x))
        if r.cache or time.monotonic() > deadline:
            return r
        time.sleep(0.001)


def test_the_numerical_checks_warm_up_is_not_charged_to_the_budget():
    """Charged, the GEMM check's warm-up (230 ms on the H100) spent the first signature's 200 ms."""
    op, clock = fresh_op({"ref": 4.0, "fast": 1.0})
    warmed = []
    op.warm_numerics = lambda p: warmed.append(p) or clock.advance(1000.0)
    x = torch.randn(64)
    with tuning(max_tuning_ms=100.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
    assert len(warmed) == 1 and report.choice == "fast" and report.complete, report.candidates
    assert report.tuning_ms < 100.0
    with tuning(max_tuning_ms=100.0, tuning_step_ms=float("inf"), numerical_check=False) as s:
        find_fastest(op, ScaleParams(x), s, clock=clock)
    assert len(warmed) == 1  # no check, nothing to warm
    alone, clock = fresh_op({"ref": 4.0, "slow": 9.0}, behaviours={"slow": "unsupported"})
    alone.warm_numerics = lambda p: warmed.append(p) or clock.advance(1000.0)
    with tuning(max_tuning_ms=100.0, tuning_step_ms=float("inf")) as s:
        find_fastest(alone, ScaleParams(x), s, clock=clock)
    assert len(warmed) == 1  # only the default can run: nothing is checked, nothing warmed


def test_an_online_sessions_screen_runs_on_a_worker_while_the_calls_run_the_default():
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    release, seen = threading.Event(), []
    screened_with(op, "fast", lambda: seen.append(threading.current_thread()) or release.wait(timeout=30))
    x = torch.randn(64)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            for _ in range(5):
                assert op.resolve(ScaleParams(x)).candidate.name == "ref"  # each call returns, the default runs
            wait_until(lambda: seen)
            assert op.runs["fast"] == 0 and next(iter(op._sessions.values())).parked()
            release.set()
            r = resolve_until_decided(op, x)
    finally:
        release.set()  # a failed assertion must not leave the worker blocked for the next tests
    assert r.candidate.name == "fast", r.why
    assert seen and all(t is not threading.current_thread() for t in seen)


def test_an_online_sessions_warm_up_runs_on_a_worker_and_no_candidate_is_checked_before_it_ended():
    """In a call it stalled that call 0.2-0.5 s (gemm_stall_trace-before-*); on a worker, the calls meanwhile run
    the default and return, the session parked; once it ended, the challenger is checked and chosen."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    threads = []
    op.warm_numerics, release = blocking_warm_up(threads)
    x = torch.randn(64)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            for _ in range(5):
                assert op.resolve(ScaleParams(x)).candidate.name == "ref"
            wait_until(lambda: threads)
            for _ in range(5):
                assert op.resolve(ScaleParams(x)).candidate.name == "ref"
            under_way = next(iter(op._sessions.values()))
            assert op.runs["fast"] == 0 and under_way.parked()  # nothing checked: calls run the default alone
            assert threads[0] is not threading.current_thread()
            release.set()
            wait_until(lambda: under_way.preparations.succeeded(session.WARM_UP))
            r = resolve_until_decided(op, x)
    finally:
        release.set()
    assert r.candidate.name == "fast" and len(threads) == 1, (r.why, threads)


def test_the_warm_up_starts_before_the_compiles():
    """One worker on a 2-core host: queued behind the candidates' compiles, the first check would wait for all."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    compiled, prepared = compiled_on_release(op, "fast")
    threads = []
    op.warm_numerics, release = blocking_warm_up(threads)
    x = torch.randn(64)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            op.resolve(ScaleParams(x))
            under_way = next(iter(op._sessions.values()))
            wait_until(lambda: "fast" in under_way.preparations._futures)
            assert list(under_way.preparations._futures) == [session.SCREEN, session.WARM_UP, "fast"]
            release.set()
            compiled.set()
            wait_until(lambda: prepared)
            r = resolve_until_decided(op, x)
    finally:
        release.set()
        compiled.set()
    assert r.candidate.name == "fast", r.why


def test_a_warm_up_that_failed_on_the_worker_runs_again_in_the_call_before_the_first_check():
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    threads = []
    op.warm_numerics, release = blocking_warm_up(threads, fail_first=True)
    release.set()
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
        r = resolve_until_decided(op, x)
    assert r.candidate.name == "fast", r.why
    assert len(threads) == 2 and threads[0] is not threading.current_thread() and threads[1] is threading.current_thread()


@pytest.mark.parametrize("off_thread", [None, worker_safe(worth=False)], ids=["no wrapper", "not worth a worker"])
def test_without_a_worker_the_screen_and_the_warm_up_run_in_the_calling_thread_off_the_budget(off_thread):
    """No ``op.off_thread``, or its wrapper says these params are not worth a worker (the CPU): in a call, once, the
    warm-up's time not charged (a 1 s warm-up, a 100 ms budget)."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = off_thread
    threads, screened = [], []
    screened_with(op, "fast", lambda: screened.append(threading.current_thread()))

    def warm(params):
        threads.append(threading.current_thread())
        clock.advance(1000.0)

    op.warm_numerics = warm
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
        r = resolve_until_decided(op, x)
    assert r.candidate.name == "fast" and threads == [threading.current_thread()], (r.why, threads)
    assert screened == [threading.current_thread()]


def test_offline_tuning_runs_its_screen_and_warm_up_in_its_own_thread():
    """find_fastest (one call, no session spread over calls) has no call to spare the stall: it runs them in place."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    threads = []
    op.warm_numerics, release = blocking_warm_up(threads)
    release.set()
    with tuning(max_tuning_ms=100.0, tuning_step_ms=float("inf")) as s:
        report = find_fastest(op, ScaleParams(torch.randn(64)), s, clock=clock)
    assert report.choice == "fast" and threads == [threading.current_thread()]


def test_a_session_forgotten_during_its_screen_starts_nothing_after_it():
    """The screen, still running on its worker when the op forgets the session, would start the warm-up and the
    compiles of a session no call will resume: cancelling every preparation closes the session to new ones."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    compiled, prepared = compiled_on_release(op, "fast")
    compiled.set()
    release, seen = threading.Event(), []
    screened_with(op, "fast", lambda: seen.append(1) or release.wait(timeout=30))
    op.warm_numerics = lambda p: None
    x = torch.randn(64)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            op.resolve(ScaleParams(x))
            under_way = next(iter(op._sessions.values()))
            wait_until(lambda: seen)
            op.forget()
            release.set()
            wait_until(lambda: under_way.preparations.ready(session.SCREEN))
            time.sleep(0.05)  # what the screen would have started would be queued by now
    finally:
        release.set()
    assert list(under_way.preparations._futures) == [session.SCREEN] and not prepared


def test_a_screen_that_failed_on_its_worker_runs_again_in_the_call():
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})

    def failing_on_workers(fn):
        def job(params):
            raise RuntimeError("the worker's setup failed")
        return job

    op.off_thread = failing_on_workers
    op.warm_numerics = None
    x = torch.randn(64)
    with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0), pytest.warns(TunekitWarning, match="screen failed"):
        r = resolve_until_decided(op, x)
    assert r.candidate.name == "fast", r.why


def test_a_screen_that_failed_after_starting_compiles_does_not_start_them_again():
    """The worker's wrapper failed after the screen ran (its stream's sync): the screen runs again in the call, and
    the compile it had started is not started a second time."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    compiled, prepared = compiled_on_release(op, "fast")
    compiled.set()

    def failing_after(fn):
        def job(params):
            fn(params)
            raise RuntimeError("the stream's sync failed")
        return job

    op.off_thread = failing_after
    op.warm_numerics = None
    with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0), pytest.warns(TunekitWarning):
        r = resolve_until_decided(op, torch.randn(64))
    assert r.candidate.name == "fast" and len(prepared) == 1, (r.why, prepared)


def test_no_step_of_the_session_runs_in_a_call_before_the_warm_up_ended(monkeypatch):
    """Beside the warm-up the default's probe took 28-29 ms of the budget instead of 13 (H100): a 13-candidate GEMM's
    timed rounds never began. The reference run waits for the warm-up, and so does everything after it."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5})
    op.off_thread = worker_safe()
    threads, referenced = [], []
    op.warm_numerics, release = blocking_warm_up(threads)
    real = session.reference
    monkeypatch.setattr(session, "reference", lambda *a: referenced.append(1) or real(*a))
    x = torch.randn(64)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            op.resolve(ScaleParams(x))
            wait_until(lambda: threads)
            for _ in range(20):
                op.resolve(ScaleParams(x))
                time.sleep(0.001)
            assert not referenced
            release.set()
            r = resolve_until_decided(op, x)
    finally:
        release.set()
    assert referenced and r.candidate.name == "fast", r.why


def test_a_sessions_own_work_is_not_queued_behind_compiles():
    """A second signature's screen and warm-up run, and its ready candidates are checked, while compiles hold every
    compile worker (its own compile of "medium" waits for them)."""
    op, clock = fresh_op({"ref": 2.0, "fast": 0.5, "medium": 1.0})
    op.off_thread = worker_safe()
    op.warm_numerics = lambda p: None
    compiled, prepared = compiled_on_release(op, "medium")  # its compile blocks until released
    x, y = torch.randn(64), torch.randn(32)
    try:
        with tuning(tuning_step_ms=5.0, max_tuning_ms=100.0):
            op.resolve(ScaleParams(x))
            first = next(iter(op._sessions.values()))
            wait_until(lambda: "medium" in first.preparations._futures)
            blockers = [preparations.preparer().submit(compiled.wait, 30) for _ in range(preparations.PREPARE_WORKERS)]
            deadline = time.monotonic() + 10
            while op.in_effect(ScaleParams(y))[0].name != "fast" and time.monotonic() < deadline:
                op.resolve(ScaleParams(y))
                time.sleep(0.001)
            assert op.in_effect(ScaleParams(y))[0].name == "fast"  # screened, warmed, checked and probed: decisive
    finally:
        compiled.set()
    assert all(b.result(timeout=30) for b in blockers)
