r"""Pre-tuned results to ship for this GPU model: offline tuning of the benchmark suites' signatures.

Run on the GPU whose results are shipped: ``PYTHONPATH=src python benchmarks/pretune.py [--out DIR]
[--families silu,gelu,gelu_tanh,logsumexp,gemm] [--budget-ms 1000] [--time-limit 500]``. Writes
``<GPU model>.csv`` (``tunable/shipped.py``: the results store's CSV export) into ``--out`` (default:
``src/tunekit/pretuned``) after every signature, so a run cut short keeps what it tuned. ``--update``
keeps the file's entries of the ops not tuned now (``--families gemm --update`` after a GEMM
candidate changed: the other ops' entries are still valid); ``--only REGEX`` tunes only the
signatures whose label matches it and keeps every other entry (``--only '\.M(1|16) '`` after
candidates for decode shapes were added: entries stay valid when candidates are only added).

Signatures: the first-use suite's (silu, gelu, gelu tanh: forward and backward at its shapes;
logsumexp forward and backward at the logsumexp suite's shapes; float32, float16, bfloat16) and
the GEMM suite's default shapes (bfloat16), and for its fused-epilogue shapes the linear with a bias and
the linear + bias + gelu tanh (addmm). Each is tuned as ``tunekit tune`` tunes it
(``offline.tune_one.tune_params``: every candidate warmed outside the budget, then find_fastest
under the default settings with a longer budget, so that the entry is complete). Shipped results
are then used by every process on the same GPU model, driver, torch / Triton minor versions and
candidate sources.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tunekit.bench.suites import activations as act_suite, logsumexp as lse_suite  # noqa: E402
from tunekit.bench.suites.common import DTYPES  # noqa: E402
from tunekit.bench.suites.first_use import FAMILIES, signatures  # noqa: E402
from tunekit.offline.tune_one import tune_params  # noqa: E402
from tunekit.tunable import context, registry, shipped, validators  # noqa: E402
from tunekit.backends import quack, shipped_kernels, triton_kept_files  # noqa: E402
from tunekit.backends.cache import cache_dir  # noqa: E402
from tunekit.tunable.entries import write_csv  # noqa: E402
from tunekit.tunable.results import ResultsStore  # noqa: E402
from tunekit.ops.gemm.quack_candidates import QuackGemm  # noqa: E402


def _gemm_suite():
    spec = importlib.util.spec_from_file_location("gemm_suite", ROOT / "benchmarks" / "suites" / "gemm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def work(families, device) -> list[tuple[str, str, object]]:
    """(label, op name, a thunk that makes the op and params) per signature to tune, in order."""
    out = []
    for family in [f for f in families if f in FAMILIES]:
        for d, shape, dim, dtype in signatures(family, list(DTYPES), act_suite.TARGET_SHAPES, lse_suite.SHAPES):
            label = f"{d.family} {d.direction} {'x'.join(map(str, shape))}{'' if dim is None else f':{dim}'} {dtype}"
            out.append((label, d.op, lambda d=d, shape=shape, dim=dim, dtype=dtype: (
                registry.get_op(d.op), d.example(shape, DTYPES[dtype], device, dim))))
    if "gemm" in families:
        gemm = _gemm_suite()
        for shape in gemm.select("default"):
            out.append((f"mm {shape.name} bfloat16", gemm.mm_op.name, lambda shape=shape: (
                gemm.mm_op, gemm.example(shape, torch.bfloat16, device))))
        for shape in [s for s in gemm.select("default") if s.fused]:  # linear(x, w, b), linear_act(.., "gelu_tanh")
            for act in ("none", "gelu_tanh"):
                out.append((f"addmm {shape.name} bias {act} bfloat16", gemm.addmm_op.name,
                            lambda shape=shape, act=act: (gemm.addmm_op, _linear_example(gemm, shape, act, device))))
    return out


def _linear_example(gemm, shape, activation: str, device):
    """addmm params of ``F.linear(x, w, b)`` (``activation`` in its epilogue: ``tunekit.linear_act``), as
    the GEMM suite's fused comparison makes them."""
    p = gemm.example(shape, torch.bfloat16, device)
    bias = torch.randn(p.b.shape[1], dtype=torch.bfloat16, device=device)
    return gemm.AddmmParams(bias, p.a, p.b, activation=activation)


