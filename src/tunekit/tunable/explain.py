"""``tunekit.explain(op, *args, **kwargs)``: for these inputs, which candidate runs and why, and why
every other candidate does not (unsupported / numerics / slower, with its time).

It resolves the call exactly as the call would, tuning on proxies if the settings say so (and
completing a tuning that is spread over calls), but never runs the op on the caller's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import context
from .registry import get_op
from .screen import supports

__all__ = ["explain", "Explanation"]


@dataclass
class Explanation:
    op: str
    signature: str
    device: str
    chosen: str
    why: str
    #: candidate name -> (status, time in ms or None, reason)
    candidates: dict[str, tuple[str, float | None, str]] = field(default_factory=dict)
    complete: bool | None = None

    def __str__(self) -> str:
        lines = [f"op {self.op}", f"  signature  {self.signature}", f"  device     {self.device}",
                 f"  runs       {self.chosen}: {self.why}"]
        if self.complete is False:
            lines.append("  (tuning budget ran out: the entry is incomplete and will be re-tuned)")
        width = max((len(n) for n in self.candidates), default=0)
        for name, (status, ms, reason) in self.candidates.items():
            t = f"{ms * 1e3:10.2f} us" if ms is not None else " " * 13
            lines.append(f"  {'*' if name == self.chosen else ' '} {name:<{width}}  {status:<11} {t}  {reason}")
        return "\n".join(lines)


def explain(op, *args, **kwargs) -> Explanation:
    """``op`` is an op's name (``"silu"``) or a TunableOp; the rest are the op's public arguments."""
    op = get_op(op) if isinstance(op, str) else op
    if op.make_params is None:
        raise TypeError(f"op {op.name!r} cannot build params from arguments")
    params = op.make_params(*args, **kwargs)
    settings = context.current()
    r = op.resolve(params, settings, finish=True)  # a tuning in progress is completed first
    signature = r.signature or params.signature()
    records = r.entry.candidates if r.entry is not None else {}
    rows = {}
    for c in op.candidates:
        rec = records.get(c.name)
        if rec is not None:
            rows[c.name] = (rec.status, rec.time_ms, rec.reason or "")
            continue
        why = supports(c, params)
        if why:
            rows[c.name] = ("unsupported", None, why)
        elif c is r.candidate:
            rows[c.name] = ("chosen", None, r.why)
        else:
            rows[c.name] = ("not tuned", None, "no timing for this signature")
    return Explanation(op=op.name, signature=signature, device=r.device, chosen=r.candidate.name, why=r.why,
                       candidates=rows, complete=None if r.entry is None else r.entry.complete)
