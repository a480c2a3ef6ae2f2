"""Odd GEMM shapes: cuBLAS into a padded-stride output (+ K padding) then a copy, vs cuBLAS direct."""
import torch, sys
sys.path.insert(0, "src")
from tunekit.bench.measure import time_callable
dev = torch.device("cuda")
def up(n): return (n + 7) // 8 * 8
for M, N, K in ((4097, 4095, 4096), (777, 1555, 333), (2048, 4095, 4096), (2048, 4096, 4095), (4096, 50257, 768), (4096, 4096, 4096)):
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16); w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    Np, Kp = up(N), up(K)
    out_pad = torch.empty(M, Np, device=dev, dtype=torch.bfloat16)
    xp = torch.zeros(M, Kp, device=dev, dtype=torch.bfloat16); wp = torch.zeros(N, Kp, device=dev, dtype=torch.bfloat16)
    def direct(): return torch.mm(x, w.t())
    def padded():
        if Kp != K:
            xp[:, :K].copy_(x); wp[:, :K].copy_(w); a, b = xp, wp
        else:
            a, b = x, w
        torch.mm(a, b.t(), out=out_pad[:, :N])
        return out_pad[:, :N].contiguous()
    def gemm_only(): torch.mm(xp if Kp != K else x, (wp if Kp != K else w).t(), out=out_pad[:, :N])
    def copy_only(): return out_pad[:, :N].contiguous()
    ref = direct(); got = padded()
    err = (ref.float() - got.float()).abs().max().item()
    t = {k: time_callable(f, dev)[0] * 1e3 for k, f in (("direct", direct), ("padded", padded), ("gemm_only", gemm_only), ("copy_only", copy_only))}
    print(f"{M}x{N}x{K}: " + " ".join(f"{k} {v:.1f}us" for k, v in t.items()) + f"  speedup {t['direct']/t['padded']:.2f}x maxdiff {err:.3g}")
