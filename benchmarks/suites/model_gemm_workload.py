"""The GEMM signatures of the LLaMA-style model step (``model_step.py``): what offline tuning of a
real model's matrix products has to do (issue 23: on 2 GPUs in at most 0.55x the time on one).

One forward + backward step of the LLaMA-style model under ``tunekit.patch(["gemm"])`` with tuning
off and ``record_untuned`` on, into the results file given: every ``F.linear`` / ``nn.Linear`` of the
step (projections, MLP, LM head; their backward products) meets its signature once and is recorded.
Used by ``multi_gpu_tune.py --workload llama-gemm``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from model_step import DTYPES, FULL, SMOKE, build, step  # noqa: E402
from tunekit.tunable import results_store  # noqa: E402
from tunekit.tunable.stores import close_all  # noqa: E402

#: the GEMM family's ops (tunekit/ops/gemm): what a GEMM-patched step records
GEMM_OPS = ("mm", "addmm")


def record(path: str, device: torch.device, smoke: bool = False) -> list[tuple[str, str, str]]:
    """Record the step's GEMM signatures into ``path``; the recorded (op, signature, device) keys.
    Settings go process-wide for the step (autograd runs CUDA backward ops on its own thread) and
    are put back after it."""
    import transformers

    cfg = dict(SMOKE if smoke else FULL)
    torch.manual_seed(0)
    before = tunekit.settings()
    with tunekit.patch(["gemm"]):
        model = build("llama", cfg, transformers).to(device=device, dtype=DTYPES[cfg["dtype"]])
        ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)
        tunekit.configure(results=path, tuning=False, record_untuned=True)
        try:
            step(model, ids)
        finally:
            tunekit.configure(results=before.results, tuning=before.tuning, record_untuned=before.record_untuned)
    if device.type == "cuda":
        torch.cuda.synchronize()
        del model
        torch.cuda.empty_cache()
    keys = [(r.op, r.signature, r.device) for r in results_store(path).untuned() if r.op in GEMM_OPS]
    close_all()
    return keys
