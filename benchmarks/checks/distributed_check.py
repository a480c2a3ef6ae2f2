"""Under torchrun, check that tunekit's ranks agree on every tuning choice and every store is complete.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 benchmarks/checks/distributed_check.py
    torchrun --standalone --nproc_per_node 2 benchmarks/checks/distributed_check.py --smoke   # CPU, gloo

NCCL on GPUs (each rank on GPU ``LOCAL_RANK``; NVLink multicast is kept off), gloo without CUDA. Each
rank has its own results store (``--dir``/rank<r>.sqlite, a fresh temporary directory by default),
as ranks on separate hosts would. Rank 0 prints one PASS / FAIL line per check, then ALL PASS or
SOME FAILED; every rank exits 1 when a check failed.

1. skew: a demo op whose candidate "a" is the fastest on even ranks and "b" on odd ranks (spin
   kernels on the GPU, sleeps on the CPU). Each rank tuning alone picks differently (shown as INFO); with
   ``tunekit.distributed.enable()`` every rank runs rank 0's choice.
2. online: a training-like step (silu, gelu, logsumexp forward and backward on several shapes and
   dtypes) with tuning on: every rank decided the same candidate for every signature, and every
   rank's store holds the same entries.
3. offline: each rank records different signatures (tuning off, ``record_untuned``), then
   ``tunekit.tune.run`` (under torchrun: ``tune_recorded_sharded``): every store holds the union,
   identical on every rank, nothing failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton candidates run in the interpreter on the CPU

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit import distributed  # noqa: E402
from tunekit.offline import run as tune  # noqa: E402
from tunekit.tunable import OpParams, TunableOp, register, results_store, tuning  # noqa: E402
from tunekit.tunable.params import tensor_key, tensor_signature  # noqa: E402
from tunekit.tunable.registry import all_ops  # noqa: E402


class ScaleParams(OpParams):
    op_name = "dist_check_scale"
    inputs = ("x",)
    outputs = ("out",)

    def __init__(self, x, out=None):
        self.x, self.out = x, out

    def cache_key(self):
        return (tensor_key(self.x), tensor_key(self.out))

    def signature(self):
        return f"x={tensor_signature(self.x)} out={'new' if self.out is None else tensor_signature(self.out)}"

    def new_outputs(self):
        return {"out": torch.empty_like(self.x)}


def skew_op(rank: int) -> TunableOp:
    """out = 2x by three candidates: the default "ref" waits a little on every rank, "a" waits long on
    odd ranks and not at all on even ones, "b" the other way round."""
    def wait(p, units):
        if p.x.is_cuda:
            torch.cuda._sleep(10_000 * units)
        else:
            time.sleep(0.001 * units)

    def ref(p):
        wait(p, 1)
        return torch.mul(p.x, 2, out=p.out if p.out is not None else torch.empty_like(p.x))

    def a(p):
        if rank % 2:
            wait(p, 3)
        return torch.mul(p.x, 2, out=p.out if p.out is not None else torch.empty_like(p.x))

    def b(p):
        if rank % 2 == 0:
            wait(p, 3)
        return torch.mul(p.x, 2, out=p.out if p.out is not None else torch.empty_like(p.x))

    op = TunableOp("dist_check_scale", ScaleParams,
                   make_example=lambda shape, dtype, device: ScaleParams(torch.randn(shape, dtype=dtype,
                                                                                     device=device)))
    op.add(ref, name="ref", default=True)
    op.add(a, name="a")
    op.add(b, name="b")
    return register(op)


def decided() -> dict[str, str]:
    """Every (op, signature) decided under the settings in force, and the candidate that runs (the
    ops' in-memory decisions: what actually runs, whether tuned, read or followed from rank 0)."""
    cache_id = tunekit.settings().cache_id
    return {f"{op.name} {signature}": r.candidate.name
            for op in all_ops() for signature, r in op._decided.get(cache_id, {}).items()}


def entries(path) -> dict[str, tuple]:
    return {f"{e.op} {e.signature}": (e.choice, e.tuned_at, e.complete) for e in results_store(path).entries()}


def gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def training_step(device, smoke: bool) -> None:
    """silu / gelu / logsumexp forward and backward, as a model step would call them."""
    sizes = [(4, 64), (8, 96)] if smoke else [(4096, 4096), (8192, 2048), (2048, 8192)]
    dtypes = [torch.float32] if smoke else [torch.float32, torch.float16, torch.bfloat16]
    for shape in sizes:
        for dtype in dtypes:
            x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
            h = tunekit.gelu(tunekit.silu(x), approximate="tanh")
            loss = tunekit.logsumexp(h.float(), -1).sum()
            loss.backward()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where each rank's results store goes (default: a fresh temporary directory)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU, gloo)")
    ap.add_argument("--max-tuning-ms", type=float, default=None, help="tuning budget (default: the settings')")
    args = ap.parse_args(argv)
    if not distributed.init_from_environment():
        print("run me under torchrun: torchrun --standalone --nproc_per_node 2 benchmarks/checks/distributed_check.py")
        return 2
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    budget = args.max_tuning_ms or (1000.0 if device.type == "cpu" else tunekit.settings().max_tuning_ms)
    directory = args.dir or gather(tempfile.mkdtemp(prefix="tunekit-dist-") if rank == 0 else None)[0]
    own = os.path.join(directory, f"rank{rank}.sqlite")
    lines, ok = [], True

    def check(name, passed, detail):
        nonlocal ok
        ok = ok and passed
        lines.append(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")

    names = gather(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    lines.append(f"INFO {world} ranks, backend {dist.get_backend()}, devices {names}, stores {directory}/rank*.sqlite")
    op = skew_op(rank)
    x = torch.randn(1 << (10 if device.type == "cpu" else 20), device=device)
    with tuning(results=os.path.join(directory, f"alone{rank}.sqlite"), max_tuning_ms=budget):
        alone = gather(op.resolve(ScaleParams(x)).candidate.name)
    lines.append(f"INFO skew, each rank tuning alone chose {alone}")
    distributed.enable()
    with tuning(results=own, max_tuning_ms=budget):
        op(ScaleParams(x))
        together = gather(op.resolve(ScaleParams(x)).candidate.name)
        # rank 0 tuned again into a fresh store: its choice may differ from its "alone" one (timing
        # noise between the default and a challenger), but every rank must run that one choice
        check("skew", len(set(together)) == 1,
              f"with tunekit.distributed every rank runs rank 0's choice: {together} (alone: {alone})")
        training_step(device, args.smoke)
        if device.type == "cuda":
            torch.cuda.synchronize()
        choices = gather(decided())
    same = all(c == choices[0] for c in choices)
    check("online choices", same and len(choices[0]) > 3, f"{len(choices[0])} signatures decided, ranks agree: {same}")
    stores = gather(entries(own))
    same = all({k: v[0] for k, v in s.items()} == {k: v[0] for k, v in stores[0].items()} for s in stores)
    missing = sorted(set(choices[0]) - set(stores[rank]) - {k for k, v in choices[0].items() if v is None})
    check("online stores", same and not gather(missing)[0],
          f"{len(stores[0])} entries per rank, same choices on every rank: {same}, "
          f"decided but not stored: {missing[:3]}")
    distributed.disable()

    shard = os.path.join(directory, f"shard{rank}.sqlite")
    n0 = 1000 if args.smoke else 1 << 20
    with tuning(results=shard, tuning=False, record_untuned=True):
        for k in range(3):
            tunekit.silu(torch.randn(n0 + 16 * (rank + k), device=device))  # neighbouring ranks share some
            tunekit.gelu(torch.randn(n0 + 32 * (rank + 2 * k), device=device))
    recorded = gather(sorted(f"{r.op} {r.signature}" for r in results_store(shard).untuned()))
    union = set().union(*recorded)
    with tuning(max_tuning_ms=budget):
        summary = tune.run(shard)  # under torchrun: distributed.tune_recorded_sharded, what `tunekit tune` runs
    stored = gather(entries(shard))
    complete = all(union <= set(s) for s in stored)
    same = all(s == stored[0] for s in stored)
    left = gather(len(results_store(shard).untuned()))
    check("offline sharded", complete and same and not summary.failed,
          f"{len(union)} recorded signatures over the ranks, every store has them all: {complete}, identical on "
          f"every rank: {same}, tuned {summary.tuned} + {summary.incomplete} incomplete (their records stay for "
          f"the next run: {left} per rank), failed {summary.failed[:2]}")
    verdict = gather(ok)
    if rank == 0:
        print("\n".join(lines))
        print("ALL PASS" if all(verdict) else "SOME FAILED")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(verdict) else 1


if __name__ == "__main__":
    raise SystemExit(main())
