"""One rank of the torch.distributed tests (gloo, CPU): run by ``torch.multiprocessing.spawn``, each
rank writes what it saw to ``rank<r>.json`` in the shared directory for the test to check."""

from __future__ import annotations

import datetime
import json
import os

import torch
import torch.distributed as dist

import tunekit
from tunekit import distributed
from tunekit.tunable import context, registry, results_store, tuning
from tunekit.tunable.stores import close_all

from fakes import FakeClock, ScaleParams, make_op

BUDGET = 5000.0


def skewed_op(name: str, rank: int, *, default_raises_on_rank0: bool = False):
    """A registered fake op whose candidate "a" is the fastest on rank 0 and "b" on rank 1 (fake clock)."""
    clock = FakeClock()
    costs = {"ref": 2.0, "a": 0.5, "b": 1.0} if rank == 0 else {"ref": 2.0, "a": 1.0, "b": 0.5}
    behaviours = {"ref": "raises"} if default_raises_on_rank0 and rank == 0 else None
    op = make_op(clock, costs, name=name, behaviours=behaviours)
    op.clock = clock
    return registry.register(op)


def _choice(op, x) -> str:
    return op.resolve(ScaleParams(x)).candidate.name


def _entries(path) -> dict:
    return {f"{e.op} {e.signature}": [e.choice, e.tuned_at] for e in results_store(path).entries()}


def run_rank(rank: int, world: int, directory: str) -> None:
    for var in context.ENV_VARS.values():  # the developer's TUNEKIT_* settings must not leak in
        os.environ.pop(var, None)
    context.reload_environment()
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=world,
                           timeout=datetime.timedelta(seconds=60))
    out: dict = {"rank": rank}
    own = os.path.join(directory, f"rank{rank}.sqlite")
    x = torch.randn(64)
    try:
        # 1. without distribution the fake timings make the ranks choose differently
        local = skewed_op("skew_local", rank)
        with tuning(results=os.path.join(directory, f"local{rank}.sqlite"), max_tuning_ms=BUDGET):
            out["local_choice"] = _choice(local, x)
        # 2. online, enabled: rank 0 decides for both; each rank keeps the entry in its own store
        distributed.enable()
        skew = skewed_op("skew_online", rank)
        with tuning(results=own, max_tuning_ms=BUDGET):
            skew(ScaleParams(x))
            out["online_choice"] = _choice(skew, x)
            out["online_why"] = skew.resolve(ScaleParams(x)).why
            tunekit.silu(torch.randn(40))
            tunekit.gelu(torch.randn(8, 8, dtype=torch.float16), approximate="tanh")
            tunekit.logsumexp(torch.randn(4, 16), -1)
            out["builtin_choices"] = {op: tunekit.explain(*call).chosen for op, call in {
                "silu": ("silu", torch.randn(40)), "gelu": ("gelu", torch.randn(8, 8, dtype=torch.float16), "tanh"),
                "logsumexp": ("logsumexp", torch.randn(4, 16), -1)}.items()}
        out["online_entries"] = _entries(own)
        # 3. ranks meeting different signatures at one point all get the same error, nobody hangs
        with tuning(results=own, max_tuning_ms=BUDGET):
            try:
                tunekit.silu(torch.randn(100 + rank))
            except RuntimeError as exc:
                out["mismatch"] = str(exc)
            # 4. rank 0 fails to decide: the others are told, nobody hangs
            broken = skewed_op("broken", rank, default_raises_on_rank0=True)
            try:
                broken(ScaleParams(x))
            except RuntimeError as exc:
                out["rank0_error"] = str(exc)
        distributed.disable()
        # 5. offline, sharded: each rank records its own signatures; all are tuned once, by one rank
        shard_op = skewed_op("skew_offline", rank)
        shard = os.path.join(directory, f"shard{rank}.sqlite")
        with tuning(results=shard, tuning=False, record_untuned=True):
            for n in ([10, 11] if rank == 0 else [11, 12, 13]):
                shard_op(ScaleParams(torch.randn(n)))
            tunekit.silu(torch.randn(30 + rank))
        with tuning(max_tuning_ms=BUDGET):
            summary = distributed.tune_recorded_sharded(shard)
        out["sharded"] = {"summary": summary.as_dict(), "entries": _entries(shard),
                          "untuned": len(results_store(shard).untuned())}
    finally:
        distributed.disable()
        close_all()
        with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.destroy_process_group()
