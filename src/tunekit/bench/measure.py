"""Measuring candidates for people (``tunekit explore``, ``benchmarks/``), with the method the
standards ask for: device time from CUDA events over CUDA-graph replays, inputs rotated so they are
cold in L2, the median of many repeats, and the copy bandwidth measured in the same run.

Tuning (:mod:`tunekit.tunable.find_fastest`) uses the same screening (:mod:`tunekit.tunable.screen`),
timers and input rotation under a budget; this module measures every candidate that runs correctly.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..tunable.params import make_trial
from ..tunable.screen import Budget, input_sets, screen
from ..tunable.timing import make_timer

__all__ = ["CandidateTiming", "measure_candidates", "copy_bandwidth", "time_callable", "host_us_per_call", "versions"]


@dataclass
class CandidateTiming:
    name: str
    status: str                      # "ok", "unsupported", "numerics", "error", "skipped"
    reason: str = ""
    time_ms: float | None = None     # median per call
    spread: float | None = None      # (max - min) / median over the repeats
    first_values: list[float] = field(default_factory=list)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_callable(fn, device: torch.device, *, repeats: int = 20, graph: bool = True, target_ms: float = 1.0):
    """Median and relative spread (ms per call) of ``fn()`` over ``repeats`` measurements."""
    fn()
    _sync(device)
    timer = make_timer(device, graph=False)
    one = max(timer.measure(fn, 1), 1e-4)
    reps = max(1, min(2000, int(target_ms / one)))
    if device.type == "cuda" and graph:
        try:
            measure = make_timer(device, graph=True).prepare(fn, reps)
        except Exception:  # not capturable: plain events
            measure = timer.prepare(fn, reps)
    else:
        measure = timer.prepare(fn, reps)
    samples = [measure() for _ in range(repeats)]
    med = statistics.median(samples)
    return med, (max(samples) - min(samples)) / med if med > 0 else 0.0


def host_us_per_call(fns: dict, device: torch.device, *, calls: int = 2000, repeats: int = 11) -> dict:
    """{name: median host us per call} of each of ``fns`` (name -> a callable of no arguments), as wall
    time of ``calls`` back-to-back calls over ``calls``, one synchronisation ending each repeat on
    CUDA; the functions' repeats interleaved, so a slow stretch of the host falls on all of them
    alike. Warm them up first (tuned, cached): this times what it is given."""
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def _first_values(outputs) -> list[float]:
    return outputs[0].detach().flatten()[:2].double().cpu().tolist()


def measure_candidates(op, params, *, repeats: int = 20, graph: bool = True,
                       budget_s: float | None = None) -> dict[str, CandidateTiming]:
    """Screen every candidate against the default on fresh outputs, then time those that agree.
    ``budget_s``: candidates not reached within that many seconds are "skipped"; an error while
    timing one is its result ("error"), not the end of the run."""
    device = params.device
    first: dict[str, list[float]] = {}
    budget = Budget(budget_s * 1e3) if budget_s is not None else None
    skipped = f"time cap of {budget_s:.0f} s reached" if budget_s is not None else ""
    found = screen(op, params, budget=budget, skipped=skipped,
                   seen=lambda name, outputs: first.setdefault(name, _first_values(outputs)))
    sets = input_sets(params, make_trial(params))
    out = {name: CandidateTiming(name, r.status, r.reason or "", first_values=first.get(name, []))
           for name, r in found.records.items()}
    for c in found.passed:
        if budget is not None and budget.left_ms() <= 0:
            out[c.name] = CandidateTiming(c.name, "skipped", skipped, first_values=first.get(c.name, []))
            continue

        def run_all(run=c.run):
            for p in sets:
                run(p)

        try:
            ms, spread = time_callable(run_all, device, repeats=repeats, graph=graph)
        except Exception as exc:  # a candidate that fails while timed is a result, not the end of the run
            out[c.name] = CandidateTiming(c.name, "error", f"{type(exc).__name__}: {exc}"[:200])
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        out[c.name] = CandidateTiming(c.name, "ok", time_ms=ms / len(sets), spread=spread,
                                      first_values=first.get(c.name, []))
    return {c.name: out[c.name] for c in op.candidates if c.name in out}


def copy_bandwidth(device: torch.device, nbytes: int | None = None, *, repeats: int = 20) -> float:
    """Device copy bandwidth in GB/s, counting bytes read plus bytes written (the ceiling of an
    elementwise op). Large enough to overflow every cache: 1 GiB on CUDA, 256 MiB on the CPU."""
    if nbytes is None:
        nbytes = 2**30 if device.type == "cuda" else 2**28
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    # Eager launches, not a graph: a captured device-to-device copy becomes a memcpy node that may run
    # on a copy engine, slower than the kernel eager copy_ uses (docs/measurements.md).
    ms, _ = time_callable(lambda: dst.copy_(src), device, repeats=repeats, graph=False, target_ms=5.0)
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def versions() -> dict:
    """torch, CUDA and Triton versions, for a benchmark's header."""
    try:
        import triton
    except ImportError:
        triton = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": getattr(triton, "__version__", None)}
