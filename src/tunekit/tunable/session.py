"""A signature's tuning as a session that can be spread over the calls that meet it.

:func:`~tunekit.tunable.find_fastest.find_fastest`'s work (screening, probes, pruning, timed rounds,
the choice) is written here once, as a generator that yields at every natural boundary: after a
candidate's check, after a probe, after a round. :meth:`TuningSession.advance` runs it for at most
one call's share of time (``tuning_step_ms``) and returns; the next call resumes where it stopped.
Meanwhile every call runs the **incumbent**: the default, until a challenger that passed the
numerical check probes decisively faster (:data:`DECISIVE`), then that challenger. Why:

- A first call must not stall: compiling a candidate's kernel (NVRTC, Triton) takes 0.1-1 s. With
  ``background``, candidates that have a ``prepare(params)`` method (the expensive first-use work:
  compile and load, never a launch) are prepared on worker threads; a call never waits for them
  (it runs the incumbent, and a later call checks a candidate once it is prepared): waiting for a
  compile took each call's whole 20 ms share for dozens of calls.
- Candidates that compile must not find the budget spent when they are ready: while any compiles,
  those with nothing to compile may use only part of it (:data:`PREPARED_RESERVE`).
- A budget spent before the timed rounds must not freeze the default when the evidence is already
  clear: a checked challenger whose probe is several times faster is no noise. After the budget,
  the choice is the incumbent (or, with complete rounds, the margin rule's winner), and the entry
  is stored incomplete so the next process resumes it.
- A challenger must also save more device time than its call adds on the host where the default's
  call path is cheaper (``margin_rule.floor_ms``: ``op.challenger_host_ms``, or the op's
  ``challenger_floor`` rule; GEMM: torch's kernels are called from C++ routes, a challenger through the general path):
  otherwise a host-bound program gets slower.

The session owns copies of the inputs (the caller's tensors may change between calls), the input
sets that keep timed runs cold in L2, and each candidate's captured measurement; it drops them when
it ends. Budget: ``max_tuning_ms`` of the calling thread's time inside :meth:`advance`, waits for
background preparation excluded, and so are the support screen (its first run imports the backends:
0.5 s for Triton's GEMM kernels) and the op's ``warm_numerics`` (the check's first kernels load in
0.15-0.5 s, once per process): charged, each left a 200 ms budget nothing to check a candidate with. An
online session of an op that makes its work safe off the caller's thread (``op.off_thread``:
``ops/_shared/routing.off_thread``) runs both on the session worker (``preparations.session_worker``: never behind
compiles), calls meanwhile running the default: the screen (0.2-0.45 s of a GEMM signature's first call), then
the warm-up (in a call it stalled that call 0.2-0.5 s); none of the session's own steps runs before it ended
(beside it, the default's probe took 15 ms more of the budget, and a 13-candidate GEMM's timed rounds never began).
"""

from __future__ import annotations

import collections
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

from . import margin_rule
from .context import TuningSettings
from .entries import CandidateRecord
from .errors import TunekitWarning
from .host_time import host_time_steps
from .params import OpParams, make_trial
from .preparations import Preparations
from .screen import WorkBudget, check, input_sets, reference, supports
from .timed_rounds import MAX_ROUNDS, MIN_ROUNDS, TimedRounds
from .timing import Timer, make_timer

__all__ = ["TuningSession", "TuningReport", "WorkBudget", "DECISIVE", "MIN_ROUNDS", "MAX_ROUNDS"]

