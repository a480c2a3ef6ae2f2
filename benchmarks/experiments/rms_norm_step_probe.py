"""Does a fused RMSNorm (torch's F.rms_norm) make the host-bound LLaMA step faster? A/B interleaved."""
import sys, time, statistics
import torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks/suites")
import transformers
from transformers.models.llama import modeling_llama as ml
import model_step as ms
import tunekit

dev = torch.device("cuda")
x = torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.ones(1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
y = F.rms_norm(x, (1024,), w, 1e-6)
print("cuda F.rms_norm grad_fn:", type(y.grad_fn).__name__)
hf = ml.LlamaRMSNorm(1024).to(dev, torch.bfloat16)
def hf_call(): hf(x).sum().backward()
def fused_call(): F.rms_norm(x, (1024,), hf.weight, 1e-6).sum().backward()
for name, f in (("hf", hf_call), ("fused", fused_call)) * 2:
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(300): f()
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"{name}: host {(t1-t)/300*1e6:.1f} us/call (fwd+sum+bwd), wall {(t2-t)/300*1e6:.1f}")
ref = hf(x); got = F.rms_norm(x, (1024,), hf.weight, 1e-6)
print("max diff hf vs fused:", (ref.float() - got.float()).abs().max().item())

cfg = dict(ms.FULL)
orig = ml.LlamaRMSNorm.forward
def fused_forward(self, h):
    return F.rms_norm(h, (h.shape[-1],), self.weight, self.variance_epsilon)
plain, patched = ms.model_pair("llama", cfg, transformers, dev, torch.bfloat16)
ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
def one(m, rms, under):
    ml.LlamaRMSNorm.forward = fused_forward if rms else orig
    for p in m.parameters(): p.grad = None
    torch.cuda.synchronize(); t0 = time.perf_counter()
    if under:
        with tunekit.patch(): ms.step(m, ids)
    else:
        ms.step(m, ids)
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    return (t2 - t0) * 1e3
variants = {"torch": (plain, False, False), "rms": (plain, True, False), "patch": (patched, False, True), "patch+rms": (patched, True, True)}
times = {k: [] for k in variants}
for k, v in variants.items():
    for _ in range(15): one(*v)
for r in range(12):
    for k, v in variants.items():
        times[k] += [one(*v) for _ in range(8)]
base = statistics.median(times["torch"])
for k, t in times.items():
    print(f"{k:10s} median {statistics.median(t):.2f} ms  min {min(t):.2f}  speedup {base/statistics.median(t):.3f}x (min-based {min(times['torch'])/min(t):.3f}x)")
ml.LlamaRMSNorm.forward = orig
