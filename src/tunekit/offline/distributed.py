"""Tuning under ``torch.distributed``: every rank runs the same kernel for the same signature.

Why: ranks tune independently by default, and two GPUs of one model time candidates within noise
of each other, so rank 0 may pick candidate A and rank 1 candidate B for one signature. Results
then differ in their last bits between ranks (collectives that assume identical math, reproducible
runs, debugging), and per-rank stores disagree. Two ways to make the choice one:

- Online (:func:`enable`): when a tunable op meets a signature for the first time in the process,
  rank 0 of the group decides (reads its store or tunes, exactly as without distribution) and
  broadcasts the chosen candidate's name with ``broadcast_object_list``; the other ranks run that
  candidate and write rank 0's entry to their own store when it is not there. Before that, the
  ranks all-gather (op, signature) so that ranks which met different signatures all raise the same
  error instead of deadlocking. These are collectives: **every rank must meet its new signatures
  in the same order** (true for SPMD training, where every rank runs the same program on inputs of
  the same shapes), ``tunekit.explain`` of an undecided signature is a collective too, and with
  NCCL each rank must have its CUDA device set (``torch.cuda.set_device(local_rank)``). A miss
  during CUDA-graph capture is decided locally (no collectives may run inside a capture; nothing
  is tuned or cached then anyway).
- Offline (:func:`tune_recorded_sharded`, ``tunekit tune`` under torchrun): the ranks all-gather
  their recorded untuned signatures, rank r tunes the i-th (sorted) when ``i % world == r``, then
  all entries are all-gathered and every rank writes all of them to its store.

The runtime's decider (:func:`tunekit.tunable.tunable_op.use_decider`) is how: :func:`enable` makes
:func:`decide` the decider, :func:`disable` removes it; with torch.distributed not initialized (or a
group of one) it decides locally.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import torch
import torch.distributed as dist

from .claims import pending
from .rebuild import rebuild_params
from .recorded import as_store, check_ops, forget_ops
from .summary import Progress, TuneSummary
from .tune_one import ATTEMPTS, default_device, entry_problems, offline_settings, tune_params
from ..backends import fast_grad
from ..tunable import context, tunable_op, validators
from ..tunable.errors import SettingsError, TunekitWarning
from ..tunable.registry import get_op
from ..tunable.screen import reason
from ..tunable.stores import results_store
from ..tunable.tunable_op import Resolution

__all__ = ["enable", "disable", "is_enabled", "enabled", "enable_from_environment", "init_from_environment",
           "tune_recorded_sharded", "decide"]

_group = None


def enable(group=None) -> None:
    """From now on, rank 0 of ``group`` (default: the world) decides every new signature for all ranks.
    May wait for tunekit's C++ autograd call to build (seconds, once per machine): :func:`_settle_call_paths`."""
    global _group
    _settle_call_paths()
    _group = group
    tunable_op.use_decider(decide)


def _settle_call_paths() -> None:
    """Load the C++ autograd call (``backends/fast_grad.py``) and put it in place wherever it was asked
    for, now. Why: until it is in place, a differentiable call takes the op's Python Function, whose
    backward decides the backward op's signatures; once it is, torch's node runs the backward and
    decides none. A build ending at a different call on each rank made the ranks meet different new
    signatures and raise (the two-rank CPU check, fresh build cache: 1 run in 4)."""
    fast_grad.load()
    fast_grad.when_loaded.settle()


def disable() -> None:
    """Every rank decides for itself again (choices already made stay)."""
    tunable_op.use_decider(None)


def is_enabled() -> bool:
    return tunable_op.current_decider() is decide


@contextlib.contextmanager
def enabled(group=None):
    """``with tunekit.distributed.enabled(): ...``: :func:`enable` for a block."""
    global _group
    _settle_call_paths()
    before_group = _group
    before = tunable_op.use_decider(decide)
    _group = group
    try:
        yield
    finally:
        tunable_op.use_decider(before)
        _group = before_group


