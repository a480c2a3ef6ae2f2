"""The ops tunekit knows, by name (for ``tunekit.explain``, the CLI and benchmarks).

Each op module registers its tunable ops when it is imported; importing any part of tunekit
imports ``tunekit/__init__.py``, which imports every op (``tunekit/ops/__init__.py``), so the
registry is full by the time anything asks it."""

from __future__ import annotations

__all__ = ["register", "get_op", "all_ops"]

_OPS: dict = {}


def register(op):
    """Make ``op`` findable by name; returns it (so an op module can write ``op = register(TunableOp(...))``)."""
    if op.name in _OPS and _OPS[op.name] is not op:
        raise ValueError(f"an op named {op.name!r} is already registered")
    _OPS[op.name] = op
    return op


def get_op(name: str):
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no tunekit op named {name!r}; known ops: {', '.join(sorted(_OPS))}") from None


def all_ops() -> list:
    return [_OPS[name] for name in sorted(_OPS)]