def bundle_only(families, device, target: Path) -> int:
    """Prepare every shipped choice of ``target`` (this process's caches must start empty) and write
    the kernels bundle beside it."""
    table = shipped.entries_for(target)
    here = str(".".join(map(str, torch.cuda.get_device_capability(device)))) if device.type == "cuda" else None
    other = {e.validators.get("compute_capability") for e in table.values()} - {here}
    if other:
        raise SystemExit(f"{target.name}: entries for compute capability {sorted(map(str, other))}, this GPU is {here}")
    not_here = []
    for label, _, make in work(families, device):
        op, params = make()
        entry = table.get((op.name, params.signature()))
        prepare = None if entry is None else getattr(op.candidate(entry.choice), "prepare", None)
        if prepare is not None and isinstance(op.candidate(entry.choice), QuackGemm) and quack.unavailable(device.index):
            not_here.append(label)  # built where quack is installed: its kernels come from the bundle replaced
        elif prepare is not None:
            prepare(params)
            print(f"prepared {label}: {entry.choice}", flush=True)
    if not_here:
        carried = _carry_quack_kernels(shipped_kernels.bundle_for(target), cache_dir("quack"))
        if not carried:
            raise SystemExit(f"quack-kernels is not installed here and the bundle replaced holds no quack kernels for "
                             f"{', '.join(not_here)}: write this bundle where quack-kernels is installed")
        print(f"quack not installed here: {carried} quack kernels carried over from the bundle replaced (all it held), "
              f"for {', '.join(not_here)}", flush=True)
    triton_dir = Path(os.environ["TRITON_CACHE_DIR"]) if os.environ.get("TRITON_CACHE_DIR") else None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    bundle = shipped_kernels.bundle_for(target)
    cubins, kernels, kept, quacks = shipped_kernels.write_bundle(
        bundle, cache_dir("cubin"), triton_dir, triton_version, cache_dir(triton_kept_files.STATIC_DIR_KIND),
        cache_dir("quack"))
    print(f"wrote {bundle}: {cubins} cubins, {kernels} Triton kernels, {kept} kept Triton launches, {quacks} quack "
          f"kernels ({bundle.stat().st_size / 1e3:.0f} kB)")
    return 0


