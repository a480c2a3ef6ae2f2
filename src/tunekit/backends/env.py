"""The environment variables the backends read, parsed strictly: a value tunekit cannot read is an
error that names the variable, never silently taken as the default.

- Switches (``TUNEKIT_FAST_CALL``, ``TUNEKIT_FAST_LAUNCH``, ``TUNEKIT_PDL``,
  ``TUNEKIT_TRITON_SUBPROCESS``, ``TUNEKIT_TRITON_STATIC``): exactly one of
  1/0, true/false, yes/no, on/off (any case, surrounding whitespace ignored); unset means the
  default. Anything else, the empty string included, raises :class:`SettingError`.
- ``import tunekit`` checks them (and ``TUNEKIT_CACHE``), like the runtime's settings; their values
  are read where they are first needed (the extension's first load, a device's first dependent
  launch), and reading one checks them all again. Where that read happens inside a candidate being checked during
  tuning, the runtime records the error as that candidate's; the extensions are also loaded after
  a choice is made (the cached call's runner), where the error reaches the caller.

``TUNEKIT_CACHE`` (where build outputs live) is read by :mod:`tunekit.backends.cache`.
"""

from __future__ import annotations

import os

from ..tunable.errors import SettingsError

__all__ = ["SettingError", "switch", "check_switches", "SWITCHES", "SWITCH_VALUES"]

#: the backends' switches, each with its default
SWITCHES = {"TUNEKIT_FAST_CALL": True, "TUNEKIT_FAST_LAUNCH": True, "TUNEKIT_PDL": True,
            "TUNEKIT_TRITON_SUBPROCESS": True, "TUNEKIT_TRITON_STATIC": True}

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: the values a switch accepts, as the error message lists them
SWITCH_VALUES = "1/0, true/false, yes/no, on/off (any case)"


class SettingError(SettingsError):
    """An environment variable the backends read holds a value tunekit cannot read; the message names
    the variable. A SettingsError (so the ``tunekit`` command reports it like the runtime's settings);
    callers that fall back on other errors (an extension that cannot be built) let this one through."""


def switch(variable: str, default: bool = True) -> bool:
    """The on/off value of the environment ``variable``; ``default`` when it is unset. Every switch
    of :data:`SWITCHES` is checked too: SettingError names the first that holds a bad value."""
    for other, other_default in SWITCHES.items():
        if other != variable:
            _parse(other, other_default)
    return _parse(variable, default)


def check_switches() -> None:
    """SettingError for the first of :data:`SWITCHES` that holds a bad value (``import tunekit`` calls
    it, so a bad value is reported on every machine, not only at a GPU's first launch)."""
    for variable, default in SWITCHES.items():
        _parse(variable, default)


def _parse(variable: str, default: bool) -> bool:
    raw = os.environ.get(variable)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise SettingError(f"{variable}={raw!r}: expected one of {SWITCH_VALUES}, or unset for the default "
                       f"({'on' if default else 'off'})")