#: a challenger replaces the incumbent on a single probe only when it takes at most 1/DECISIVE of
#: the incumbent's time: far outside the few percent one measurement of device time varies by
DECISIVE = 1.25
#: how many of the latest pieces of work predict the next one's duration (advance's look-ahead): a
#: few, so one slow piece (a first launch) does not shorten every later call's share
UNIT_WINDOW = 3
#: the default's probe times this is the most its timed rounds are taken to read (probes are one pass:
#: a few percent of noise), when judging whether a challenger could save its floor (margin_rule.floor_ms)
PROBE_SLACK = 1.05
#: share of a call's step left to the call's own work (its run, lookup, the store) and to a piece of work
#: longer than the look-ahead predicted: filled to the last millisecond, 112 of 180 first-use rows read
#: 20.1-21 ms for a 20 ms step; with 5% left, 16 of 45 logsumexp rows still read 20-24 ms (H100, no
#: shipped results: docs/measurements.md)
STEP_SLACK = 0.15
#: share of the budget kept for candidates compiling in the background: those with nothing to compile (cuBLASLt's
#: algorithms) may spend only the rest before them (without it, 4097 x 4095 x 4096 froze on cuBLAS, 6.5x slower)
PREPARED_RESERVE = 0.5
_WAIT = object()  # yielded when every remaining check waits for a background preparation
#: the preparations that run the session's own work on a worker (not candidates' names): the op's warm_numerics,
#: and the support screen
WARM_UP, SCREEN = "(numerical check's warm-up)", "(support screen)"


@dataclass
class TuningReport:
    choice: str
    complete: bool
    candidates: dict[str, CandidateRecord] = field(default_factory=dict)
    tuning_ms: float = 0.0


