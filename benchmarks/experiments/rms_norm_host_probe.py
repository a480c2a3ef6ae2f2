"""Host time of an RMSNorm call (fwd+bwd, and no-grad fwd) per path, and the LLaMA step A/B with the patch."""
import sys, time, statistics
import torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks/suites")
import transformers
from transformers.models.llama import modeling_llama as ml
import model_step as ms
import tunekit
from tunekit.ops.rms_norm import rms_norm_op, rms_norm_backward_op, RmsNormParams
from tunekit.ops.rms_norm.op import CHALLENGER_HOST_MS

dev = torch.device("cuda")
x = torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
hf = ml.LlamaRMSNorm(1024).to(dev, torch.bfloat16)
w = hf.weight
def host(f, n=300):
    for _ in range(30): f()
    best = []
    for _ in range(3):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): f()
        best.append((time.perf_counter() - t) / n * 1e6); torch.cuda.synchronize()
    return min(best)
rows = {}
rows["hf module fwd+bwd"] = host(lambda: hf(x).backward(torch.ones_like(x)))
rows["F.rms_norm fwd+bwd"] = host(lambda: F.rms_norm(x, (1024,), w, 1e-6).backward(torch.ones_like(x)))
with torch.no_grad():
    rows["F.rms_norm fwd no-grad"] = host(lambda: F.rms_norm(x, (1024,), w, 1e-6))
for floor, label in ((0.030, "torch chosen (floor 30us)"), (0.0, "triton chosen (no floor)")):
    rms_norm_op.challenger_host_ms = floor; rms_norm_op.forget(); rms_norm_backward_op.forget()
    with tunekit.tuning(results=f"/tmp/rms_host_{floor}.sqlite", tuning_step_ms=float("inf"), use_shipped=False):
        for _ in range(3): tunekit.rms_norm(x, (1024,), w, 1e-6).backward(torch.ones_like(x))
        d = rms_norm_op.decision(RmsNormParams(x, w, (1024,), 1e-6))
        rows[f"tunekit fwd+bwd, {label}: {d.candidate.name}"] = host(lambda: tunekit.rms_norm(x, (1024,), w, 1e-6).backward(torch.ones_like(x)))
        with torch.no_grad():
            rows[f"tunekit fwd no-grad, {label}"] = host(lambda: tunekit.rms_norm(x, (1024,), w, 1e-6))
rms_norm_op.challenger_host_ms = CHALLENGER_HOST_MS; rms_norm_op.forget(); rms_norm_backward_op.forget()
for k, v in rows.items():
    print(f"{k:70s} {v:8.1f} us/call")

cfg = dict(ms.FULL)
orig = ml.LlamaRMSNorm.forward
def fused_forward(self, h):
    return F.rms_norm(h, (h.shape[-1],), self.weight, self.variance_epsilon)
plain, patched = ms.model_pair("llama", cfg, transformers, dev, torch.bfloat16)
ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
def one(m, mode):
    for p in m.parameters(): p.grad = None
    torch.cuda.synchronize(); t0 = time.perf_counter()
    if mode == "patch":
        with tunekit.patch(): ms.step(m, ids)
    elif mode == "swap":
        ml.LlamaRMSNorm.forward = fused_forward
        ms.step(m, ids)
        ml.LlamaRMSNorm.forward = orig
    else:
        ms.step(m, ids)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3
variants = {"torch": (plain, "torch"), "tunekit.patch()": (patched, "patch"), "F.rms_norm swap": (plain, "swap")}
for k, v in variants.items():
    for _ in range(25): one(*v)
times = {k: [] for k in variants}
for r in range(15):
    for k, v in variants.items():
        times[k] += [one(*v) for _ in range(6)]
base = statistics.median(times["torch"])
for k, t in times.items():
    print(f"{k:18s} median {statistics.median(t):.2f} ms  min {min(t):.2f}  speedup {base/statistics.median(t):.3f}x (min {min(times['torch'])/min(t):.3f}x)")
from tunekit.tunable.registry import get_op
for name in ("rms_norm", "rms_norm_backward", "silu"):
    op = get_op(name)
    print(name, {sig[:50]: r.candidate.name for sid, d in op._decided.items() for sig, r in d.items()})
