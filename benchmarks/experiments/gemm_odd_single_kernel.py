"""Can one Triton kernel, with no copies, run 777x1555x333 (bf16, F.linear and a @ b) 1.4x faster than
cuBLAS, as max-autotune's does? Inductor's mm template differs from tunekit's pointer kernel in four
ways: sizes and strides are compile-time constants, rows past M / columns past N wrap (``rm % M``: no
M/N masks on loads), int32 indices recomputed from the K step (no int64 pointer tensors), and its
config list. This times, in one run (graph replay, L2-cold rotating inputs, medians): cuBLAS,
max-autotune's kernel, tunekit's current choice, and an Inductor-style kernel with the sizes as
constexprs ("static") or as runtime arguments ("dynamic"), over Inductor's configs; and prints
max-autotune's generated code. ``PYTHONPATH=src python benchmarks/experiments/gemm_odd_single_kernel.py``
"""
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.bench.suites.common import head_to_head
from tunekit.ops.gemm import GemmParams, mm_op
from tunekit.tunable.params import make_trial
from tunekit.tunable.screen import input_sets

#: Inductor's mm configs (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), torch 2.11 mm_configs
CONFIGS = [(32, 32, 128, 2, 4), (32, 64, 32, 5, 8), (64, 32, 32, 5, 8), (64, 32, 128, 5, 4),
           (64, 64, 32, 2, 4), (64, 64, 64, 3, 8), (64, 64, 128, 5, 4), (64, 128, 32, 3, 4),
           (64, 128, 32, 4, 8), (64, 128, 64, 3, 4), (64, 128, 128, 4, 4), (128, 64, 32, 3, 4),
           (128, 64, 32, 4, 8), (128, 128, 32, 2, 8), (128, 128, 32, 3, 4), (128, 128, 64, 3, 4),
           (128, 128, 64, 5, 8)]


@triton.jit
def _body(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
          EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    width = GROUP_M * grid_n
    group_id = pid // width
    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
    pid_m = group_id * GROUP_M + (pid % group_size)
    pid_n = (pid % width) // group_size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = rm % M
    offs_n = rn % N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_idx in range(0, tl.cdiv(K, BLOCK_K)):
        ka = offs_k[None, :] + k_idx * BLOCK_K
        kb = offs_k[:, None] + k_idx * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + ka * stride_ak)
            b = tl.load(b_ptr + kb * stride_bk + offs_n[None, :] * stride_bn)
        else:
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + ka * stride_ak, mask=ka < K, other=0.0)
            b = tl.load(b_ptr + kb * stride_bk + offs_n[None, :] * stride_bn, mask=kb < K, other=0.0)
        acc = tl.dot(a, b, acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def static_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                  stride_bn: tl.constexpr, stride_om: tl.constexpr, stride_on: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  EVEN_K: tl.constexpr):
    _body(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K)


@triton.jit
def dynamic_kernel(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                   stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    _body(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K)


def launcher(kernel, cfg):
    bm, bn, bk, stages, warps = cfg

    def run(p):
        a, b, out = p.a, p.b, p.out
        M, K = a.shape
        N = b.shape[1]
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                     out.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=K % bk == 0,
                     num_stages=stages, num_warps=warps)
        return out
    return run


def operands(M, N, K, form):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t() if form == "linear" else \
        torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    return GemmParams(a, b, torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16))


def inductor(form, out_dir):
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    fn = (lambda x, w, o: o.copy_(F.linear(x, w))) if form == "linear" else (lambda a, b, o: o.copy_(a @ b))
    args = (lambda q: (q.a, q.b.t(), q.out)) if form == "linear" else (lambda q: (q.a, q.b, q.out))
    compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False, fullgraph=True)
    return compiled, args


def main(M=777, N=1555, K=333):
    out_dir = os.environ.get("OUT", "/tmp")
    for form in ("linear", "mm"):
        p = operands(M, N, K, form)
        ref = (p.a.float() @ p.b.float())
        sets = input_sets(p, make_trial(p))
        contenders = {"cublas": (lambda q: torch.mm(q.a, q.b, out=q.out), True)}
        compiled, args = inductor(form, out_dir)
        from torch._inductor.utils import run_and_get_code
        _, code = run_and_get_code(compiled, *args(p))
        with open(os.path.join(out_dir, f"inductor_{form}_{M}x{N}x{K}.py"), "w") as f:
            f.write("\n\n".join(code))
        contenders["max_autotune"] = (lambda q, c=compiled, a=args: c(*a(q)), True)
        with torch.no_grad():
            r = mm_op.resolve(p)
        contenders[f"tunekit[{r.candidate.name}]"] = (r.candidate.run, True)
        for name, kernel in (("static", static_kernel), ("dynamic", dynamic_kernel)):
            for cfg in CONFIGS:
                run = launcher(kernel, cfg)
                try:
                    p.out.fill_(float("nan"))
                    run(p)
                    err = (p.out.float() - ref).abs().max().item()
                except Exception as exc:  # e.g. shared memory
                    print(f"{name} {cfg}: {type(exc).__name__}", file=sys.stderr)
                    continue
                if not err < 1.0:
                    print(f"{name} {cfg}: WRONG max err {err}")
                    continue
                contenders[f"{name}_m{cfg[0]}_n{cfg[1]}_k{cfg[2]}_s{cfg[3]}_w{cfg[4]}"] = (run, True)
        times = head_to_head(contenders, sets, torch.device("cuda"), 15)
        base = times["cublas"][0]
        print(f"## {form} {M}x{N}x{K} bf16, {torch.cuda.get_device_name()}")
        for n, (t, spread) in sorted(times.items(), key=lambda kv: kv[1][0]):
            print(f"{n:40s} {t * 1e3:8.2f} us  {base / t:5.2f}x cuBLAS  spread {spread:.1%}")


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:4]))
