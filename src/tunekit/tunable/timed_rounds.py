"""A tuning session's measurements (:class:`~tunekit.tunable.session.TuningSession` inherits them): a
candidate's probe over the session's input sets, the pruning after the probes, and the interleaved timed
rounds of the survivors, one measurement per piece of work so that a call's share of tuning can stop
between two. Each measurement is a CUDA graph of the candidate over the input sets, captured once and
replayed (events on eager launches where a candidate cannot be captured)."""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Callable

from .errors import TunekitWarning
from .screen import prune
from .timing import make_timer

__all__ = ["TimedRounds", "MIN_ROUNDS", "MAX_ROUNDS", "ENOUGH_MS"]

MIN_ROUNDS = 3
MAX_ROUNDS = 25
#: Rounds stop (after MIN_ROUNDS) once each candidate's samples add up to this much of its own time: 5 rounds of
#: the graph timer's 0.5 ms replays, whose repeated tunings read within 0.1 us of each other
#: (logsumexp_backward_rank_probe-*); without it short kernels took rounds to the whole budget (online: 13 calls,
#: 0.2 s per signature, H200). Samples of 0.84 ms or more stop at MIN_ROUNDS; eager timers' samples of short
#: kernels (0.05 ms) never reach it in MAX_ROUNDS, those of kernels over 0.1 ms a pass do.
ENOUGH_MS = 2.5


class TimedRounds:
    """The measuring half of a session: it uses the session's ``timer``, ``sets``, ``probe``, ``budget``,
    ``records``, ``settings``, ``base`` and ``clock``."""

    def _measure(self, c, reps: int = 1) -> float:
        return self.timer.measure(self._runner(c), reps) / len(self.sets)

    def _runner(self, c):
        run, sets = c.run, self.sets

        def run_all():
            for p in sets:
                run(p)
        return run_all

    def _prune(self, survivors) -> list:
        self.timed, self.fastest = prune(survivors, self.probe, self.settings.prune_ratio, self.records)
        return self.timed

    def _rounds(self, timed):
        """Interleaved rounds of one measurement each, order rotated per round; ({name: ms}, rounds)."""
        n_sets, probe = len(self.sets), self.probe
        self.per_pass = max(self.fastest * n_sets, 1e-6)
        self.reps = max(1, min(1000, math.ceil(self.timer.target_ms / self.per_pass)))
        measures = {}
        for c in timed:
            if self.budget.left_ms() <= 0:
                break
            measures[c.name] = self._prepared(c, self.reps)
            yield
        samples = {name: [] for name in measures}
        # a round costs at least its measured time; after one, its own wall time is the estimate
        round_ms = sum(probe.get(n, 0.0) for n in measures) * n_sets * self.reps + 1e-3
        rounds, names = 0, list(measures)
        sample_ms = self.reps * self.per_pass
        while names and len(measures) == len(timed) and rounds < MAX_ROUNDS:
            if rounds >= MIN_ROUNDS and (self.budget.left_ms() < round_ms or rounds * sample_ms >= ENOUGH_MS):
                break
            if self.budget.left_ms() <= 0:
                break
            start = self.budget.spent_ms()
            shift = rounds % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(measures[name]())
                yield  # a measurement is the unit of work: a call's share stops between two
            round_ms = max(round_ms, self.budget.spent_ms() - start)
            rounds += 1
        times = {c.name: statistics.median(samples[c.name]) / n_sets if samples.get(c.name) else probe[c.name]
                 for c in timed if c.name in probe}
        return times, rounds

    def _prepared(self, c, reps: int) -> Callable[[], float]:
        """A measurement of ``c`` x ``reps`` (a CUDA graph captured once); eager launches for the rest of the
        session if it cannot be captured, with a warning (a candidate that cannot be captured, or a user's thread
        that synchronized the device meanwhile: ``isolation``)."""
        try:
            return self.timer.prepare(self._runner(c), reps)
        except Exception as exc:  # e.g. a candidate that cannot be captured in a CUDA graph
            warnings.warn(f"tunekit: {c.name} could not be timed in a CUDA graph ({type(exc).__name__}: {exc}); "
                          "timed eagerly.", TunekitWarning, stacklevel=2)
            self.timer = make_timer(self.base.device, graph=False, clock=self.clock)
            # eager measurements as long as the eager timer's target, not the graph timer's (10x longer)
            self.reps = reps = max(1, min(1000, math.ceil(self.timer.target_ms / self.per_pass)))
            return self.timer.prepare(self._runner(c), reps)

    def remeasure(self, name: str, target_ms: float) -> Callable[[], float]:
        """A measurement of ``name`` (one of those timed) repeated to about ``target_ms`` (host_time)."""
        c = next(c for c in self.timed if c.name == name)
        return self._prepared(c, max(self.reps, min(1000, math.ceil(target_ms / self.per_pass))))
