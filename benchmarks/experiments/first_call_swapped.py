"""Probe, not a suite: does a fresh process, empty caches, shipped files on, meet the swapped decode choices (16x4096x4096,
16x4096x14336 bfloat16 as F.linear) ready from the kernels bundle at its first call? The GEMM suite's first-use column read
1.78 s for 16x4096x4096 on the H100. Logs every kept-kernel lookup (the call's integer arguments and constexprs, and whether
its build was found) and how many calls and seconds until the choice is in effect.
``PYTHONPATH=src python benchmarks/experiments/first_call_swapped.py``"""
import os
import sys
import tempfile
import time

os.environ["TUNEKIT_CACHE"] = tempfile.mkdtemp()  # empty caches: only the shipped bundle can serve a build
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, "src")
import torch  # noqa: E402

import tunekit  # noqa: E402
from tunekit.backends import triton_static  # noqa: E402
from tunekit.ops.gemm import mm_op  # noqa: E402
from tunekit.tunable import context  # noqa: E402

_find, _load = triton_static.find, triton_static.load


def find(fname):
    recipe = _find(fname)
    print(f"  find {fname[:16]} -> {'hit' if recipe is not None else 'MISS'}", flush=True)
    return recipe


def load(module, name, args, kwargs, index=None):
    constants = sorted((k, v) for k, v in kwargs.items() if type(v) in (int, bool, str))
    print(f" load {module}.{name} ints={[a for a in args if type(a) is int]} kw={constants}", flush=True)
    return _load(module, name, args, kwargs, index)


def main() -> None:
    triton_static.find, triton_static.load = find, load
    for M, N, K in ((16, 4096, 4096), (16, 4096, 14336)):
        x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
        start, calls = time.perf_counter(), 0
        while True:
            tunekit.linear(x, w)
            calls += 1
            r = mm_op.decision(mm_op.make_params(x, w.t()), context.current())
            if r is not None or time.perf_counter() - start > 5:
                break
        torch.cuda.synchronize()
        print(f"{M}x{N}x{K}: decided after {calls} calls, {time.perf_counter() - start:.3f} s: "
              f"{None if r is None else (r.candidate.name, r.why)}", flush=True)


if __name__ == "__main__":
    main()
