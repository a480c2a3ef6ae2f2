"""Where tunekit keeps what it builds: ``$TUNEKIT_CACHE`` or ``$XDG_CACHE_HOME/tunekit`` (else
``~/.cache/tunekit``), one folder per kind (``cubin`` for NVRTC output, ``launch`` for the C and C++
extensions)."""

from __future__ import annotations

import os
import pathlib

__all__ = ["cache_dir"]


def cache_dir(kind: str) -> pathlib.Path:
    """The folder for one kind of build output (not created here)."""
    base = os.environ.get("TUNEKIT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "tunekit")
    return pathlib.Path(base) / kind
