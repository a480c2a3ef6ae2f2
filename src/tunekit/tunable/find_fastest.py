"""find_fastest: which candidate runs these params fastest, among those that compute the right thing.

The steps, all inside one budget (``max_tuning_ms``) that counts support checks, compilation (a
candidate's first run), numerical checks, probes and timed runs:

1. Screening (:mod:`tunekit.tunable.screen`): ``supports()``, the default's reference run on
   proxies, and one checked run of every other supported candidate (also its warm-up), each
   followed by one probe (one measurement).
2. Timing. Inputs are copied into enough sets to overflow the GPU's L2, and each measurement runs
   over all of them, so every run reads cold inputs. The probes drop candidates slower than
   ``prune_ratio`` x the fastest: long-tail candidates cost one probe, not a full schedule (ONNX
   Runtime TunableOp's "tuning speed" question). Then rounds: in each round every survivor is
   measured once, in an order rotated from round to round, so drift hits all alike (its "noisy
   machine" question); at least ``MIN_ROUNDS``, then until each candidate's samples add up to
   ``timed_rounds.ENOUGH_MS`` or the budget ends. The median of the rounds is the candidate's time.

   What a measurement is, on CUDA: the device time of the candidate's kernels run back to back.
   By default (``cuda_graph``) each candidate's runs are captured once into a CUDA graph and its
   replays timed; the one-shot probes, and the fallback when a candidate cannot be captured, launch
   eagerly behind a spin kernel that holds the stream until the host has enqueued them all
   (:class:`~tunekit.tunable.timing.CudaQueuedTimer`, nvbench's "blocking kernel"). Either way
   launch cost and host jitter stay out of the number: plain events around eager launches measure
   the host's launch rate whenever a kernel is shorter than its launch, which ranks candidates by
   launch cost.
3. Choice: with the rounds done, the fastest, except that the default keeps its place unless the
   challenger is faster by more than ``margin``: a tuned op is never slower than an untuned one by
   more than noise. When the budget ran out before them, a challenger wins only on a decisive lead
   (``session.DECISIVE``). On CUDA, candidates tied with the choice on device time are then
   compared on host time (:mod:`tunekit.tunable.host_time`), which an eager caller of a small op
   waits on.

An entry whose budget ran out before every candidate was screened, or before ``MIN_ROUNDS``
completed rounds, is marked incomplete. The steps are :class:`~tunekit.tunable.session.TuningSession`'s,
run here in one go; online, a new signature's session is spread over its first calls.
"""

from __future__ import annotations

import time
from typing import Callable

from . import isolation
from .context import TuningSettings
from .params import OpParams
from .screen import MAX_INPUT_SETS, input_sets
from .session import DECISIVE, MAX_ROUNDS, MIN_ROUNDS, TuningReport, TuningSession
from .timing import Timer

__all__ = ["find_fastest", "TuningReport", "MIN_ROUNDS", "MAX_ROUNDS", "MAX_INPUT_SETS", "DECISIVE", "input_sets"]


def find_fastest(op, params: OpParams, settings: TuningSettings, *, clock: Callable[[], float] = time.perf_counter,
                 timer: Timer | None = None) -> TuningReport:
    """Tune ``op`` for ``params`` in this call (never touching the user's buffers). See the module docstring.
    The thread is THREAD_LOCAL meanwhile (``isolation.apart``): a capture in another thread in global mode does
    not refuse the tuning's allocations and synchronizations (two captures at once stay unsafe: see there)."""
    with isolation.apart():
        return TuningSession(op, params, settings, clock=clock, timer=timer).run()
