"""Tuning settings: what the runtime may do on a call, scoped with ``tunekit.tuning(...)``.

Settings are an immutable :class:`TuningSettings` held in a ``contextvars.ContextVar``, so a
``with tunekit.tuning(...)`` block changes them for the current thread (and asyncio task) only and
restores them on exit, even on an exception. Defaults come from ``TUNEKIT_*`` environment variables
read once at import (``reload_environment()`` re-reads them); ``configure(...)`` changes the
process-wide defaults that new threads start from.

The cached call path reads one ContextVar per call and nothing else from here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass

__all__ = ["TuningSettings", "tuning", "current", "configure", "reload_environment", "ENV_VARS"]


@dataclass(frozen=True)
class TuningSettings:
    """What the runtime may do. Every field has a ``TUNEKIT_<FIELD>`` environment variable."""

    #: False: every tunekit op runs its default candidate; no lookup, no tuning, no recording.
    enabled: bool = True
    #: True: a signature with no valid stored result is tuned on its first call.
    #: False: it runs the default (production with pre-tuned results).
    tuning: bool = True
    #: Use results already in the store (False ignores them: every new signature is tuned again).
    use_stored: bool = True
    #: Budget of one signature's tuning work, in ms of the calling thread's wall clock, over all the
    #: calls that share it: support checks, numerical checks, probes and timed runs count; kernels
    #: compiling on the background thread do not (``tunable/session.py``). Past it, the best choice
    #: the evidence allows is final for this process and the entry is marked incomplete (the next
    #: process that tunes resumes it). Offline tuning (``tunekit tune``) uses it per signature.
    max_tuning_ms: float = 200.0
    #: The most tuning work one call does, in ms: a new signature's tuning is spread over its first
    #: calls, each running the best candidate known so far. A value >= ``max_tuning_ms`` tunes in
    #: the first call, as one blocking step.
    tuning_step_ms: float = 20.0
    #: Compare every candidate's output with the default's before timing it.
    numerical_check: bool = True
    #: Results store: a path to an SQLite file, ":memory:", or None for the per-user default path.
    results: str | None = None
    #: Record signatures met without a tuned entry, so ``tunekit tune`` can tune them offline.
    record_untuned: bool = False
    #: A challenger replaces the default only when faster by more than this fraction.
    margin: float = 0.03
    #: After the probe, drop candidates slower than ``prune_ratio`` x the fastest probe.
    prune_ratio: float = 1.5
    #: On CUDA, time candidates over CUDA-graph replays (a capture per candidate; the default) or
    #: eager launches queued behind a spin kernel (False). Both give device time, not the host's
    #: launch rate; graphs also leave out the ~1 us gap between eager launches (a large part of a
    #: short kernel's time) and cost less wall time per timed run, so tuning ends sooner.
    cuda_graph: bool = True

    def __post_init__(self):
        if self.max_tuning_ms <= 0:
            raise ValueError(f"max_tuning_ms must be > 0, got {self.max_tuning_ms}")
        if not self.tuning_step_ms > 0:
            raise ValueError(f"tuning_step_ms must be > 0, got {self.tuning_step_ms}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if self.prune_ratio < 1.0:
            raise ValueError(f"prune_ratio must be >= 1, got {self.prune_ratio}")
        # Which in-memory choice cache these settings use (a plain attribute: read on every call).
        object.__setattr__(self, "cache_id", (self.results or "", self.tuning, self.use_stored))

    @property
    def store_key(self) -> str:
        """The results location these settings name ("" is the default path)."""
        return self.results or ""


_FIELDS = {f.name: f for f in dataclasses.fields(TuningSettings)}
ENV_VARS = {name: "TUNEKIT_" + name.upper() for name in _FIELDS}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(name: str, text: str):
    kind = type(getattr(TuningSettings(), name)) if name != "results" else str
    if kind is bool:
        value = text.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"{ENV_VARS[name]}={text!r}: expected one of 1/0/true/false/yes/no/on/off")
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{ENV_VARS[name]}={text!r}: expected a number") from None
    return text or None


def _from_environment() -> TuningSettings:
    values = {}
    for name, var in ENV_VARS.items():
        if var in os.environ:
            values[name] = _parse(name, os.environ[var])
    return TuningSettings(**values)


_defaults = _from_environment()
_current: contextvars.ContextVar[TuningSettings | None] = contextvars.ContextVar("tunekit_settings", default=None)


def current() -> TuningSettings:
    """The settings in force here."""
    s = _current.get()
    return _defaults if s is None else s


def configure(**changes) -> TuningSettings:
    """Change the process-wide defaults (what threads without a ``tuning()`` block use)."""
    global _defaults
    _defaults = dataclasses.replace(_defaults, **_normalise(changes))
    return _defaults


def reload_environment() -> TuningSettings:
    """Re-read the ``TUNEKIT_*`` variables into the process-wide defaults."""
    global _defaults
    _defaults = _from_environment()
    return _defaults


def _normalise(changes: dict) -> dict:
    unknown = set(changes) - set(_FIELDS)
    if unknown:
        raise TypeError(f"unknown tuning setting(s): {', '.join(sorted(unknown))}; known: {', '.join(_FIELDS)}")
    if changes.get("results") is not None:
        changes["results"] = os.fspath(changes["results"])
    return changes


@contextlib.contextmanager
def tuning(**changes):
    """Scope settings: ``with tunekit.tuning(tuning=False, results="prod.sqlite"): ...``.

    Unnamed settings keep their current values; the previous settings return on exit.
    Yields the settings in force inside the block.
    """
    settings = dataclasses.replace(current(), **_normalise(changes))
    token = _current.set(settings)
    try:
        yield settings
    finally:
        _current.reset(token)


def captured() -> TuningSettings | None:
    """The settings a ``tuning()`` block set here (None outside any), for :func:`inherited`."""
    return _current.get()


@contextlib.contextmanager
def inherited(settings: TuningSettings | None):
    """Run a block under ``settings`` (from :func:`captured`) unless a ``tuning()`` block is in force.

    Why: an autograd Function's backward runs where autograd runs it; for CUDA tensors that is
    autograd's own device thread, which sees no ``tuning()`` block of the caller (a ContextVar is
    per thread). The forward captures its settings and the backward runs under them there, so
    ``with tuning(...)`` around a forward and its backward governs both ops on every device.
    """
    if settings is None or _current.get() is not None:
        yield
        return
    token = _current.set(settings)
    try:
        yield
    finally:
        _current.reset(token)