def enable_from_environment() -> bool:
    """:func:`enable` when ``TUNEKIT_DISTRIBUTED`` is 1/true/yes/on (for ``tunekit/__init__.py``); unset
    or 0/false/no/off leaves it off. Any other value is a SettingsError naming the variable (the
    ``tunekit`` command prints it as one line and exits 2)."""
    try:
        on = context.environment_flag("TUNEKIT_DISTRIBUTED", False)
    except SettingsError as error:
        context.exit_if_command(error)
        raise
    if on:
        enable()
    return on


def init_from_environment(backend: str | None = None) -> bool:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ... in the
    environment) unless already joined; False when not launched that way. NCCL (the default with
    CUDA) gets ``NCCL_NVLS_ENABLE=0`` unless set, and each rank the GPU ``LOCAL_RANK``."""
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return True


def _active(group) -> bool:
    return (dist.is_available() and dist.is_initialized() and dist.get_rank(group) >= 0
            and dist.get_world_size(group) > 1)


def _source(group) -> int:
    """The global rank of the group's rank 0 (what broadcast's ``src`` takes)."""
    return 0 if group is None else dist.get_global_rank(group, 0)


def decide(op, params, s, signature, device, device_name) -> Resolution:
    """The runtime's decider while enabled: rank 0 decides, every rank follows (module docstring).
    Rank 0 tunes in one call (``incremental=False``): a tuning spread over calls would resume on
    rank 0 alone, out of step with the collectives of the other ranks."""
    group = _group
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing or not _active(group):
        return op.decide_here(params, s, signature, device, device_name, incremental=False)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    met = [None] * world
    dist.all_gather_object(met, [op.name, signature], group=group)
    if any(m != met[0] for m in met):
        detail = "; ".join(f"rank {r}: {m[0]} {m[1]}" for r, m in enumerate(met))
        raise RuntimeError("tunekit.distributed: ranks met different new signatures at the same point "
                           f"({detail}); every rank must call tunekit ops on the same shapes in the same order")
    payload, result, error = None, None, None
    if rank == 0:
        try:
            result = op.decide_here(params, s, signature, device, device_name, incremental=False)
            payload = {"choice": result.candidate.name, "why": result.why, "cache": result.cache,
                       "entry": result.entry, "tuned_now": result.why.startswith("tuned now")}
        except Exception as exc:  # the others must not wait for an answer that never comes
            error, payload = exc, {"error": f"{type(exc).__name__}: {exc}"}
    box = [payload]
    dist.broadcast_object_list(box, src=_source(group), group=group)
    if rank == 0:
        if error is not None:
            raise error
        return result
    return _follow(op, params, s, signature, device_name, box[0], world)


def _follow(op, params, s, signature, device_name, payload, world) -> Resolution:
    """A rank other than 0: run rank 0's choice, keep its entry, mirror its cache invalidation."""
    if "error" in payload:
        raise RuntimeError(f"tunekit.distributed: rank 0 failed to decide {op.name} {signature}: {payload['error']}")
    try:
        candidate = op.candidate(payload["choice"])
    except KeyError:
        raise RuntimeError(f"tunekit.distributed: rank 0 chose {payload['choice']!r} for {op.name}, which this "
                           "rank does not have (different tunekit versions?)") from None
    why = candidate.supports(params)
    if why:
        raise RuntimeError(f"tunekit.distributed: rank 0 chose {candidate.name} for {op.name} {signature}, "
                           f"which cannot run here: {why}")
    entry = payload["entry"]
    store = results_store(s.results)
    try:
        if entry is not None and entry.device == device_name and store.get(op.name, signature, device_name) != entry:
            store.put(entry)
        if entry is None and s.record_untuned:
            store.record_untuned(op.name, signature, device_name, params.spec())
    except Exception as exc:  # like the local path: a store we cannot write never breaks the op
        warnings.warn(f"tunekit: could not save rank 0's result: {exc}", TunekitWarning, stacklevel=6)
    if payload["tuned_now"]:
        op.forget_untuned(s, signature)  # as rank 0's tuning did: the caches must stay alike
    return Resolution(candidate, f"{payload['why']} (decided by rank 0 of {world})", signature, device_name,
                      entry, cache=payload["cache"])