class TuningSession(TimedRounds):
    """One signature's tuning (see the module docstring). ``incumbent``: what calls run until the
    session decides; ``report``: the :class:`TuningReport` once :meth:`advance` returned True."""

    def __init__(self, op, params: OpParams, settings: TuningSettings, *, clock: Callable[[], float],
                 timer: Timer | None = None, background: bool = False, incumbent=None):
        self.op, self.settings, self.clock, self.timer = op, settings, clock, timer
        self.injected_timer = timer is not None
        self.budget = WorkBudget(settings.max_tuning_ms, clock)
        # own copies of the inputs when tuning spans calls (the caller may change its tensors)
        self.trial = make_trial(params, copy_inputs=background)
        # the caller's layout on the session's tensors: outputs the caller left to the op stay None
        self.like_call = self.trial.replace(**{n: None for n in params.outputs if getattr(params, n) is None})
        self.background = background
        self.records: dict[str, CandidateRecord] = {}
        self.incumbent = incumbent if incumbent is not None else op.default
        self.report: TuningReport | None = None
        self.checked = 0
        self.agree = None  # the op's numerical check, once the reference is made
        self.preparations = Preparations()
        self.deferred: set[str] = set()  # left out by design: past the online cap, or unable to save their floor
        self.seen_prepared = 0  # preparations.finished when _check_all last looked for a ready candidate
        self._parked_at: int | None = None  # seen_prepared when advance last stopped to wait for one
        self._steps = self._work()
        self._units: collections.deque[float] = collections.deque(maxlen=UNIT_WINDOW)  # recent pieces' s
        self.waited_ms = 0.0
        self.calls = 0  # calls of the signature that met this session (resumed it or ran its parked incumbent)

    # -- driving --------------------------------------------------------------------------------
    def advance(self, step_ms: float) -> bool:
        """Do at most ``step_ms`` of this call's time of tuning work (less :data:`STEP_SLACK`, the call's
        own); True once the session decided.
        A piece of work is started only when the longest of the last :data:`UNIT_WINDOW` pieces
        still fits in what is left of the share (the first piece of a call always runs: the share
        is a cap on the call, and tuning must progress): without that look-ahead every call ended
        one piece past its share (20.2-22 ms for a 20 ms share, measured on the H200)."""
        if self.report is not None:
            return True
        self._parked_at = None
        blocking = step_ms >= self.settings.max_tuning_ms  # the whole budget in this call: no slack
        end = self.clock() + step_ms * (1.0 if blocking else 1.0 - STEP_SLACK) / 1e3
        self.budget.resume()
        try:
            first = True
            while True:
                now = self.clock()
                if now >= end or (not first and now + max(self._units, default=0.0) > end):
                    return False
                first = False
                step = next(self._steps, None)
                self._units.append(self.clock() - now)
                if step is _WAIT and not self._wait(step_ms):
                    return False
                if self.report is not None:
                    return True
        finally:
            self.budget.pause()

    def parked(self) -> bool:
        """Whether the last :meth:`advance` stopped because every remaining piece of work waits for a
        background preparation, and none has finished since: a call now could only run the
        incumbent, so the op's call path runs it without resuming the session (resuming to find
        nothing ready cost ~50 us per call, 4-5x a small GEMM's whole host time, H200 host)."""
        return self._parked_at is not None and self._parked_at == self.preparations.finished

    def run(self) -> TuningReport:
        """The whole session in this call (find_fastest)."""
        self.advance(math.inf)
        return self.report

    def _wait(self, step_ms: float) -> bool:
        """Wait for the first pending preparation when the session runs in one call (``find_fastest``);
        a call with a finite share returns at once (False) instead: waiting would only delay the
        caller (the preparation runs on its worker either way), so the call runs the incumbent and a
        later call checks the candidate once it is ready."""
        pending = self.preparations.first_pending()
        if pending is None:
            return True
        if step_ms != math.inf:
            self._parked_at = self.seen_prepared
            return False
        start = self.clock()
        with self.budget.paused():
            pending.exception()
        self.waited_ms += (self.clock() - start) * 1e3
        return True

    # -- the work -----------------------------------------------------------------------------------
    def _work(self):
        # long: the whole tuning as one generator, so the steps read in order; each phase is a method
        op, s = self.op, self.settings
        supported = yield from self._screen()
        yield from self._until_ready(WARM_UP)  # beside the warm-up, the default's probe took 15 ms more (charged)
        base, expected = reference(op, self.trial)
        self.base = base
        self.agree = op.numerics(self.trial) if s.numerical_check else None
        yield
        survivors = [op.default]
        self.probe: dict[str, float] = {}
        self.sets = input_sets(self.like_call, base)
        self.timer = self.timer or make_timer(base.device, graph=s.cuda_graph, clock=self.clock)
        yield  # the input sets (allocation, copies) are a piece of their own
        if len(supported):
            self.probe[op.default.name] = self._measure(op.default)
            yield
            supported = self._drop_hopeless(supported)
            if not supported:
                return
        self._start_preparations()
        yield from self._check_all(supported, expected, survivors)
        if len(survivors) == 1:
            self.records[op.default.name] = CandidateRecord("chosen", reason="the only candidate that can run")
            self._finish(op.default.name, self._screened())
            return
        timed = self._prune(survivors)
        times, rounds = yield from self._rounds(timed)
        yield from self._decide(survivors, times, rounds >= MIN_ROUNDS)

    def _screen(self):
        """The support screen, off the budget: online on a preparation worker where the op made its work safe there
        (``op.off_thread``), calls meanwhile running the default (in the call, its backends' imports and cuBLASLt's
        first heuristic took 0.2-0.45 s of a GEMM signature's first call, H100); else in the call."""
        job = self._off_thread(lambda trial: self._screen_support())
        if job is None:
            with self.budget.paused():  # screening loads the backends (once per process): not this signature's work
                return self._screen_support()
        self.preparations.start(SCREEN, job, self.trial, own=True)
        yield from self._until_ready(SCREEN)
        if self.preparations.succeeded(SCREEN):
            return self.preparations.result(SCREEN)
        failure = self.preparations.failure(SCREEN)
        if failure is not None:  # not for a session cancelled before its screen started
            warnings.warn(f"tunekit: {self.op.name}: the support screen failed on its worker ({failure!r}); it runs "
                          "in the call", TunekitWarning, stacklevel=2)
        self.records.clear()  # again, in the call
        with self.budget.paused():
            return self._screen_support()

    def _until_ready(self, name: str):
        """Yield _WAIT (calls run the incumbent) until the preparation ``name`` ended (at once when none started)."""
        while True:
            self.seen_prepared = self.preparations.finished  # before looking: one ending after it un-parks
            if self.preparations.ready(name):
                return
            yield _WAIT

    def _off_thread(self, fn):
        """``fn(trial)`` made safe on a preparation worker by the op (``op.off_thread``: routing.off_thread);
        None where the op has no such wrapper, the session runs in one call, or it says the trial's device has nothing
        worth a worker (the CPU loads no kernel lazily)."""
        wrap = self.op.off_thread
        if not self.background or wrap is None:
            return None
        job = wrap(fn)
        return job if getattr(job, "worth", lambda params: True)(self.trial) else None

    def _screen_support(self):
        """Candidates that can run these params (records for the rest); their preparation starts. An
        online session prepares at most the op's ``online_preparations`` candidates, the first worth
        trying in the op's order (best first): see :mod:`tunekit.tunable.preparations`."""
        supported, cap = [], self.op.online_preparations if self.background else None
        self._to_prepare: list[tuple[str, object]] = []
        for c in self.op.candidates:
            if c is self.op.default:
                continue
            why = supports(c, self.trial)
            if why:
                self.records[c.name] = CandidateRecord("unsupported", reason=why)
                continue
            prepare = getattr(c, "prepare", None)
            if self.background and prepare is not None:
                if cap is not None and len(self._to_prepare) >= cap:
                    self.records[c.name] = CandidateRecord("skipped", reason=f"online tuning compiles the first {cap} "
                                                           "candidates worth trying; offline tuning tries every one")
                    self.deferred.add(c.name)
                    continue
                self._to_prepare.append((c.name, prepare))
            supported.append(c)
        warm = self._off_thread(self.op.warm_numerics) if supported and self._warms() else None
        if warm is not None:  # the session's own worker: never behind compiles
            self.preparations.start(WARM_UP, warm, self.trial, own=True)
        self._start_preparations(lambda name: not self._floor(name))  # the rest once the default's probe tells
        return supported

    def _warms(self) -> bool:
        return self.settings.numerical_check and self.op.warm_numerics is not None

    def _start_preparations(self, which=lambda name: True) -> None:
        for name, prepare in self._to_prepare:
            if which(name):
                self.preparations.start(name, prepare, self.trial)
        self._to_prepare = [(name, prepare) for name, prepare in self._to_prepare if not which(name)]

    def _floor(self, name: str) -> float:
        """ms of device time challenger ``name`` must save over the default (``margin_rule.floor_ms``), for
        the call as the caller made it (an output it left to the op is new, not the trial's buffer)."""
        return margin_rule.floor_ms(self.op, self.like_call, self.op.candidate(name))

    def _drop_hopeless(self, supported) -> list:
        """The challengers of ``supported`` that could save their floor (``margin_rule.floor_ms``) over
        the default's probe at the params' ``fastest_possible_ms()`` (a roofline bound; 0 without one);
        the others are skipped by design, nothing of theirs compiled (a LLaMA-style step's 10-30 us
        GEMMs queued thirty Triton compiles that could not have won). When none is left, the default is
        the choice, complete, and the list is empty."""
        fastest = getattr(self.trial, "fastest_possible_ms", lambda: 0.0)()
        base, default = self.probe[self.op.default.name], self.op.default.name
        kept, why = [], ""
        for c in supported:
            floor = self._floor(c.name)
            if not floor or base * PROBE_SLACK - floor >= fastest:
                kept.append(c)
                continue
            why = (f"cannot save {floor * 1e3:.1f} us: the default's probe is {base * 1e3:.1f} us and no candidate "
                   f"can take under {fastest * 1e3:.1f} us")
            self.records[c.name] = CandidateRecord("skipped", reason=why)
            self.deferred.add(c.name)
        self._to_prepare = [(n, p) for n, p in self._to_prepare if n not in self.deferred]
        if not kept:
            self.records[default] = CandidateRecord("chosen", time_ms=base, reason=why)
            self._finish(default, True)
        return kept

    def _check_all(self, supported, expected, survivors):
        """Each candidate checked, then probed, as its preparation allows; a decisive one becomes the incumbent."""
        pending = list(supported)
        while pending:
            if self.budget.left_ms() <= 0:  # the rest are never checked: no wait for them, no worker compiles them
                for c in pending:
                    self.records[c.name] = CandidateRecord("skipped", reason="tuning budget exhausted")
                    self.preparations.cancel(c.name)
                return
            self.seen_prepared = self.preparations.finished  # before looking: one ending after it un-parks
            c = self._next_to_check(pending)
            if c is None:
                yield _WAIT
                continue
            pending.remove(c)
            if not self.checked:
                self._warm_numerics()
            rejected = check(c, make_trial(self.trial), expected, self.agree)
            self.checked += 1
            if rejected:
                self.records[c.name] = rejected
                yield
                continue
            survivors.append(c)
            yield
            # a check is worth its probe: the pair is one piece of work (the budget gates the next check)
            self.probe[c.name] = self._measure(c)
            if self.probe[c.name] * DECISIVE <= self.probe.get(self.incumbent.name, math.inf):
                self.incumbent = c
            yield

    def _warm_numerics(self) -> None:
        """Before the first check only (a session that checks nothing pays nothing), off the budget: done on a
        worker already (:meth:`_screen_support` started it), else in the call (again there if it failed on the
        worker)."""
        if not self._warms() or self.preparations.succeeded(WARM_UP):
            return
        with self.budget.paused():
            self.op.warm_numerics(self.trial)

    def _next_to_check(self, pending):
        """The first ready candidate; one with nothing to compile waits while others compile and the budget
        left is down to :data:`PREPARED_RESERVE` (None: wait for a preparation)."""
        compiling = any(self.preparations.started(c.name) for c in pending)
        hold = self.settings.max_tuning_ms * PREPARED_RESERVE if compiling else 0.0
        for c in pending:
            if self.preparations.ready(c.name) and (self.preparations.started(c.name) or self.budget.left_ms() > hold):
                return c
        return None

    # -- the choice ---------------------------------------------------------------------------------
    def _screened(self) -> bool:  # every candidate considered (those deferred to offline tuning by design)
        return not any(r.status == "skipped" and name not in self.deferred for name, r in self.records.items())

    def _decide(self, survivors, times: dict[str, float], rounds_done: bool):
        """The margin rule (``margin_rule.py``) on the rounds' medians when they completed, else the
        decisive rule on what was measured; then, on CUDA, the host-time tie-break, a piece at a time
        (its choice the incumbent meanwhile); the report is the session's once that ended."""
        default = self.op.default.name
        margin = self.settings.margin if rounds_done else 1.0 - 1.0 / DECISIVE
        choice = margin_rule.choose(times, default, margin, self._floor)
        for name in times:
            self.records[name] = margin_rule.record(name, times, choice, default, margin, rounds_done, self._floor)
        report = self._report(choice, self._screened() and rounds_done)
        if self._breaks_ties(rounds_done):
            yield from host_time_steps(report, survivors, times, self.remeasure, self.like_call, self.base, self.budget)
            self.incumbent = self.op.candidate(report.choice)
            report.tuning_ms = self.budget.spent_ms()
        self.report = report

    def _breaks_ties(self, rounds_done: bool) -> bool:
        """The host-time tie-break follows complete rounds of the session's own timer, on CUDA."""
        return self.base.device.type == "cuda" and rounds_done and not self.injected_timer

    def _report(self, choice: str, complete: bool) -> TuningReport:
        self.preparations.cancel()  # the choice is made: what has not started compiling never will
        self.incumbent = self.op.candidate(choice)
        return TuningReport(choice, complete, self.records, self.budget.spent_ms())

    def _finish(self, choice: str, complete: bool) -> TuningReport:
        self.report = self._report(choice, complete)
        return self.report
