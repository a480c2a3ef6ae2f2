"""Code that runs inside worker processes started by the offline-tuning tests (spawn imports it by
name, so it lives in a module of its own, not in a test file)."""

from __future__ import annotations

import os
import signal
import time

import torch

import tunekit
from tunekit.offline import recorded
from tunekit.tunable import tuning


def record(path, sizes, *, dtype=torch.float32) -> None:
    """Record one untuned silu signature per size in the store at ``path``."""
    with tuning(results=str(path), tuning=False, record_untuned=True):
        for n in sizes:
            tunekit.silu(torch.randn(n, dtype=dtype))


def _slow_down(seconds: float) -> None:
    """Make every offline tuning take at least ``seconds`` longer (so work is visibly shared)."""
    original = recorded.tune_params

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)

    recorded.tune_params = slow


def meet_then_slow(barrier, seconds: float, index: int) -> None:
    """Initializer: wait until every worker has started, then tune slowly."""
    barrier.wait(timeout=60)
    _slow_down(seconds)


def die_on_first_item(victim: int, barrier, index: int) -> None:
    """Initializer: worker ``victim`` kills itself (SIGKILL) once it holds its first claim."""
    barrier.wait(timeout=60)
    _slow_down(0.2)
    if index != victim:
        return

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    recorded.tune_params = die
