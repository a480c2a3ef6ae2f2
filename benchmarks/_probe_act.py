import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, "src")
import tunekit
from tunekit.bench import time_callable
from tunekit.tunable.find_fastest import input_sets
from tunekit.tunable.params import make_trial
from tunekit.tunable.registry import get_op
dev = torch.device("cuda")
op = get_op("silu")
f = torch.compile(lambda x, out: out.copy_(F.silu(x)), dynamic=False)
x = torch.randn(4096, 4096, device=dev); out = torch.empty_like(x)
t0 = time.perf_counter(); f(x.view(-1), out.view(-1)); torch.cuda.synchronize(); print("first compile s", time.perf_counter() - t0)
x2 = torch.randn(2048, 2048, device=dev, dtype=torch.float16); o2 = torch.empty_like(x2)
t0 = time.perf_counter(); f(x2.view(-1), o2.view(-1)); torch.cuda.synchronize(); print("second compile s", time.perf_counter() - t0)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    f(x.view(-1), out.view(-1)); torch.cuda.synchronize()
print("compiled kernels:", [e.name for e in prof.events() if e.device_type.name == "CUDA"])
print("match", (out - F.silu(x)).abs().max().item())
for shape, dt in [((1024, 1024), torch.float32), ((1024, 1024), torch.float16), ((2048, 2048), torch.float16), ((4096, 4096), torch.float32)]:
    p = op.make_example(shape, dtype=dt, device=dev)
    sets = input_sets(p, make_trial(p))
    def cp():
        for s in sets: s.out.copy_(s.x)
    def mul():
        for s in sets: torch.mul(s.x, 1.0, out=s.out)
    res = {}
    for name, fn, g in [("copy eager", cp, False), ("copy graph", cp, True), ("mul1 graph", mul, True), ("mul1 eager", mul, False)]:
        ms, spread = time_callable(fn, dev, repeats=15, graph=g)
        res[name] = f"{2 * p.x.numel() * p.x.element_size() / (ms / len(sets) * 1e-3) / 1e9:.0f} GB/s (sp {spread:.2f})"
    print(shape, dt, len(sets), res)
