"""Where does a LLaMA-style training step's time go (torch vs default patch): device time by kernel, host vs wall (H200 answer: benchmarks/experiments/README.md)."""
import sys, time, statistics
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks/suites")
import transformers
import model_step as ms
import tunekit
from torch.profiler import profile, ProfilerActivity

cfg = dict(ms.FULL)
dev = torch.device("cuda")
name = sys.argv[1] if len(sys.argv) > 1 else "llama"
plain, patched = ms.model_pair(name, cfg, transformers, dev, torch.bfloat16)
ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
def run(m, n, under):
    for _ in range(n):
        for p in m.parameters(): p.grad = None
        if under:
            with tunekit.patch(): ms.step(m, ids)
        else:
            ms.step(m, ids)
for m, u in ((plain, False), (patched, True)):
    run(m, 30, u)
torch.cuda.synchronize()
for label, m, u in (("torch", plain, False), ("patched", patched, True)):
    host = []; wall = []
    for _ in range(20):
        torch.cuda.synchronize(); t0 = time.perf_counter(); run(m, 1, u); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        host.append(t1 - t0); wall.append(t2 - t0)
    print(f"{name} {label}: host {statistics.median(host)*1e3:.2f} ms, wall {statistics.median(wall)*1e3:.2f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(m, 5, u); torch.cuda.synchronize()
    ka = prof.key_averages()
    tot = sum(e.self_device_time_total for e in ka) / 5 / 1e3
    print(f"{name} {label}: device busy {tot:.2f} ms/step; kernels/step {sum(e.count for e in ka if e.self_device_time_total>0)/5:.0f}")
    rows = sorted(ka, key=lambda e: -e.self_device_time_total)[:22]
    for e in rows:
        print(f"  {e.self_device_time_total/5/1e3:7.3f} ms {e.count//5:4d}x  {e.key[:110]}")
