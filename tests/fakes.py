"""Fake ops for testing the runtime: a deterministic clock, and candidates that cost what we say."""

from __future__ import annotations

import collections

import torch

from tunekit.tunable import OpParams, TunableOp
from tunekit.tunable.params import tensor_key, tensor_signature


class FakeClock:
    """Seconds that advance only when a fake candidate says it ran (deterministic timings)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += ms / 1e3


class ScaleParams(OpParams):
    """out = 2 * x (or x *= 2 in place when out is x)."""

    op_name = "scale"
    inputs = ("x",)
    outputs = ("out",)

    def __init__(self, x, out=None):
        self.x = x
        self.out = out

    def cache_key(self):
        return (tensor_key(self.x), None if self.out is None else "inplace" if self.out is self.x else tensor_key(self.out))

    def signature(self):
        dest = "new" if self.out is None else "inplace" if self.out is self.x else tensor_signature(self.out)
        return f"x={tensor_signature(self.x)} out={dest} {self.x.device.type}"

    def new_outputs(self):
        return {"out": torch.empty_like(self.x)}


def _dest(p):
    return p.out if p.out is not None else torch.empty_like(p.x)


def make_op(clock: FakeClock | None, costs: dict[str, float], *, default: str = "ref", name: str = "scale",
            behaviours: dict | None = None):
    """A TunableOp whose candidates compute 2x (unless ``behaviours`` says otherwise) and advance
    ``clock`` by ``costs[name]`` ms per run. ``op.runs`` counts runs per candidate."""
    op = TunableOp(name, ScaleParams, make_params=lambda x, out=None: ScaleParams(x, out),
                   make_example=lambda shape, dtype, device: ScaleParams(torch.randn(shape, dtype=dtype, device=device)))
    op.runs = collections.Counter()
    behaviours = behaviours or {}

    def make(cand, cost):
        behaviour = behaviours.get(cand, "correct")

        def run(p):
            op.runs[cand] += 1
            if clock is not None:
                clock.advance(cost)
            if behaviour == "raises":
                raise RuntimeError("kernel exploded")
            if behaviour == "returns_new":
                return p.x * 2
            out = _dest(p)
            if behaviour == "wrong":
                return torch.mul(p.x, 3, out=out)
            if behaviour == "half":
                flat = out.view(-1)
                flat[: flat.numel() // 2] = p.x.reshape(-1)[: flat.numel() // 2] * 2
                return out
            return torch.mul(p.x, 2, out=out)

        run.__name__ = cand
        return run

    for cand, cost in costs.items():
        supports = None
        if behaviours.get(cand) == "unsupported":
            supports = lambda p: "needs a device this test does not have"  # noqa: E731
        op.add(make(cand, cost), name=cand, supports=supports, default=(cand == default))
    return op
