"""Host time as a tie-breaker: among candidates that take the same device time, the one whose
cached call costs the host clearly less, when the choice is host-bound.

Device time decides the choice (:mod:`tunekit.tunable.find_fastest`); but for small inputs kernels
of different backends take the same device time while their launches cost different host time (a
Triton launch, torch's dispatcher, tunekit's C launcher), and an eager caller of a small op waits
on the host. When the device is the bottleneck, host time is hidden and device time alone decides.
A tie is confirmed by a head-to-head re-measure of the two, interleaved pairs of measurements of at
least CONFIRM_MS, before host time may break it: a single pass over the input sets was too short to
tell a tie from a difference of a few percent (``benchmarks/results/tie_break_check-*``).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Iterator

import torch

from .entries import CandidateRecord
from .params import OpParams
from .screen import Budget, synchronize

__all__ = ["HOST_TIE", "HOST_GAIN", "HOST_BOUND", "CONFIRM_PAIRS", "CONFIRM_MS", "MIN_PAIRS", "host_us_per_call",
           "cached_call", "confirmed_tie", "prefer_less_host_time", "host_time_steps"]

#: pairs of the head-to-head below which it confirms nothing
MIN_PAIRS = 3

#: device times within this fraction of the choice's count as a tie, broken by host time when the
#: choice is host-bound: half of the "never slower than torch eager" bound (2% of its device time)
HOST_TIE = 0.01
#: a tied candidate replaces the choice only if its host time per call is below this fraction of the choice's
HOST_GAIN = 0.9
#: the choice counts as host-bound when a call's host time is at least this multiple of its device
#: time: near parity the GPU queue absorbs host-time differences, so a tie broken there buys no
#: host time and may cost device time
HOST_BOUND = 1.5
#: measurement pairs of the head-to-head that must confirm a device-time tie before host time may
#: break it (at least MIN_PAIRS of them, the rest as the budget allows)
CONFIRM_PAIRS = 12
#: ms of device time per measurement of that head-to-head: one pass over the input sets (~50 us for 4 MiB
#: tensors) was too short to tell a 1% difference from noise; the rounds' graph replays last as long since
#: ``timing.CudaGraphTimer.target_ms`` grew to 0.5 ms, and the pairs add the interleaved confirmation
CONFIRM_MS = 0.5


def host_us_per_call(call: Callable[[], object], device: torch.device, calls: int = 32, repeats: int = 5) -> float:
    """Host time per eager ``call()`` (median over repeats), with the GPU queue drained first so the
    enqueue never waits on the device: what a host-bound caller pays per call."""
    samples = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    synchronize(device)
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


def _finished(steps: Iterator):
    """What the generator ``steps`` returns, all its steps run."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def confirmed_tie(measure_choice: Callable[[], float], measure_other: Callable[[], float], budget: Budget,
                  pairs: int = CONFIRM_PAIRS) -> tuple[bool, float]:
    """(tied, ratio): measure the two candidates back to back ``pairs`` times (order alternating, so
    drift and the first-run penalty hit both alike), and whether the median of other/choice is
    within :data:`HOST_TIE`. Fewer than MIN_PAIRS pairs within the budget confirm nothing."""
    return _finished(_confirming(measure_choice, measure_other, budget, pairs))


def _confirming(measure_choice, measure_other, budget: Budget, pairs: int):
    """:func:`confirmed_tie`, yielding after each pair."""
    ratios = []
    for k in range(pairs):
        if k >= MIN_PAIRS and budget.left_ms() <= 0:
            break
        if k % 2:
            b = measure_other()
            a = measure_choice()
        else:
            a = measure_choice()
            b = measure_other()
        ratios.append(b / a if a > 0 else math.inf)
        yield
    ratio = statistics.median(ratios)
    return ratio <= 1.0 + HOST_TIE, ratio


