"""Screening candidates: which ones can run these params, and which of those compute the right thing.

The one routine behind tuning (:func:`~tunekit.tunable.find_fastest.find_fastest`), offline
warm-up, measuring for people (``tunekit explore``, the benchmark suites) and ``tunekit.explain``:

1. :func:`supports`: a candidate's ``supports(params)``, with an exception turned into a reason.
2. :func:`reference`: the default runs once on proxies (:func:`~tunekit.tunable.params.make_trial`:
   fresh NaN-filled outputs, copies of buffers that are both read and written); its output is the
   reference. An error here is the op's own error and reaches the caller.
3. :func:`check`: a candidate runs once on its own proxies and is rejected if it raises, returns a
   tensor other than the outputs it was given, or (with the numerical check) disagrees with the
   reference (:mod:`tunekit.tunable.numerics`). That run is also its warm-up (JIT compilation,
   caches), so timing never includes a compile.

:func:`screen` does all three for every candidate of an op, within an optional budget, and
:func:`input_sets` gives the copies of the inputs timing rotates through so that every timed run
reads its inputs cold from memory, not from L2.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .entries import CandidateRecord
from .params import OpParams, make_trial, output_tensors, trial_outputs
from .timing import l2_cache_bytes

__all__ = ["Budget", "WorkBudget", "Screened", "supports", "reference", "check", "screen", "input_sets", "prune",
           "synchronize", "reason", "MAX_INPUT_SETS"]

#: copies of the inputs at most (each a full copy: memory is the limit on large inputs)
MAX_INPUT_SETS = 16


class Budget:
    """A wall-clock allowance in ms on an injectable clock (tests pass a fake one)."""

    def __init__(self, ms: float, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.deadline = self.start + ms / 1e3

    def left_ms(self) -> float:
        return (self.deadline - self.clock()) * 1e3

    def spent_ms(self) -> float:
        return (self.clock() - self.start) * 1e3


class WorkBudget:
    """``ms`` of work on ``clock``, counted only between :meth:`resume` and :meth:`pause` (the
    session's time inside calls), with the interface of :class:`~tunekit.tunable.screen.Budget`."""

    def __init__(self, ms: float, clock: Callable[[], float]):
        self.clock, self.total_ms, self.spent = clock, ms, 0.0
        self._since: float | None = None

    def resume(self) -> None:
        self._since = self.clock()

    def pause(self) -> None:
        if self._since is not None:
            self.spent += self.clock() - self._since
            self._since = None

    @contextlib.contextmanager
    def paused(self):
        """Work inside is not counted (resumed after it, also when it raises)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def spent_ms(self) -> float:
        running = self.clock() - self._since if self._since is not None else 0.0
        return (self.spent + running) * 1e3

    def left_ms(self) -> float:
        return self.total_ms - self.spent_ms()


def synchronize(device: torch.device) -> None:
    """Waits for the work queued on ``device``'s current stream, the one candidates run on; never the whole
    device: a device-wide synchronize while another thread captures a CUDA graph fails ("operation not
    permitted when stream is capturing") and invalidates that capture (H100,
    ``benchmarks/experiments/concurrent_capture_probe.py``)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def reason(exc: BaseException) -> str:
    """The first line of an exception with its type, short enough to store and show."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def supports(candidate, params: OpParams) -> str | None:
    """``candidate.supports(params)``; an exception there is a reason too, never the caller's error."""
    try:
        return candidate.supports(params)
    except Exception as exc:
        return f"supports() raised {reason(exc)}"


def reference(op, params: OpParams) -> tuple[OpParams, tuple[torch.Tensor, ...]]:
    """(the default's proxies, its outputs cloned): what every candidate is checked against."""
    base = make_trial(params)
    outputs = tuple(t.clone() for t in output_tensors(op.default.run(base)))
    synchronize(params.device)
    return base, outputs


def check(candidate, trial: OpParams, expected, agree: Callable[[tuple, tuple], str | None] | None,
          seen: Callable[[str, tuple], None] | None = None) -> CandidateRecord | None:
    """Run ``candidate`` once on ``trial``; a rejection record, or None when it passes. ``agree(got,
    expected)`` is the op's numerical check (:meth:`TunableOp.numerics`; None: no check).
    ``seen(name, outputs)`` is shown the outputs of a run that did not raise."""
    try:
        result = candidate.run(trial)
        synchronize(trial.device)
        got = output_tensors(result)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # a failing candidate is rejected, never propagated to the user
        return CandidateRecord("error", reason=reason(exc))
    if seen is not None:
        seen(candidate.name, got)
    given = trial_outputs(trial)
    if len(got) != len(given) or any(g.data_ptr() != t.data_ptr() for g, t in zip(got, given)):
        return CandidateRecord("error", reason="returned a tensor other than the outputs it was given")
    if agree is not None:
        problem = agree(got, expected)
        if problem:
            return CandidateRecord("numerics", reason=problem)
    return None


@dataclass
class Screened:
    """What :func:`screen` found: the default's proxies and outputs, the candidates that passed
    (the default first), and a record for each one that did not."""

    base: OpParams
    reference: tuple
    passed: list
    records: dict[str, CandidateRecord] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every candidate was screened (none skipped for the budget)."""
        return not any(r.status == "skipped" for r in self.records.values())


def screen(op, params: OpParams, *, numerical_check: bool = True, budget: Budget | None = None,
           skipped: str = "tuning budget exhausted", seen: Callable[[str, tuple], None] | None = None) -> Screened:
    """Support checks for every candidate, then the reference, then a checked run of each supported
    one. With a ``budget``, candidates not reached before it ends get a "skipped" record (``skipped``
    says why). ``seen`` is passed to :func:`check`."""
    records: dict[str, CandidateRecord] = {}
    over = (lambda: budget.left_ms() <= 0) if budget is not None else (lambda: False)
    supported = []
    for c in op.candidates:
        if c is op.default:
            continue
        if over():
            records[c.name] = CandidateRecord("skipped", reason=skipped)
            continue
        why = supports(c, params)
        if why:
            records[c.name] = CandidateRecord("unsupported", reason=why)
        else:
            supported.append(c)
    base, expected = reference(op, params)
    if seen is not None:
        seen(op.default.name, expected)
    agree = op.numerics(params) if numerical_check else None
    passed = [op.default]
    for c in supported:
        if over():
            records[c.name] = CandidateRecord("skipped", reason=skipped)
            continue
        rejected = check(c, make_trial(params), expected, agree, seen)
        if rejected:
            records[c.name] = rejected
        else:
            passed.append(c)
    return Screened(base, expected, passed, records)


def input_sets(params: OpParams, first: OpParams) -> list[OpParams]:
    """Enough copies of the inputs that one pass over them overflows L2 (just ``first`` on CPU)."""
    l2 = l2_cache_bytes(params.device)
    working = max(1, params.bytes_moved())
    count = min(MAX_INPUT_SETS, max(1, math.ceil(2 * l2 / working))) if l2 else 1
    return [first] + [make_trial(params, copy_inputs=True) for _ in range(count - 1)]


def prune(survivors: list, probe: dict[str, float], ratio: float, records: dict) -> tuple[list, float]:
    """(the survivors within ``ratio`` of the fastest probe, that probe's ms): the first survivor (the
    default) always stays; the rest get a record in ``records`` saying why they are not timed."""
    probed = {c.name: probe[c.name] for c in survivors if c.name in probe}
    fastest = min(probed.values()) if probed else 0.0
    timed = survivors[:1]
    for c in survivors[1:]:
        t = probed.get(c.name)
        if t is None:
            records[c.name] = CandidateRecord("skipped", reason="tuning budget exhausted")
        elif t > ratio * fastest:
            records[c.name] = CandidateRecord("pruned", time_ms=t,
                                              reason=f"probe {t:.4g} ms > {ratio:g} x fastest {fastest:.4g} ms")
        else:
            timed.append(c)
    return timed, fastest

