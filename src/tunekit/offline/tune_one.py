"""Tuning one signature offline, exactly as the online path would (:func:`find_fastest` under the same
settings: budget, numerical check, margin), except that every candidate first runs once outside
the budget (:func:`warm_candidates`): first-use compilation is a cost of the tuning process, not of
the signature, and a fresh worker would otherwise spend the budget on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time

import torch

from ..tunable import context, validators
from ..tunable.entries import Entry
from ..tunable.find_fastest import find_fastest
from ..tunable.params import OpParams, make_trial, output_tensors
from ..tunable.results import ResultsStore
from ..tunable.screen import supports, synchronize
from ..tunable.tunable_op import TUNING_LOCK

__all__ = ["ATTEMPTS", "default_device", "on_device", "offline_settings", "warm_candidates", "tune_params",
           "entry_problems"]

#: tuning runs per signature until one completes, each with twice the budget of the one before.
#: First-use compilation needs no retry (:func:`tune_params` warms every candidate outside the budget
#: first); a retry covers one-off costs warm-up may not cover (a process's first CUDA-graph capture,
#: allocator growth for the L2-sized input sets), stalls from other processes, and signatures whose
#: checks and rounds alone outlast the budget: the LLaMA-style step's LM-head GEMM (4096 x 32000 x
#: 1024, forty Triton configurations checked against a float32 product) stayed incomplete after two
#: 200 ms attempts on an H100 (multi_gpu_tune-llama_gemm-*). Free when the first attempt completes.
ATTEMPTS = 3


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def on_device(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def offline_settings(settings: context.TuningSettings | None, store: ResultsStore) -> context.TuningSettings:
    """The caller's settings (budget, numerical check, margin, ...) with tuning on, for ``store``."""
    s = settings or context.current()
    return dataclasses.replace(s, enabled=True, tuning=True, use_stored=True, record_untuned=False,
                               results=store.path)


def warm_candidates(op, params: OpParams) -> list[str]:
    """Run the default and every candidate that supports ``params`` once, outside any budget; the
    names of those that ran without an error.

    Why: a candidate's first run in a process pays its first-use costs (NVRTC cubin load, Triton JIT
    or disk-cache load), which :func:`find_fastest` counts in its budget: right online, where the
    caller's first call pays them anyway, but offline, in fresh worker processes, they can exceed a
    short budget (the 50 ms default) on their own. Warming is per (candidate, compiled
    specialisation): running on the signature's own params compiles exactly what is then timed.
    Runs go through :func:`make_trial`, as in find_fastest: fresh NaN-filled outputs, copies of the
    inputs written, so ``params``' tensors are never written.

    The default's output is also compared with itself, as find_fastest's numerical check will
    compare every candidate's with it: the check's first run in a process loads torch's kernels for
    it, a one-off cost that would otherwise fall on the first signature of each fresh worker.

    Warming decides nothing: an error is swallowed, and find_fastest runs that candidate again and
    rejects it with its reason (or, for the default, raises it). Out of memory propagates, as there.
    """
    warmed = []
    for c in op.candidates:
        if c is not op.default and supports(c, params):  # find_fastest reports it as unsupported
            continue
        try:
            result = c.run(make_trial(params))
            if c is op.default:
                outputs = output_tensors(result)
                op.numerics(params)(outputs, outputs)
            synchronize(params.device)  # its stream, never the device (a capture elsewhere would fail)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception:  # find_fastest meets the same error inside its budget and rejects the candidate
            continue
        warmed.append(c.name)
    return warmed


def tune_params(op, params: OpParams, settings: context.TuningSettings, *, attempts: int = ATTEMPTS) -> Entry:
    """Tune ``params`` as the online path does (never touching them), up to ``attempts`` times until
    an attempt completes within its budget (the settings' first, doubled on each retry: offline, no
    caller waits, and an incomplete entry is what ``tunekit tune`` exists to replace: up to 1 + 2 + 4
    times the budget with the default three attempts); the entry (not stored), its ``tuning_ms``
    the attempts' sum. Every candidate first runs once (:func:`warm_candidates`), outside the budget and
    ``tuning_ms``: the budget measures tuning, not the first-use compilation a fresh process pays
    (the online path keeps counting it: there the caller pays it anyway)."""
    device = params.device
    spent = 0.0
    with TUNING_LOCK, on_device(device):
        warm_candidates(op, params)
        for attempt in range(max(1, attempts)):
            budget_ms = min(settings.max_tuning_ms * 2 ** attempt, sys.float_info.max)  # finite, as settings require
            report = find_fastest(op, params, dataclasses.replace(settings, max_tuning_ms=budget_ms), clock=op.clock)
            spent += report.tuning_ms
            if report.complete:
                break
    return Entry(op=op.name, signature=params.signature(), device=validators.device_name(device),
                 choice=report.choice, complete=report.complete,
                 validators=validators.validators_for(device, op.candidates), candidates=report.candidates,
                 tuned_at=time.time(), tuning_ms=spent)


def entry_problems(op, entry: Entry | None, device) -> list[str]:
    """Why ``entry`` is not a complete, valid result for ``op`` on ``device`` (empty when it is)."""
    if entry is None:
        return ["no entry"]
    problems = validators.mismatches(entry.validators, validators.validators_for(torch.device(device), op.candidates))
    if entry.choice not in {c.name for c in op.candidates}:
        problems.append(f"chosen candidate {entry.choice} no longer exists")
    if not entry.complete:
        problems.append("incomplete")
    return problems