def prefer_less_host_time(report, survivors, times, remeasure, params, base, budget) -> None:
    """When the choice is host-bound (a cached call costs clearly more host time than the kernel
    takes on the device: :data:`HOST_BOUND`), pick among the candidates whose device time ties
    with the choice's (within :data:`HOST_TIE`) the one with clearly less host time per cached
    call (:func:`cached_call`).

    Device time decides the choice; but for small inputs kernels of different backends take the
    same device time while their launches cost different host time (a Triton launch, torch's
    dispatcher, tunekit's C launcher), and an eager caller of a small op waits on the host. When
    the device is the bottleneck, host time is hidden and device time alone decides. The tie bound
    is tighter than the default's margin, so the tuned choice stays within noise of the default's
    device time.

    A short measure of the choice comes first: a device-bound choice (a 0.4 ms GEMM) returns there.
    Measuring every tied candidate's host time waits for each repeat's queued kernels: 0.2 s of one
    call for three tied 0.4 ms GEMMs on the H100, where tuning steps are to stay within 20 ms."""
    _finished(host_time_steps(report, survivors, times, remeasure, params, base, budget))


def host_time_steps(report, survivors, times, remeasure, params, base, budget) -> Iterator[None]:
    """:func:`prefer_less_host_time` as a tuning session's work: it yields between measurements (the choice's short
    one, each tied candidate's host time, the two finalists' host times again, each capture and confirming pair), so
    that a session spread over calls spreads it too. In one piece it was the last call's longest part: 8.8 ms of a
    12.8 ms call ending a logsumexp tuning (H100 trace), such last calls 22-61 ms in the first-use suite against the
    20 ms step (``benchmarks/results/host_time_steps-NVIDIA_H100_80GB_HBM3.txt``). The finalists are measured again
    in one piece: taken in separate calls, anything that varied between them (a compile's thread holding the
    interpreter) could fake a host-time gain."""
    choice = report.choice
    bound = times[choice] * (1.0 + HOST_TIE)
    tied = {c.name: c for c in survivors if c.name in times and times[c.name] <= bound}
    if len(tied) < 2 or budget.left_ms() <= 0:
        return
    device_us = times[choice] * 1e3
    host = yield from _host_times(tied, choice, device_us, params, base)
    best = min(host, key=host.get) if host else choice
    if best == choice or not _gains(host, choice, best, device_us):
        return
    yield
    try:
        host = {n: host_us_per_call(cached_call(tied[n], params, base), params.device) for n in (choice, best)}
        if not _gains(host, choice, best, device_us):
            return
        yield
        measure_choice = remeasure(choice, CONFIRM_MS)
        yield
        measure_best = remeasure(best, CONFIRM_MS)
        yield
        confirmed, ratio = yield from _confirming(measure_choice, measure_best, budget, CONFIRM_PAIRS)
    except Exception:  # e.g. a capture that failed: keep the device-time choice
        return
    _record(report, times, host, choice, best, confirmed, ratio)


def _host_times(tied: dict, choice: str, device_us: float, params, base):
    """{name: host us per cached call} of the tied candidates, a piece each after the choice's short measure;
    None when that measure finds the choice device-bound (its host time hidden, and measuring the others would
    wait out their queued kernels) or a measurement fails (every tied candidate ran fine before: keep the choice)."""
    try:
        if host_us_per_call(cached_call(tied[choice], params, base), params.device, calls=8, repeats=1) < \
                HOST_BOUND * device_us:
            return None
        host = {}
        for name, c in tied.items():
            yield
            host[name] = host_us_per_call(cached_call(c, params, base), params.device)
        return host
    except Exception:
        return None


def _gains(host: dict, choice: str, best: str, device_us: float) -> bool:
    """Whether ``best`` saves enough host time over a host-bound ``choice`` (:data:`HOST_BOUND`, :data:`HOST_GAIN`)."""
    return host[choice] >= HOST_BOUND * device_us and host[best] < HOST_GAIN * host[choice]


def _record(report, times, host, choice: str, best: str, tied: bool, ratio: float) -> None:
    """The tie-break's verdict in ``report``: ``best`` chosen when the head-to-head confirmed the tie."""
    records = report.candidates
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
