"""Racing: timed rounds stop for the candidates whose outcome they can no longer change.

A session's timed rounds (``session.TuningSession._rounds``) measure every candidate the probe kept,
once per round, up to ``MAX_ROUNDS`` rounds or the budget. With a dozen GEMM candidates of 5 ms
each, that was 25 rounds of all of them: 3 s to tune one large signature with its kernels compiled
(H100), where issue 23 asks for 0.5 s. After ``MIN_ROUNDS`` complete rounds, a candidate whose
*fastest* round is slower than the leader's median by more than the margin cannot become the
choice, and is timed no further (its record keeps the median of the rounds it had); when what is
left is settled (the default alone, or a challenger faster than the default in every round by more
than the margin), the rounds end.

The leader is the fastest candidate that could be chosen: the default, or a challenger that saves
its floor (``margin_rule.floor_ms``) on the medians, so that a candidate that cannot pay its floor
never takes another's place. The default is never dropped: the margin rule compares to it.
"""

from __future__ import annotations

import statistics
from typing import Callable

__all__ = ["still_open"]


def still_open(samples: dict[str, list[float]], names: list[str], default: str, margin: float,
               floor: Callable[[str], float]) -> list[str]:
    """Of ``names`` (each with at least one sample in ``samples``, ms), those whose rounds must go on,
    in their order; empty when the choice among them is settled."""
    med = {n: statistics.median(samples[n]) for n in names}
    base = med.get(default)
    eligible = [n for n in names if n == default or base is None or base - med[n] >= floor(n)]
    leader = min(eligible or names, key=med.get)
    limit = med[leader] * (1.0 + margin)
    keep = [n for n in names if n in (leader, default) or min(samples[n]) <= limit]
    if keep == [default] or len(keep) <= 1:
        return []
    if len(keep) == 2 and default in keep and leader != default and base is not None:
        if max(samples[leader]) < min(samples[default]) * (1.0 - margin):  # ahead in every round, by the margin
            return []
    return keep
