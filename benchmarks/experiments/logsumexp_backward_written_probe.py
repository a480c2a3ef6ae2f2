"""What keeps logsumexp's 16-bit gradient at 8192x1024 (dim -1) ~4% behind torch.compile's when both write
into the caller's rotating outputs (first-use suite, H100: 13.8 against 13.2 us)? Times Inductor's kernel
compiled as ``out.copy_(dy * exp(x - lse))`` beside the shipped choice, the static Triton candidate, a copy,
and static-kernel variants (block, warps, exp vs exp2, the stores' cache hint), and prints Inductor's kernel.
``PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/logsumexp_backward_written_probe.py``"""
import re

import torch
import triton
import triton.language as tl
from torch._inductor.utils import run_and_get_code

from probe_timing import timed
from tunekit.ops.logsumexp.op import logsumexp_backward_op
from tunekit.ops.logsumexp.params import LogsumexpBackwardParams
from tunekit.tunable.params import make_trial


@triton.jit
def _variant(dy_ptr, x_ptr, lse_ptr, dx_ptr, COLS: tl.constexpr, BLOCK: tl.constexpr, EXP2: tl.constexpr,
             STORE_HINT: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = e // COLS
    x = tl.load(x_ptr + e).to(tl.float32)
    dy = tl.load(dy_ptr + row, eviction_policy="evict_last").to(tl.float32)
    lse = tl.load(lse_ptr + row, eviction_policy="evict_last").to(tl.float32)
    if EXP2:
        dx = dy * tl.exp2((x - lse) * 1.4426950408889634)
    else:
        dx = dy * tl.exp(x - lse)
    if STORE_HINT:
        tl.store(dx_ptr + e, dx.to(dx_ptr.dtype.element_ty), cache_modifier=".cs")
    else:
        tl.store(dx_ptr + e, dx.to(dx_ptr.dtype.element_ty))


def written(out, dy, x, lse):
    return out.copy_(dy.unsqueeze(-1) * torch.exp(x - lse.unsqueeze(-1)))


def main() -> None:
    for shape in ((8192, 1024), (16384, 512)):
        for dtype in (torch.float16, torch.bfloat16):
            torch._dynamo.reset()
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(8)]
            lses = [torch.logsumexp(x.float(), -1).to(dtype) for x in xs]
            dys = [torch.randn_like(v) for v in lses]
            outs = [torch.empty_like(x) for x in xs]
            fn = torch.compile(written, dynamic=False)
            _, code = run_and_get_code(fn, outs[0], dys[0], xs[0], lses[0])
            res = {"inductor": timed(lambda i: fn(outs[i % 8], dys[i % 8], xs[i % 8], lses[i % 8])),
                   "copy": timed(lambda i: outs[i % 8].copy_(xs[i % 8]))}
            trials = [make_trial(LogsumexpBackwardParams(dys[i], xs[i], lses[i], (1,))) for i in range(8)]
            for name in ("logsumexp_backward_triton_rows_b1024_w4", "logsumexp_backward_triton_static_b1024_w4",
                         "logsumexp_backward_triton_flat_b1024_w4", "fused_logsumexp_backward"):
                c = logsumexp_backward_op.candidate(name)
                res[name.replace("logsumexp_backward_", "")] = timed(lambda i: c.run(trials[i % 8]))
            n = xs[0].numel()
            for block, warps, exp2, hint in ((1024, 4, True, False), (1024, 4, False, False), (1024, 4, True, True),
                                             (512, 4, True, False), (2048, 4, True, False), (2048, 8, True, False),
                                             (4096, 8, True, False), (1024, 8, True, False), (512, 2, True, False)):
                def run(i, block=block, warps=warps, exp2=exp2, hint=hint):
                    _variant[(n // block,)](dys[i % 8], xs[i % 8], lses[i % 8], outs[i % 8], COLS=shape[1],
                                            BLOCK=block, EXP2=exp2, STORE_HINT=hint, num_warps=warps)
                run(0)
                ref = dys[0].float().unsqueeze(-1) * torch.exp(xs[0].float() - lses[0].float().unsqueeze(-1))
                torch.testing.assert_close(outs[0].float(), ref, rtol=2e-2, atol=1e-3)
                res[f"v_b{block}_w{warps}{'_exp2' if exp2 else '_exp'}{'_cs' if hint else ''}"] = timed(run)
            print(f"{shape[0]}x{shape[1]} {dtype}: " + " | ".join(f"{k} {v:.2f}" for k, v in res.items()) + " (us)",
                  flush=True)
            if shape == (8192, 1024) and dtype == torch.float16:
                src = "\n".join(code)
                kernel = re.search(r"@triton_heuristics.*?@triton.jit\ndef triton_.*?(?=\n''')", src, re.S)
                print(kernel.group(0) if kernel else src[:4000], flush=True)


if __name__ == "__main__":
    main()