def tune_recorded_sharded(store=None, *, group=None, ops=None, device=None, settings=None,
                          progress: Progress | None = None, keys=None,
                          attempts: int = ATTEMPTS) -> TuneSummary:
    """Offline tuning across the ranks of ``group`` (a collective: every rank calls it).

    Each rank contributes its store's untuned records of its device name; rank r tunes the i-th of
    their sorted union when ``i % world == r`` (or shares the complete valid entry it already has),
    on ``device`` (default: its current CUDA device, else the CPU); then every rank writes every
    rank's entries to its store and drops the records they answer. The summary counts every rank's
    work. ``progress(done, total, label)`` reports this rank's share. ``ops`` / ``keys`` filter the
    records as in :func:`tunekit.offline.recorded.tune_recorded`.
    """
    store, device = as_store(store), torch.device(device) if device is not None else default_device()
    ops, settings = check_ops(ops), offline_settings(settings, store)
    start = time.perf_counter()
    name = validators.device_name(device)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    records, _ = pending(store, name, ops=ops, keys=keys)
    gathered = [None] * world
    dist.all_gather_object(gathered, [(r.op, r.signature, r.device, r.spec) for r in records], group=group)
    union = {}
    for share in gathered:
        for op_name, signature, dev, spec in share:
            union.setdefault((op_name, signature, dev), spec)
    items = sorted(union.items())
    mine = [item for i, item in enumerate(items) if i % world == rank]
    entries, counts, failed = [], {"tuned": 0, "incomplete": 0, "already": 0}, []
    for done, ((op_name, signature, dev), spec) in enumerate(mine):
        if progress is not None:
            progress(done, len(mine), f"{op_name} {signature}")
        try:
            entry, kind = _tune_item(store, op_name, signature, dev, spec, device, name, settings, attempts)
            entries.append(entry)
            counts[kind] += 1
        except Exception as exc:
            failed.append([op_name, signature, reason(exc)])
    everything = [None] * world
    dist.all_gather_object(everything, (entries, counts, failed), group=group)
    summary = TuneSummary(device=name)
    for rank_entries, rank_counts, rank_failed in everything:
        for entry in rank_entries:
            if entry.device == name and store.get(entry.op, entry.signature, entry.device) != entry:
                store.put(entry)
            if entry.complete:
                store.remove_untuned(entry.op, entry.signature, entry.device)
        summary.tuned += rank_counts["tuned"]
        summary.incomplete += rank_counts["incomplete"]
        summary.already += rank_counts["already"]
        summary.failed.extend(rank_failed)
    left, others = pending(store, name, ops=ops, keys=keys)
    summary.total, summary.remaining, summary.other_devices = len(items), len(left), others
    summary.wall_s = time.perf_counter() - start
    if progress is not None:
        progress(len(mine), len(mine), "done")
    forget_ops(op_name for (op_name, _, _), _ in items)  # on every rank alike
    return summary


def _tune_item(store, op_name, signature, dev, spec, device, name, settings, attempts):
    """One sharded item: (the entry to share, "tuned" | "incomplete" | "already"); raises if it fails."""
    if dev != name:
        raise ValueError(f"recorded on {dev}; this rank's device is {name}")
    op = get_op(op_name)
    entry = store.get(op_name, signature, dev)
    if not entry_problems(op, entry, device):
        return entry, "already"
    params = rebuild_params(op, spec, device)
    if params.signature() != signature:
        raise ValueError(f"the rebuilt inputs give signature {params.signature()!r}")
    entry = tune_params(op, params, settings, attempts=attempts)
    store.put(entry)
    return entry, "tuned" if entry.complete else "incomplete"
