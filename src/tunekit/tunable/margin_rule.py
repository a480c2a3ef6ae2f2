"""The margin rule: which candidate a tuning session's measurements choose, and why each other was not.

A challenger is chosen over the default when it is faster by the margin (the settings' ``margin``
after complete rounds; without them only a decisive lead counts) and saves more device time than
its call adds on the host (its floor: :func:`floor_ms`, e.g. GEMM's C++ routes make torch's
own kernel cheaper to call than any challenger). Among the challengers that pass both, the fastest.
"""

from __future__ import annotations

from typing import Callable

from .entries import CandidateRecord

__all__ = ["floor_ms", "choose", "record"]

_DECISIVE_NOTE = " (the budget ran out before the timed rounds: only a decisive lead counts)"


def floor_ms(op, params, candidate) -> float:
    """What ``candidate`` must save over ``op``'s default on ``params`` to be chosen: the op's
    ``challenger_floor(params, candidate)`` where it has that rule, else its ``challenger_host_ms``."""
    rule = op.challenger_floor
    return op.challenger_host_ms if rule is None else rule(params, candidate)


def choose(times: dict[str, float], default: str, margin: float, floor: Callable[[str], float]) -> str:
    """The fastest candidate of ``times`` (ms) that beats ``default`` by ``margin`` and by its
    ``floor(name)`` ms; ``default`` when none does."""
    base = times[default]
    winners = [n for n, t in times.items() if n != default and t < base * (1.0 - margin) and base - t >= floor(n)]
    return min(winners, key=times.get) if winners else default


def record(name: str, times: dict[str, float], choice: str, default: str, margin: float, rounds_done: bool,
           floor: Callable[[str], float]) -> CandidateRecord:
    """``name``'s record after :func:`choose` picked ``choice``: chosen, or slower, with the reason."""
    t, base = times[name], times[default]
    if name == choice:
        why = "fastest" if not any(times[n] < t for n in times if n != name) else (
            f"default kept: no candidate faster by more than {margin:.0%}" if name == default
            else "the fastest that saves its floor")
        if not rounds_done and name != default:
            lead = f"{base / t:.2f}x" if t > 0 else "much"
            why = f"{lead} faster than the default on its probe: decisive before the budget ran out"
        return CandidateRecord("chosen", time_ms=t, reason=why)
    why = f"{t / times[choice]:.2f}x the time of {choice}" if times[choice] > 0 else "slower"
    if t < times[choice]:  # faster than the choice, yet not chosen
        why = f"faster by {1 - t / base:.1%}, within the {margin:.0%} margin"
        if t < base * (1.0 - margin):
            why = (f"saves {(base - t) * 1e3:.1f} us, less than the {floor(name) * 1e3:.1f} us of host time "
                   "a call of a challenger adds")
        if not rounds_done:
            why += _DECISIVE_NOTE
    return CandidateRecord("slower", time_ms=t, reason=why)
