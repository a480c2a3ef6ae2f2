"""Answered: why did a shipped Triton choice take ~2 s to take effect after the GEMM suite's peers ran in the same
process? torch 2.11's Inductor sets TRITON_PTXAS_PATH to <torch>/bin/ptxas, which the kept builds' names counted
(``benchmarks/results/first_use_after_torch_compile-NVIDIA_H100_80GB_HBM3.txt``).
Runs up.M16's peers (argv[1]: none | tunableop | autotune | both), prints the environment variables they changed,
then qo.M16's first use with every kept-file lookup and Triton compile logged.
``PYTHONPATH=src python benchmarks/experiments/first_use_after_compile_probe.py autotune``"""
import os, sys, tempfile, time
import torch
sys.path.insert(0, "benchmarks/suites")
import gemm as G
from tunekit.backends import triton_kept_files as kf, triton_static as ts

mode = sys.argv[1]
dev = torch.device("cuda")
shapes = {s.name: s for s in G.all_shapes()}
up, qo = shapes["llama3-8b.up.M16"], shapes["llama3-8b.qo.M16"]
tmp = tempfile.mkdtemp()
env0 = dict(os.environ)
p = G.example(up, torch.bfloat16, dev)
t = time.perf_counter()
if mode in ("tunableop", "both"):
    G.tunableop(p, dev, tmp, 30)
if mode in ("autotune", "both"):
    G.autotuned(p, up, dev, False)
print(f"[{mode}] peers {time.perf_counter() - t:.1f} s", flush=True)
env1 = dict(os.environ)
for k in sorted(set(env0) | set(env1)):
    if env0.get(k) != env1.get(k):
        print(f"  env {k}: {env0.get(k)!r} -> {env1.get(k)!r} counted={kf._counted(k, env1.get(k, ''))}")
print("  torch ptxas", kf._torch_ptxas())
orig_find, orig_compile = kf.find, None
def find(fname):
    r = orig_find(fname)
    print(f"  find {fname[:12]} hit={r is not None} at {time.perf_counter() - t0:.3f}", flush=True)
    return r
ts.find = find
try:
    import triton
    oc = triton.compile
    def comp(*a, **k):
        s = time.perf_counter(); r = oc(*a, **k)
        print(f"  triton.compile {time.perf_counter() - s:.3f} s", flush=True); return r
    triton.compile = comp
    import triton.runtime.jit as J
    if hasattr(J, "compile"): J.compile = comp
except Exception as e:
    print("  no triton patch", e)
t0 = time.perf_counter()
q = G.example(qo, torch.bfloat16, dev)
r = G.first_use(q, dev, os.path.join(tmp, "fu.sqlite"), 10)
print(f"[{mode}] qo.M16 first use: calls {r['calls']} {r['seconds']:.3f} s choice {r['choice']}", flush=True)
