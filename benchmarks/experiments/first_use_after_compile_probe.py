"""Answered: why did a shipped Triton choice take ~2 s to take effect after the GEMM suite's peers ran in the same
process? torch 2.11's Inductor sets TRITON_PTXAS_PATH to <torch>/bin/ptxas, which the kept builds' names counted
(``benchmarks/results/first_use_after_torch_compile-NVIDIA_H100_80GB_HBM3.txt``).
Runs up.M16's peers (argv[1]: none | tunableop | autotune | both), prints the environment variables they changed,
then qo.M16's first use with every kept-file lookup and Triton compile logged.
``PYTHONPATH=src python benchmarks/experiments/first_use_after_compile_probe.py autotune``"""
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, "benchmarks/suites")
import gemm as G  # noqa: E402
from tunekit.backends import triton_kept_files as kf, triton_static as ts  # noqa: E402


def run_peers(mode: str, p, shape, device, tmp: str) -> None:
    """What the suite runs for ``shape`` besides tunekit: TunableOp and / or max-autotune; prints what they set."""
    before, t = dict(os.environ), time.perf_counter()
    if mode in ("tunableop", "both"):
        G.tunableop(p, device, tmp, 30)
    if mode in ("autotune", "both"):
        G.autotuned(p, shape, device, False)
    print(f"[{mode}] peers {time.perf_counter() - t:.1f} s", flush=True)
    for k in sorted(set(before) | set(os.environ)):
        if before.get(k) != os.environ.get(k):
            counted = kf._counted(k, os.environ.get(k, ""))
            print(f"  env {k}: {before.get(k)!r} -> {os.environ.get(k)!r} counted={counted}")
    print("  torch ptxas", kf._torch_ptxas())


def log_lookups(start: float) -> None:
    """Print every kept-file lookup (hit or miss) and every Triton compile from here on."""
    found = kf.find

    def find(fname):
        r = found(fname)
        print(f"  find {fname[:12]} hit={r is not None} at {time.perf_counter() - start:.3f}", flush=True)
        return r
    ts.find = find
    try:
        import triton
    except ImportError:
        return
    compile_ = triton.compile

    def logged_compile(*args, **kwargs):
        t = time.perf_counter()
        out = compile_(*args, **kwargs)
        print(f"  triton.compile {time.perf_counter() - t:.3f} s", flush=True)
        return out
    triton.compile = logged_compile


def main() -> None:
    """The peers of up.M16, then qo.M16's first use (calls until its shipped choice is in effect)."""
    mode, device, tmp = sys.argv[1], torch.device("cuda"), tempfile.mkdtemp()
    shapes = {s.name: s for s in G.all_shapes()}
    up, qo = shapes["llama3-8b.up.M16"], shapes["llama3-8b.qo.M16"]
    run_peers(mode, G.example(up, torch.bfloat16, device), up, device, tmp)
    log_lookups(time.perf_counter())
    r = G.first_use(G.example(qo, torch.bfloat16, device), device, os.path.join(tmp, "fu.sqlite"), 10)
    print(f"[{mode}] qo.M16 first use: calls {r['calls']} {r['seconds']:.3f} s choice {r['choice']}", flush=True)


if __name__ == "__main__":
    main()
