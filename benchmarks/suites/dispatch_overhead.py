"""Host time per call of a cached ``tunekit.silu`` against calling its chosen candidate directly,
and against torch eager ``F.silu``.

The runtime's cost on the cached path (the public function's fast path, see tunable_op): the
argument checks, the cache key built inline, one ContextVar read, two dict lookups, then the
choice's runner (for a CUDA C kernel: ``torch.empty_like`` and the C launch, everything else bound
when the choice was made). Targets: at most 1.5 us per call over calling the chosen
candidate directly; no more host time than ``F.silu`` (issue 3). On CUDA the rows marked "pinned"
run ``tunekit.silu`` with its choice fixed to a CUDA C kernel through a stored results entry (as an
offline-tuned results file would), to show the host cost of the NVRTC launch path.
Run: ``PYTHONPATH=src python benchmarks/suites/dispatch_overhead.py [--save]``.

Each figure is the median over repeats of (wall time of N back-to-back calls) / N on a small tensor,
so host time dominates. On CUDA the calls are asynchronous; one synchronisation ends each repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.offline import warm_candidates  # noqa: E402
from tunekit.ops.silu import SiluParams, silu_op  # noqa: E402
from tunekit.tunable import validators  # noqa: E402
from tunekit.tunable.results import CandidateRecord, Entry  # noqa: E402
from tunekit.tunable.stores import results_store  # noqa: E402


def per_call_us(fn, device, calls=20000, repeats=9):
    for _ in range(1000):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def run(device: torch.device) -> list[tuple[str, float]]:
    x = torch.randn(1024, device=device)
    warm_candidates(silu_op, SiluParams(x))  # first-use compiles outside the tuning budget
    with tunekit.tuning(results=":memory:", max_tuning_ms=2000):  # a complete tuning: what a cached call gets
        tunekit.silu(x)
        resolution = silu_op.resolve(SiluParams(x))
        chosen = resolution.candidate
        if resolution.entry is not None:
            for name, record in sorted(resolution.entry.candidates.items(), key=lambda kv: kv[1].time_ms or 1e9):
                if record.status != "unsupported":
                    print(f"  tuning {x.numel()} {x.dtype} on {device.type}: {name}: {record.status} {record.time_ms} {record.reason}")
        rows = [
            ("F.silu(x)  (torch, direct)", per_call_us(lambda: F.silu(x), device)),
            (f"{chosen.name}.run(SiluParams(x))  (chosen candidate, direct)",
             per_call_us(lambda: chosen.run(SiluParams(x)), device)),
            ("silu_op(SiluParams(x))  (tunable op, cached)", per_call_us(lambda: silu_op(SiluParams(x)), device)),
            ("silu_op.fast_call(x)  (the fast path: lookup + the choice's runner)",
             per_call_us(lambda: silu_op.fast_call(x), device)),
            ("tunekit.silu(x)  (public function, cached)", per_call_us(lambda: tunekit.silu(x), device)),
        ]
    if device.type == "cuda":
        rows += pinned_rows(x, "silu_f32x4")
        rows += launch_rows(x, "silu_f32x4")
    return rows


def launch_rows(x, name):
    """Where the CUDA C path's host time goes: the output's allocation, and the launch."""
    c = silu_op.candidate(name)
    kernel = c.kernel
    y = torch.empty_like(x)
    n, index = x.numel(), x.get_device()
    runner = c.fast_runner(SiluParams(x))
    rows = [("torch.empty_like(x)", per_call_us(lambda: torch.empty_like(x), x.device)),
            ("CudaKernel.launch  (C extension, cuda-bindings without it)",
             per_call_us(lambda: kernel.launch(index, 1, 256, x, y, n), x.device))]
    if runner is not None:
        rows.append((f"{name} runner(x)  (allocation + launch, all else bound)", per_call_us(lambda: runner(x), x.device)))
    return rows


def pinned_rows(x, name):
    """``tunekit.silu`` with its choice for ``x`` pinned to candidate ``name`` by a stored entry."""
    c = silu_op.candidate(name)
    p = SiluParams(x)
    with tunekit.tuning(results=":memory:", tuning=False):
        store = results_store(":memory:")
        store.put(Entry(op="silu", signature=p.signature(), device=validators.device_name(x.device), choice=name,
                        complete=True, validators=validators.validators_for(x.device, silu_op.candidates),
                        candidates={name: CandidateRecord("chosen", reason="pinned by the benchmark")},
                        tuned_at=time.time(), tuning_ms=0.0))
        silu_op.forget()
        assert silu_op.resolve(p).candidate is c
        rows = [(f"{name}.run(SiluParams(x))  (CUDA C launch, direct)", per_call_us(lambda: c.run(SiluParams(x)), x.device)),
                (f"tunekit.silu(x)  (pinned to {name})", per_call_us(lambda: tunekit.silu(x), x.device))]
    silu_op.forget()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/dispatch_overhead-<device>.md")
    args = parser.parse_args()
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    lines = [f"# Dispatch overhead ({time.strftime('%Y-%m-%d')}, torch {torch.__version__})", ""]
    for device in devices:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU host"
        rows = run(device)
        direct, public = rows[1][1], rows[4][1]
        lines += [f"## {device.type}: {name}", "", "| call | host us/call |", "|---|---:|"]
        lines += [f"| `{label}` | {us:.2f} |" for label, us in rows]
        lines += ["", f"runtime overhead of `tunekit.silu` over the chosen candidate: **{public - direct:+.2f} us** "
                  f"(over `F.silu`: {public - rows[0][1]:+.2f} us); target <= 1.5 us", "",
                  f"`tunekit.silu` (tuned, cached) against `F.silu`: **{public - rows[0][1]:+.2f} us** (issue 3 target: <= 0)", ""]
        if len(rows) > 5:
            lines += [f"`tunekit.silu` pinned to the CUDA C kernel against `F.silu`: **{rows[6][1] - rows[0][1]:+.2f} us** "
                      "(target: <= 0)", ""]
    text = "\n".join(lines)
    print(text)
    if args.save:
        tag = torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() else "cpu"
        out = Path(__file__).parent / "results" / f"dispatch_overhead-{tag}.md"
        out.write_text(text + "\n")
        print(f"saved {out}")


if __name__ == "__main__":
    main()