def _carry_quack_kernels(old_bundle: Path, quack_dir: Path) -> int:
    """Unpack the quack kernels of ``old_bundle`` into this process's (fresh) quack cache folder, where
    ``write_bundle`` takes them from; how many. For a bundle rewritten on a machine without quack-kernels:
    its entries' choices and sources are unchanged (the table's validators say so), so are their builds.
    All of them: a kernel no entry chooses any more travels too (the bundle holds only what the shipped
    table chose when made where quack-kernels is installed). A member that would land outside the folder
    stops it."""
    if not old_bundle.is_file():
        return 0
    root = quack_dir.resolve()
    with zipfile.ZipFile(old_bundle) as z:
        members = [m for m in z.namelist() if m.startswith("quack/") and not m.endswith("/")]
        for member in members:
            dest = (quack_dir / member.removeprefix("quack/")).resolve()
            if not dest.is_relative_to(root) or dest == root:
                raise SystemExit(f"{old_bundle}: a quack member outside its folder: {member!r}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(member))
    return len({m.split("/")[1] for m in members})


def bundle_in_fresh_process(args) -> int:
    """``--bundle-only`` in a child process whose tunekit and Triton caches are new, empty folders."""
    fresh = Path(tempfile.mkdtemp(prefix="tunekit-bundle-"))
    env = {**os.environ, "TUNEKIT_CACHE": str(fresh / "tunekit"), "TRITON_CACHE_DIR": str(fresh / "triton"),
           "TUNEKIT_USE_SHIPPED": "0"}
    cmd = [sys.executable, __file__, "--bundle-here", "--out", args.out, "--families", args.families,
           "--device", args.device] + (["--for-device", args.for_device] if args.for_device else [])
    return subprocess.call(cmd, env=env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(shipped.SHIPPED_DIR))
    ap.add_argument("--families", default=",".join(FAMILIES + ("gemm",)))
    ap.add_argument("--budget-ms", type=float, default=1000.0, help="tuning budget per signature")
    ap.add_argument("--time-limit", type=float, default=500.0, help="seconds; later signatures are left out")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only shows that the script runs")
    ap.add_argument("--only", default=None, help="a regular expression: tune only the signatures whose label it "
                    "finds (e.g. 'mm .*\\.M1 '), keeping the file's other entries")
    ap.add_argument("--update", action="store_true",
                    help="keep the file's entries of the ops not tuned now (e.g. --families gemm after a new "
                         "GEMM candidate) and bundle every family's kernels")
    ap.add_argument("--bundle-only", action="store_true",
                    help="only write the kernels bundle of the shipped file in --out (in a process with empty caches)")
    ap.add_argument("--for-device", default=None,
                    help="with --bundle-only: the GPU model whose shipped file's bundle is written (default: this "
                         "GPU); builds are per architecture, so another model of this GPU's compute capability "
                         "(an H200's bundle on an H100)")
    ap.add_argument("--bundle-here", action="store_true", help=argparse.SUPPRESS)  # that process
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    name = validators.device_name(device)
    if args.for_device:
        if not (args.bundle_only or args.bundle_here):
            ap.error("--for-device needs --bundle-only")
        name = args.for_device
    target = shipped.file_for(name, Path(args.out))
    target.parent.mkdir(parents=True, exist_ok=True)
    if args.bundle_here:
        return bundle_only(args.families.split(","), device, target)
    if args.bundle_only:
        return bundle_in_fresh_process(args)
    store = ResultsStore(Path(tempfile.mkdtemp(prefix="tunekit-pretune-")) / "results.sqlite")
    settings = dataclasses.replace(context.current(), max_tuning_ms=args.budget_ms, results=store.path,
                                   use_shipped=False)
    start, todo = time.perf_counter(), work(args.families.split(","), device)
    if args.only:
        todo = [t for t in todo if re.search(args.only, t[0])]
        args.update = True  # every entry not tuned now stays
    tuned_ops = {op_name for _, op_name, _ in todo}
    before = list(shipped.entries_for(target).values())
    kept = [e for e in before if args.only or e.op not in tuned_ops] if args.update else []
    if args.update:
        args.families = ",".join(FAMILIES + ("gemm",))  # the bundle holds the kept entries' kernels too
    complete = kept
    for i, (label, _, make) in enumerate(todo):
        if time.perf_counter() - start > args.time_limit:
            print(f"time limit: {len(todo) - i} signatures left out", flush=True)
            break
        op, params = make()
        t0 = time.perf_counter()
        entry = tune_params(op, params, settings)
        store.put(entry)
        if entry.complete:  # an incomplete re-tune is not shipped: the entry it would replace stays
            kept = [e for e in kept if (e.op, e.signature) != (entry.op, entry.signature)]
        complete = kept + [e for e in store.entries() if e.complete]
        write_csv(target, sorted(complete, key=lambda e: (e.op, e.signature)))
        print(f"[{i + 1}/{len(todo)}] {label}: {entry.choice}{'' if entry.complete else ' (incomplete: not shipped)'}"
              f" {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"wrote {target} ({len(complete)} entries) in {time.perf_counter() - start:.0f} s")
    return bundle_in_fresh_process(args)


if __name__ == "__main__":
    sys.exit(main())
