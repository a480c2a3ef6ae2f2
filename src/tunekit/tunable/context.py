"""Tuning settings: what the runtime may do on a call, scoped with ``tunekit.tuning(...)``.

Settings are an immutable :class:`TuningSettings` held in a ``contextvars.ContextVar``, so a
``with tunekit.tuning(...)`` block changes them for the current thread (and asyncio task) only and
restores them on exit, even on an exception. Defaults come from ``TUNEKIT_*`` environment variables
read once at import (``reload_environment()`` re-reads them); ``configure(...)`` changes the
process-wide defaults that new threads start from. Every value is checked, from the environment or
from code alike: one tunekit cannot use is an error naming the setting (for a variable, its name
and value), never a silent default.

The cached call path reads one ContextVar per call and nothing else from here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import numbers
import os
import sys
from dataclasses import dataclass

from .errors import SettingsError

__all__ = ["TuningSettings", "tuning", "current", "configure", "reload_environment", "ENV_VARS",
           "environment_flag", "SettingsError"]


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
    #: Use the pre-tuned results shipped for this GPU model where the store has no valid entry
    #: (``tunable/shipped.py``: valid only on the same GPU, driver, torch / Triton and candidates).
    use_shipped: bool = True
    #: Budget of one signature's tuning work, in ms of the calling thread's wall clock, over all the
    #: calls that share it: support checks, numerical checks, probes and timed runs count; kernels
    #: compiling on the background thread do not (``tunable/session.py``). Past it, the best choice
    #: the evidence allows is final for this process and the entry is marked incomplete (the next
    #: process that tunes resumes it). Offline tuning (``tunekit tune``) uses it per signature, doubled
    #: on each retry of an attempt that did not complete (``offline/tune_one.py``).
    max_tuning_ms: float = 200.0
    #: The most one call spends tuning, in ms, its own run included (tuning work fills at most 85% of
    #: it: ``session.STEP_SLACK``): a new signature's tuning is spread over its first calls, each
    #: running the best candidate known so far. A value >= ``max_tuning_ms`` tunes in the first
    #: call, as one blocking step.
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
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name), f.default))
        # Which in-memory choice cache these settings use (a plain attribute: read on every call).
        object.__setattr__(self, "cache_id", (self.results or "", self.tuning, self.use_stored, self.use_shipped))

    @property
    def store_key(self) -> str:
        """The results location these settings name ("" is the default path)."""
        return self.results or ""


_FIELDS = {f.name: f for f in dataclasses.fields(TuningSettings)}
ENV_VARS = {name: "TUNEKIT_" + name.upper() for name in _FIELDS}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
#: what each number setting must be: (test, words for the message); NaN never passes, and infinity
#: only where the words say so (a number setting not named here: any finite number)
_RANGES = {
    "max_tuning_ms": (lambda x: 0 < x < math.inf, "a finite number > 0"),
    "tuning_step_ms": (lambda x: x > 0, "a number > 0 (inf: no limit)"),
    "margin": (lambda x: 0.0 <= x < 1.0, "a number in [0, 1)"),
    "prune_ratio": (lambda x: 1.0 <= x < math.inf, "a finite number >= 1"),
}


def _checked(name: str, value, default):
    """``value`` for the setting ``name``, normalised (0/1 -> bool, int -> float); TypeError for the
    wrong kind of value, SettingsError (a ValueError) for one out of range: never a silent fallback."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if type(value).__name__ == "bool_" or (isinstance(value, numbers.Integral) and value in (0, 1)):
            return bool(value)  # numpy's bool, or 0 / 1
        raise TypeError(f"{name} must be True or False, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {value!r}")
        value = float(value)
        test, words = _RANGES.get(name, (math.isfinite, "a finite number"))
        if math.isnan(value) or not test(value):
            raise SettingsError(f"{name} must be {words}, got {value!r}")
        return value
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a path (str) or None, got {value!r}")
    return value


def _shown(text: str) -> str:
    """An environment value as an error message shows it: quoted, one line, not too long."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def environment_flag(var: str, default: bool) -> bool:
    """A boolean environment variable: ``default`` when unset; 1/0/true/false/yes/no/on/off (any case)
    otherwise. Anything else, the empty value included, is a SettingsError naming the variable: a
    typo must not silently switch a feature off (or leave it on)."""
    text = os.environ.get(var)
    return default if text is None else _flag(var, text)


def _flag(var: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    empty = " (empty: unset the variable for the default)" if not value else ""
    raise SettingsError(f"{var}={_shown(text)}: expected one of 1/0/true/false/yes/no/on/off{empty}")


def _parse(name: str, text: str):
    """One setting's environment text -> its value; SettingsError naming the variable."""
    var, default = ENV_VARS[name], _FIELDS[name].default
    if isinstance(default, bool):
        return _flag(var, text)
    if isinstance(default, float):
        try:
            value = float(text)
        except ValueError:
            raise SettingsError(f"{var}={_shown(text)}: expected a number") from None
        try:
            return _checked(name, value, default)
        except ValueError as exc:
            raise SettingsError(f"{var}={_shown(text)}: {exc}") from None
    return text if text.strip() else None  # results: empty means the default path


def _from_environment() -> TuningSettings:
    values = {}
    for name, var in ENV_VARS.items():
        if var in os.environ:
            values[name] = _parse(name, os.environ[var])
    return TuningSettings(**values)


def _started_as_command() -> bool:
    """True while the ``tunekit`` command (the console script, or ``python -m tunekit`` while its
    package is imported) is starting: an error then is the command's, not a library caller's."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) in ("tunekit", "tunekit.exe", "tunekit-script.py"):
        return True
    if argv0 != "-m":  # python -m sets argv[0] to "-m" while it imports the module's package
        return False
    orig = list(getattr(sys, "orig_argv", ()))
    return "-mtunekit" in orig or any(a == "-m" and b == "tunekit" for a, b in zip(orig, orig[1:]))


def exit_if_command(error: SettingsError) -> None:
    """Called with an environment error met while tunekit is imported: when the ``tunekit`` command
    is starting, print ``tunekit: <error>`` and exit 2 (its ``main`` cannot catch what happens before
    it exists); otherwise return, and the caller raises the error."""
    if _started_as_command():
        print(f"tunekit: {error}", file=sys.stderr)
        raise SystemExit(2)


try:
    _defaults = _from_environment()
except SettingsError as _error:
    exit_if_command(_error)
    raise

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
        try:
            changes["results"] = os.fspath(changes["results"])
        except TypeError:
            raise TypeError(f"results must be a path or None, got {changes['results']!r}") from None
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
