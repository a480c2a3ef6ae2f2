"""Why does Inductor's ``dy * exp(x - lse)`` beat tunekit's logsumexp gradient by ~10% at 8-16 MB rows
(16384x512, 8192x1024 float16, dim -1: 9.0 vs 10.0 us, ``first_use-NVIDIA_H200.md``)? Prints Inductor's
generated kernel and times it beside every tunekit candidate that runs the shape and a same-size copy
(``probe_timing.timed``: graph replay over 8 L2-cold input sets).
``PYTHONPATH=src:benchmarks/experiments python benchmarks/experiments/logsumexp_backward_vs_inductor.py``"""
import re

import torch
from torch._inductor.utils import run_and_get_code

from probe_timing import timed
from tunekit.ops.logsumexp.op import logsumexp_backward_op
from tunekit.ops.logsumexp.params import LogsumexpBackwardParams
from tunekit.tunable.params import make_trial


def composite(dy, x, lse):
    return dy.unsqueeze(-1) * torch.exp(x - lse.unsqueeze(-1))


def main() -> None:
    for shape in ((16384, 512), (8192, 1024), (32768, 64), (4096, 4096)):
        for dtype in (torch.float16, torch.float32):
            torch._dynamo.reset()
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(8)]
            lses = [torch.logsumexp(x.float(), -1).to(dtype) for x in xs]
            dys = [torch.randn_like(v) for v in lses]
            fn = torch.compile(composite, dynamic=False)
            _, code = run_and_get_code(fn, dys[0], xs[0], lses[0])
            kernel = re.search(r"@triton.jit\ndef triton_.*?(?=\n''')", "\n".join(code), re.S)
            line = f"{shape[0]}x{shape[1]} {dtype}: inductor {timed(lambda i: fn(dys[i % 8], xs[i % 8], lses[i % 8])):.2f}"
            outs = [torch.empty_like(x) for x in xs]
            line += f" | copy {timed(lambda i: outs[i % 8].copy_(xs[i % 8])):.2f}"
            params = [LogsumexpBackwardParams(dys[i], xs[i], lses[i], (1,)) for i in range(8)]
            trials = [make_trial(p) for p in params]
            for c in logsumexp_backward_op.candidates:
                if c.supports(params[0]) is None:
                    try:
                        line += f" | {c.name} {timed(lambda i: c.run(trials[i % 8])):.2f}"
                    except Exception as exc:  # noqa: BLE001
                        line += f" | {c.name} error {type(exc).__name__}"
            print(line + " (us)", flush=True)
            if dtype == torch.float16 and shape == (16384, 512) and kernel:
                print(kernel.group(0), flush=True)


if __name__ == "__main__":
    main()
