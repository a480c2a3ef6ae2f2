"""Answers: does a tuning session spread over calls break ``torch.compile(mode="reduce-overhead")``? Inductor's
cudagraph trees run a compiled function's first call as a warm-up whose allocations (this thread's) go to the
graphs' private pool, and then check that pool holds only the outputs they know of. A session that outlives the
warm-up call keeps tensors it made there (input copies, input sets). Compiles a small step of tunekit ops with
``mode="reduce-overhead"`` and calls it a few times under ``tuning(results=":memory:", tuning_step_ms=...)``: a
small step leaves sessions alive after the warm-up call. Prints, per step size and step kind, what each call
left alive (sessions of every op) and the exception if one was raised. GPU only.

    PYTHONPATH=src python benchmarks/experiments/cudagraph_warmup_session_probe.py
"""
from __future__ import annotations

import sys
import traceback

import torch

import tunekit
from tunekit.tunable import tuning
from tunekit.tunable.registry import get_op


def _activation_step(x, w):
    h = tunekit.silu(x @ w) + tunekit.gelu(x, approximate="tanh")
    return tunekit.logsumexp(h, -1)


def _gemm_step(x, w):
    return tunekit.silu(tunekit.mm(x, w))


def _alive() -> dict[str, int]:
    names = ("silu", "gelu", "logsumexp", "mm")
    return {n: len(get_op(n)._sessions) for n in names if get_op(n)._sessions}


def trial(step, step_ms: float, calls: int = 4) -> str:
    torch._dynamo.reset()
    x = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.float16) / 16
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    seen = []
    try:
        with tuning(results=":memory:", tuning_step_ms=step_ms):
            for _ in range(calls):
                out = compiled(x, w)
                torch.cuda.synchronize()
                seen.append(_alive())
        ok = torch.allclose(out.float(), step(x, w).float(), rtol=2e-2, atol=2e-2)
        return f"ok (matches eager: {ok}); sessions alive after each call: {seen}"
    except Exception as exc:  # the finding
        return f"raised after calls {seen}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


def main() -> int:
    for name, step in (("activations", _activation_step), ("gemm", _gemm_step)):
        for step_ms in (20.0, 0.3):
            print(f"{name:12s} tuning_step_ms={step_ms:5}: {trial(step, step_ms)}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
