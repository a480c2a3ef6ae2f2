"""find_fastest: which candidate runs these params fastest, among those that compute the right thing.

The steps, all inside one wall-clock budget (``max_tuning_ms``) that counts support checks,
compilation (a candidate's first run), numerical checks, probes and timed runs:

1. Screening (:func:`tunekit.tunable.screen.screen`): ``supports()``, the default's reference run
   on proxies, and one checked run of every other supported candidate (also its warm-up).
2. Timing. Inputs are copied into enough sets to overflow the GPU's L2, and each measurement runs
   over all of them, so every run reads cold inputs. A *probe* (one measurement each) drops
   candidates slower than ``prune_ratio`` x the fastest: long-tail candidates cost one probe, not a
   full schedule (ONNX Runtime TunableOp's "tuning speed" question). Then rounds: in each round every
   survivor is measured once, in an order rotated from round to round, so drift hits all alike (its
   "noisy machine" question); as many rounds as the remaining budget allows, at least
   ``MIN_ROUNDS``. The median of the rounds is the candidate's time.

   What a measurement is, on CUDA: the device time of the candidate's kernels run back to back.
   By default (``cuda_graph``) each candidate's runs are captured once into a CUDA graph and its
   replays timed; the one-shot probes, and the fallback when a candidate cannot be captured, launch
   eagerly behind a spin kernel that holds the stream until the host has enqueued them all
   (:class:`~tunekit.tunable.timing.CudaQueuedTimer`, nvbench's "blocking kernel"). Either way
   launch cost and host jitter stay out of the number: plain events around eager launches measure
   the host's launch rate whenever a kernel is shorter than its launch, which ranks candidates by
   launch cost (part of the "noisy machine" question).
3. Choice: the fastest, except that the default keeps its place unless the challenger is faster by
   more than ``margin``: a tuned op is never slower than an untuned one by more than noise. On
   CUDA, candidates tied with the choice on device time are then compared on host time
   (:mod:`tunekit.tunable.host_time`), which is what an eager caller of a small op waits on.

An entry whose budget ran out before every candidate was screened, or before ``MIN_ROUNDS``
completed rounds, is marked incomplete.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from .context import TuningSettings
from .entries import CandidateRecord
from .host_time import prefer_less_host_time
from .params import OpParams
from .screen import MAX_INPUT_SETS, Budget, input_sets, screen
from .timing import Timer, make_timer

__all__ = ["find_fastest", "TuningReport", "MIN_ROUNDS", "MAX_ROUNDS", "MAX_INPUT_SETS", "input_sets"]

MIN_ROUNDS = 3
MAX_ROUNDS = 25


@dataclass
class TuningReport:
    choice: str
    complete: bool
    candidates: dict[str, CandidateRecord] = field(default_factory=dict)
    tuning_ms: float = 0.0


def find_fastest(op, params: OpParams, settings: TuningSettings, *, clock: Callable[[], float] = time.perf_counter,
                 timer: Timer | None = None) -> TuningReport:
    """Tune ``op`` for ``params`` (never touching the user's buffers). See the module docstring."""
    budget = Budget(settings.max_tuning_ms, clock)
    found = screen(op, params, numerical_check=settings.numerical_check, budget=budget)
    records, survivors, default = found.records, found.passed, op.default
    if len(survivors) == 1:
        records[default.name] = CandidateRecord("chosen", reason="the only candidate that can run")
        return TuningReport(default.name, found.complete, records, budget.spent_ms())
    if budget.left_ms() <= 0:
        for c in survivors[1:]:
            records[c.name] = CandidateRecord("skipped", reason="tuning budget exhausted")
        records[default.name] = CandidateRecord("chosen", reason="default (budget exhausted before timing)")
        return TuningReport(default.name, False, records, budget.spent_ms())

    timing = _Timing(survivors, found.base, params, settings, budget, timer, clock)
    times, complete_timing = timing.run(records)
    report = _choose(default, times, settings, records, found.complete and complete_timing, budget)
    if params.device.type == "cuda" and timer is None:
        prefer_less_host_time(report, survivors, times, timing.remeasure, params, found.base, budget)
    return report


class _Timing:
    """The probe, the pruning and the timed rounds over one list of input sets shared by every
    candidate (outputs are overwritten and in-place buffers re-mutated by each run, which changes
    no candidate's speed)."""

    def __init__(self, survivors, base, params, settings, budget, timer, clock):
        self.survivors, self.settings, self.budget = survivors, settings, budget
        self.timer = timer or make_timer(params.device, graph=settings.cuda_graph, clock=clock)
        self.fallback = lambda: make_timer(params.device, graph=False, clock=clock)
        self.sets = input_sets(params, base)
        self.timed: list = []
        self.per_pass = self.reps = 0

    def runner(self, c):
        run, sets = c.run, self.sets

        def run_all():
            for p in sets:
                run(p)
        return run_all

    def run(self, records) -> tuple[dict[str, float], bool]:
        """({name: median ms per call}, whether MIN_ROUNDS rounds completed); pruned candidates
        get their records here."""
        n_sets = len(self.sets)
        probe = {c.name: self.timer.measure(self.runner(c), 1) / n_sets for c in self.survivors}
        fastest = min(probe.values())
        self.timed = [self.survivors[0]]
        for c in self.survivors[1:]:
            if probe[c.name] > self.settings.prune_ratio * fastest:
                records[c.name] = CandidateRecord(
                    "pruned", time_ms=probe[c.name],
                    reason=f"probe {probe[c.name]:.4g} ms > {self.settings.prune_ratio:g} x fastest {fastest:.4g} ms")
            else:
                self.timed.append(c)
        # Repetitions per measurement so one measurement is well above the timer's resolution.
        self.per_pass = max(fastest * n_sets, 1e-6)
        self.reps = max(1, min(1000, math.ceil(self.timer.target_ms / self.per_pass)))
        try:
            measures = {c.name: self.timer.prepare(self.runner(c), self.reps) for c in self.timed}
        except Exception:  # e.g. a candidate that cannot be captured in a CUDA graph: fall back to events
            self.timer = self.fallback()
            measures = {c.name: self.timer.prepare(self.runner(c), self.reps) for c in self.timed}
        # A round costs at least its measured time; on CUDA its wall time is larger (the host enqueue,
        # the spin of a queued timer), so after a round its own wall time is the estimate.
        round_ms = sum(probe[c.name] for c in self.timed) * n_sets * self.reps + 1e-3
        samples = self._rounds(measures, round_ms)
        times = {name: statistics.median(s) / n_sets if s else probe[name] for name, s in samples.items()}
        return times, min(map(len, samples.values())) >= MIN_ROUNDS

    def _rounds(self, measures, round_ms) -> dict[str, list[float]]:
        samples = {c.name: [] for c in self.timed}
        budget, timed = self.budget, self.timed
        rounds = 0
        while rounds < MAX_ROUNDS:
            if rounds >= MIN_ROUNDS and budget.left_ms() < round_ms:
                break
            if rounds < MIN_ROUNDS and budget.left_ms() <= 0:
                break
            shift = rounds % len(timed)
            started = budget.spent_ms()
            for c in timed[shift:] + timed[:shift]:
                samples[c.name].append(measures[c.name]())
            round_ms = max(round_ms, budget.spent_ms() - started)
            rounds += 1
        return samples

    def remeasure(self, name: str, target_ms: float) -> Callable[[], float]:
        """A measurement of ``name`` (one of those timed) repeated to about ``target_ms``."""
        c = next(c for c in self.timed if c.name == name)
        return self.timer.prepare(self.runner(c), max(self.reps, min(1000, math.ceil(target_ms / self.per_pass))))


def _choose(default, times, settings, records, complete, budget) -> TuningReport:
    best = min(times, key=times.get)
    base = times[default.name]
    choice = default.name
    if best != default.name and times[best] < base * (1.0 - settings.margin):
        choice = best
    for name, t in times.items():
        if name == choice:
            why = "fastest" if name == best else f"default kept: no candidate faster by more than {settings.margin:.0%}"
            records[name] = CandidateRecord("chosen", time_ms=t, reason=why)
        else:
            ratio = t / times[choice] if times[choice] > 0 else math.inf
            why = f"{ratio:.2f}x the time of {choice}"
            if name == best and choice == default.name:
                why = f"faster by {1 - t / base:.1%}, within the {settings.margin:.0%} margin"
            records[name] = CandidateRecord("slower", time_ms=t, reason=why)
    return TuningReport(choice, complete, records, budget.spent_ms())
