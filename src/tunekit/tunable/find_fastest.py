"""find_fastest: which candidate runs these params fastest, among those that compute the right thing.

The steps, all inside one wall-clock budget (``max_tuning_ms``) that counts support checks,
compilation (a candidate's first run), numerical checks, probes and timed runs:

1. ``supports()``: unsupported candidates are skipped with their reason.
2. The default runs once on proxies (:func:`~tunekit.tunable.params.make_trial`): its output is the
   reference. Each other candidate runs once on its own proxies (outputs pre-filled with NaN); it
   is rejected if it raises, returns a tensor other than the outputs it was given, or (with
   ``numerical_check``) disagrees with the reference (:mod:`tunekit.tunable.numerics`). That first
   run is also its warm-up (JIT compilation, caches).
3. Timing. Inputs are copied into enough sets to overflow the GPU's L2, and each measurement runs
   over all of them, so every run reads cold inputs. A *probe* (one measurement each) drops
   candidates slower than ``prune_ratio`` x the fastest: long-tail candidates cost one probe, not a
   full schedule (the seed's "tuning speed" question). Then rounds: in each round every survivor is
   measured once, in an order rotated from round to round, so drift hits all alike (the seed's
   "noisy machine" question); as many rounds as the remaining budget allows, at least
   ``MIN_ROUNDS``. The median of the rounds is the candidate's time.

   What a measurement is, on CUDA: the device time of the candidate's kernels run back to back.
   By default (``cuda_graph``) each candidate's runs are captured once into a CUDA graph and its
   replays timed; the one-shot probes, and the fallback when a candidate cannot be captured, launch
   eagerly behind a spin kernel that holds the stream until the host has enqueued them all
   (:class:`~tunekit.tunable.timing.CudaQueuedTimer`, the "blocking kernel" of nvbench). Either way
   launch cost and host jitter stay out of the number. Plain events around eager launches measure
   the host's launch rate whenever a kernel is shorter than its launch (4 MB elementwise ops: 1-2 us
   on the device, 5-7 us to launch), which ranked candidates by launch cost and picked one 3%
   slower on an H200 (part of the seed's "noisy timings" question). Left out: host launch cost,
   which differs between backends (a Triton launch costs more host time than a torch one); it is
   what a host-bound eager caller waits on, but inside a CUDA graph, or whenever the GPU is behind
   the host, device time is what the caller gets.
4. Choice: the fastest, except that the default keeps its place unless the challenger is faster by
   more than ``margin``: a tuned op is never slower than an untuned one by more than noise. On
   CUDA, candidates tied with the choice on device time (within 1%) are then timed on the host,
   as a cached call would run them (a candidate's fast runner where the public function uses
   one), and when the choice is host-bound (at least 1.5x more host time per call than device time:
   small inputs, where an eager caller waits on the launch, not on the kernel) one that costs
   clearly less host time per call wins the tie, once a head-to-head re-measure of the two, with
   longer measurements, confirms it (on an H100, ties seen in the rounds' medians went to candidates
   1.5-3% slower than torch's kernel in the benchmark's longer measurements: 7 tunings in 8 for
   GELU tanh on 4 MiB of float16).

An entry whose budget ran out before ``MIN_ROUNDS`` completed rounds is marked incomplete.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .context import TuningSettings
from .numerics import compare
from .params import OpParams, make_trial, output_tensors, trial_outputs
from .results import CandidateRecord
from .timing import Timer, l2_cache_bytes, make_timer

__all__ = ["find_fastest", "TuningReport", "MIN_ROUNDS", "MAX_ROUNDS", "MAX_INPUT_SETS"]

MIN_ROUNDS = 3
MAX_ROUNDS = 25
MAX_INPUT_SETS = 16


@dataclass
class TuningReport:
    choice: str
    complete: bool
    candidates: dict[str, CandidateRecord] = field(default_factory=dict)
    tuning_ms: float = 0.0


class _Budget:
    def __init__(self, ms: float, clock: Callable[[], float]):
        self.clock = clock
        self.start = clock()
        self.deadline = self.start + ms / 1e3

    def left_ms(self) -> float:
        return (self.deadline - self.clock()) * 1e3

    def spent_ms(self) -> float:
        return (self.clock() - self.start) * 1e3


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _check(candidate, trial: OpParams, reference, settings: TuningSettings, tol) -> CandidateRecord | None:
    """Run ``candidate`` once on ``trial``; a rejection record, or None when it passes."""
    try:
        result = candidate.run(trial)
        _synchronize(trial.device)
        got = output_tensors(result)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # a failing candidate is rejected, never propagated to the user
        return CandidateRecord("error", reason=_reason(exc))
    given = trial_outputs(trial)
    if len(got) != len(given) or any(g.data_ptr() != t.data_ptr() for g, t in zip(got, given)):
        return CandidateRecord("error", reason="returned a tensor other than the outputs it was given")
    if settings.numerical_check:
        for g, r in zip(got, reference):
            problem = compare(g, r, tol)
            if problem:
                return CandidateRecord("numerics", reason=problem)
    return None


def input_sets(params: OpParams, first: OpParams) -> list[OpParams]:
    """Enough copies of the inputs that one pass over them overflows L2 (just ``first`` on CPU)."""
    l2 = l2_cache_bytes(params.device)
    working = max(1, params.bytes_moved())
    count = min(MAX_INPUT_SETS, max(1, math.ceil(2 * l2 / working))) if l2 else 1
    return [first] + [make_trial(params, copy_inputs=True) for _ in range(count - 1)]


def find_fastest(op, params: OpParams, settings: TuningSettings, *, clock: Callable[[], float] = time.perf_counter,
                 timer: Timer | None = None) -> TuningReport:
    """Tune ``op`` for ``params`` (never touching the user's buffers). See the module docstring."""
    budget = _Budget(settings.max_tuning_ms, clock)
    records: dict[str, CandidateRecord] = {}
    default = op.default
    tol = op.tolerance(params)

    def out_of_budget(names):
        for name in names:
            records.setdefault(name, CandidateRecord("skipped", reason="tuning budget exhausted"))

    challengers = []
    for c in op.candidates:
        if c is default:
            continue
        if budget.left_ms() <= 0:
            out_of_budget([c.name])
            continue
        try:
            why = c.supports(params)
        except Exception as exc:
            why = f"supports() raised {_reason(exc)}"
        if why:
            records[c.name] = CandidateRecord("unsupported", reason=why)
        else:
            challengers.append(c)

    # The reference run; an error here is the op's own error and reaches the user.
    base = make_trial(params)
    reference = tuple(t.clone() for t in output_tensors(default.run(base)))
    _synchronize(params.device)

    survivors = [default]
    for c in challengers:
        if budget.left_ms() <= 0:
            out_of_budget([c.name])
            continue
        trial = make_trial(params)
        rejected = _check(c, trial, reference, settings, tol)
        if rejected:
            records[c.name] = rejected
        else:
            survivors.append(c)

    complete = not any(r.status == "skipped" for r in records.values())
    if len(survivors) == 1:
        records[default.name] = CandidateRecord("chosen", reason="the only candidate that can run")
        return TuningReport(default.name, complete, records, budget.spent_ms())
    if budget.left_ms() <= 0:
        out_of_budget(c.name for c in survivors[1:])
        records[default.name] = CandidateRecord("chosen", reason="default (budget exhausted before timing)")
        return TuningReport(default.name, False, records, budget.spent_ms())

    times, complete_timing, remeasure = _time_candidates(survivors, base, params, settings, budget, timer, clock,
                                                         records)
    complete = complete and complete_timing
    report = _choose(default, survivors, times, settings, records, complete, budget)
    if params.device.type == "cuda" and timer is None:
        _prefer_less_host_time(report, survivors, times, remeasure, params, base, budget)
    return report


def _time_candidates(survivors, base, params, settings, budget, timer, clock, records):
    timer = timer or make_timer(params.device, graph=settings.cuda_graph, clock=clock)
    # One list of input sets shared by every candidate: outputs are overwritten and in-place buffers
    # re-mutated by each run, which changes no candidate's speed.
    sets = input_sets(params, base)
    n_sets = len(sets)

    def runner(c):
        run = c.run

        def run_all():
            for p in sets:
                run(p)
        return run_all

    probe = {c.name: timer.measure(runner(c), 1) / n_sets for c in survivors}
    fastest = min(probe.values())
    timed = [survivors[0]]
    for c in survivors[1:]:
        if probe[c.name] > settings.prune_ratio * fastest:
            records[c.name] = CandidateRecord(
                "pruned", time_ms=probe[c.name],
                reason=f"probe {probe[c.name]:.4g} ms > {settings.prune_ratio:g} x fastest {fastest:.4g} ms")
        else:
            timed.append(c)

    # Repetitions per measurement so one measurement is well above the timer's resolution.
    per_pass = max(fastest * n_sets, 1e-6)
    reps = max(1, min(1000, math.ceil(timer.target_ms / per_pass)))
    try:
        measures = {c.name: timer.prepare(runner(c), reps) for c in timed}
    except Exception:  # e.g. a candidate that cannot be captured in a CUDA graph: fall back to events
        timer = make_timer(params.device, graph=False, clock=clock)
        measures = {c.name: timer.prepare(runner(c), reps) for c in timed}
    samples = {c.name: [] for c in timed}
    # A round costs at least its measured time; on CUDA its wall time is larger (the host enqueue,
    # the spin of a queued timer), so after a round its own wall time is the estimate.
    round_ms = sum(probe[c.name] for c in timed) * n_sets * reps + 1e-3
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
    # per call: a measurement is one pass over all input sets
    times = {name: statistics.median(s) / n_sets if s else probe[name] for name, s in samples.items()}

    def remeasure(name: str, target_ms: float) -> Callable[[], float]:
        """A measurement of ``name`` (one of those timed) repeated to about ``target_ms``."""
        c = next(c for c in timed if c.name == name)
        return timer.prepare(runner(c), max(reps, min(1000, math.ceil(target_ms / per_pass))))
    return times, rounds >= MIN_ROUNDS, remeasure


def _choose(default, survivors, times, settings, records, complete, budget) -> TuningReport:
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


#: device times within this fraction of the choice's count as a tie, broken by host time when the
#: choice is host-bound: half of issue 3's "never slower" bound (2% of torch eager's device time)
HOST_TIE = 0.01
#: a tied candidate replaces the choice only if its host time per call is below this fraction of the choice's
HOST_GAIN = 0.9
#: the choice counts as host-bound when a call's host time is at least this multiple of its device
#: time: near parity the GPU queue absorbs host-time differences (and on an H100, ties broken at
#: 4 MiB, 1.1x, measured 2-3% slower than eager in the benchmark)
HOST_BOUND = 1.5
#: measurement pairs of the head-to-head that must confirm a device-time tie before host time may
#: break it (at least MIN_ROUNDS of them, the rest as the budget allows)
CONFIRM_PAIRS = 12
#: ms of device time per measurement of that head-to-head. The rounds' measurements are one pass
#: over the input sets (~50 us for 4 MiB tensors); on an H100 a confirmation from those saw a
#: candidate within 0.5% of torch's kernel that 1 ms measurements (the benchmark's) put 2.8% behind.
CONFIRM_MS = 0.5


def host_us_per_call(call: Callable[[], object], device: torch.device, calls: int = 32, repeats: int = 5) -> float:
    """Host time per eager ``call()`` (median over repeats), with the GPU queue drained first so the
    enqueue never waits on the device: what a host-bound caller pays per call."""
    samples = []
    for _ in range(repeats):
        _synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    _synchronize(device)
    return statistics.median(samples)


def cached_call(c, params: OpParams, base: OpParams) -> Callable[[], object]:
    """What a cached call of ``params`` runs when ``c`` is chosen, on the proxies ``base``: ``c``'s
    runner when the public function's fast path will use one, else ``c.run``; outputs the caller
    left to the op (None) are allocated on each call, as the caller's are."""
    p = base.replace(**{name: None for name in params.outputs if getattr(params, name) is None})
    make = getattr(c, "fast_runner", None)
    runner = make(p) if make is not None and params.fast_form() else None
    if runner is None:
        return lambda: c.run(p)
    inputs = [getattr(p, name) for name in p.inputs]
    return lambda: runner(*inputs)


def confirmed_tie(measure_choice: Callable[[], float], measure_other: Callable[[], float], budget: _Budget,
                  pairs: int = CONFIRM_PAIRS) -> tuple[bool, float]:
    """(tied, ratio): measure the two candidates back to back ``pairs`` times (order alternating, so
    drift and the first-run penalty hit both alike), and whether the median of other/choice is
    within :data:`HOST_TIE`. Fewer than MIN_ROUNDS pairs within the budget confirm nothing."""
    ratios = []
    for k in range(pairs):
        if k >= MIN_ROUNDS and budget.left_ms() <= 0:
            break
        if k % 2:
            b = measure_other()
            a = measure_choice()
        else:
            a = measure_choice()
            b = measure_other()
        ratios.append(b / a if a > 0 else math.inf)
    ratio = statistics.median(ratios)
    return ratio <= 1.0 + HOST_TIE, ratio


def _prefer_less_host_time(report: TuningReport, survivors, times, remeasure, params, base, budget) -> None:
    """When the choice is host-bound (a cached call costs clearly more host time than the kernel
    takes on the device: :data:`HOST_BOUND`), pick among the candidates whose device time ties
    with the choice's (within :data:`HOST_TIE`) the one with clearly less host time per cached
    call (:func:`cached_call`).

    Device time decides the choice; but for small inputs kernels of different backends take the
    same device time while their launches cost different host time (a Triton launch, torch's
    dispatcher, tunekit's C launcher), and an eager caller of a small op waits on the host. When
    the device is the bottleneck, host time is hidden and device time alone decides. The tie bound
    is tighter than the default's margin, so the tuned choice stays within noise of the default's
    device time."""
    choice = report.choice
    bound = times[choice] * (1.0 + HOST_TIE)
    tied = [c for c in survivors if c.name in times and times[c.name] <= bound]
    if len(tied) < 2 or budget.left_ms() <= 0:
        return
    try:
        host = {c.name: host_us_per_call(cached_call(c, params, base), params.device) for c in tied}
    except Exception:  # every tied candidate already ran fine; a failure here keeps the device-time choice
        return
    best = min(host, key=host.get)
    host_bound = host[choice] >= HOST_BOUND * times[choice] * 1e3  # us per call against the kernel's ms
    if best == choice or not host_bound or host[best] >= HOST_GAIN * host[choice]:
        return
    records = report.candidates
    try:
        tied, ratio = confirmed_tie(remeasure(choice, CONFIRM_MS), remeasure(best, CONFIRM_MS), budget)
    except Exception:  # e.g. a capture that failed: keep the device-time choice
        return
    if not tied:
        records[best] = CandidateRecord(
            "slower", time_ms=times[best],
            reason=f"host time {host[best]:.1f} us per call against {host[choice]:.1f} us, but {ratio:.3f}x the "
                   f"device time of {choice} head to head (more than {HOST_TIE:.0%})")
        return
    records[best] = CandidateRecord(
        "chosen", time_ms=times[best],
        reason=f"device time within {HOST_TIE:.0%} of {choice} ({ratio:.3f}x head to head); host time "
               f"{host[best]:.1f} us per call against {host[choice]:.1f} us")
    records[choice] = CandidateRecord(
        "slower", time_ms=times[choice],
        reason=f"tied on device time with {best}; host time {host[choice]:.1f} us per call against {host[best]:.1f} us")
    report.choice = best
