"""Answers: does a cuBLASLt choice break ``torch.compile(mode="reduce-overhead")``? ``backends/cublaslt.py`` keeps
one 32 MiB workspace per (device, stream), made at its first use. Inductor's cudagraph trees run a compiled
function's first call as a warm-up on a stream of their own, this thread's allocations going to the graphs'
private pool, and then check that the pool holds only the outputs they know of. A workspace made there and kept
should fail that check. Compiles ``tunekit.linear`` (no bias: ``mm``; bias + gelu tanh: ``addmm``'s epilogue) with
a decider that picks a cuBLASLt candidate for every GEMM signature, calls it four times (warm-up, capture,
replays), eagerly first or not, and prints what each case raised or how far it was from a float32 reference.
GPU only.

    PYTHONPATH=src python benchmarks/experiments/cublaslt_warmup_workspace_probe.py [--old-src DIR]

``--old-src DIR``: import tunekit from ``DIR`` (``git archive <rev> src | tar -x -C DIR``) to compare.
"""
from __future__ import annotations

import sys

if "--old-src" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--old-src") + 1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tunekit  # noqa: E402
from tunekit.backends import cublaslt  # noqa: E402
from tunekit.tunable import tuning  # noqa: E402
from tunekit.tunable.registry import get_op  # noqa: E402
from tunekit.tunable.tunable_op import Resolution, use_decider  # noqa: E402

_CHOICE = {"mm": "cublaslt_h0", "addmm": "cublaslt_bias_h0"}


def _decide(op, params, settings, signature, device, device_name):
    name = _CHOICE.get(op.name)
    chosen = op.candidate(name) if name and op.candidate(name).supports(params) is None else op.default
    return Resolution(chosen, f"the probe picks {chosen.name}", signature, device_name)


def _plain(x, w, b):
    return tunekit.linear(x, w)


def _fused(x, w, b):
    return tunekit.linear_act(x, w, b, "gelu_tanh")


def _reference(step, x, w, b):
    y = x.float() @ w.float().t()
    return y if step is _plain else F.gelu(y + b.float(), approximate="tanh")


def trial(step, eager_first: bool, calls: int = 4) -> str:
    torch._dynamo.reset()
    cublaslt._workspaces.clear()
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    done = 0
    before = use_decider(_decide)
    try:
        with tuning(results=":memory:"):
            if eager_first:
                step(x, w, b)
            for done in range(1, calls + 1):
                out = compiled(x, w, b)
                torch.cuda.synchronize()
        err = (out.float() - _reference(step, x, w, b)).abs().max().item()
        return f"ok, max error vs float32 {err:.3g}; workspaces kept {len(cublaslt._workspaces)}"
    except Exception as exc:  # the finding
        return f"raised at call {done}: {type(exc).__name__}: {str(exc).splitlines()[0][:240]}"
    finally:
        use_decider(before)
        for name in _CHOICE:
            get_op(name).forget()


def main() -> int:
    print(f"tunekit from {tunekit.__file__}; {torch.cuda.get_device_name()}", flush=True)
    for name, step in (("linear", _plain), ("linear+bias+gelu_tanh", _fused)):
        for eager_first in (False, True):
            print(f"{name:22s} eager first={eager_first!s:5}: {trial(step, eager_first)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
