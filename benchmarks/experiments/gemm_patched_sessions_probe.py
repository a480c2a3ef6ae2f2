"""Answers: why does a GEMM-patched LLaMA-style step on a freshly started machine stay undecided? Runs
the patched step (silu, gelu, gemm) for N steps (default 40) in a fresh process and prints, every ten
steps and at the end, every tuning session still under way: its calls, whether it is parked, its
budget spent and the preparations (compiles) it waits for.

    PYTHONPATH=src python benchmarks/experiments/gemm_patched_sessions_probe.py [N]   (GPU, transformers)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "suites"))
sys.path.insert(0, str(ROOT / "src"))
import model_step as ms  # noqa: E402
import tunekit  # noqa: E402
from tunekit.tunable.registry import all_ops  # noqa: E402

OPS = ["silu", "gelu", "gemm"]


def sessions() -> list[str]:
    """A line per tuning session under way (reads the ops' private session table: a debugging probe)."""
    lines = []
    for op in all_ops():
        for key, s in list(op._sessions.items()):
            pending = [n for n, f in s.preparations._futures.items() if not f.done()]
            lines.append(f"    {op.name} {key[1][:64]} calls {s.calls} parked {s.parked()} "
                         f"spent {s.budget.spent_ms():.0f} ms pending {pending[:3]}")
    return lines


def main(steps: int) -> None:
    import transformers

    tunekit.configure(results=str(Path(tempfile.mkdtemp()) / "results.sqlite"))
    device = torch.device("cuda")
    cfg = dict(ms.FULL)
    _, patched = ms.model_pair("llama", cfg, transformers, device, torch.bfloat16, OPS)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
    start = time.perf_counter()
    for i in range(steps):
        patched.zero_grad(set_to_none=True)
        with tunekit.patch(OPS):
            ms.step(patched, ids)
        torch.cuda.synchronize()
        if i % 10 == 0 or i == steps - 1:
            threads = sorted(t.name for t in threading.enumerate() if t.name != "MainThread")
            print(f"step {i} {time.perf_counter() - start:.1f} s; threads {threads}", flush=True)
            print("\n".join(sessions()) or "    no session under way", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
