"""Print the kernels torch.compile (Inductor) generates for logsumexp's backward, and time them.

Why: on an H200 Inductor's pointwise kernel for ``dy * exp(x - lse)`` reaches 88.5-89.1% of copy
on 16-bit dim 0 of 4096x4096 and dim 1 of 32x4096x128, where the library's best candidates reach
82.5-85.5% (``logsumexp-NVIDIA_H200.md``); its source shows what it does differently.
``PYTHONPATH=src python benchmarks/experiments/inductor_logsumexp_code.py OUT_DIR``: the generated kernels and their
chosen configs go to OUT_DIR, the times (same timer as the probes) to stdout."""
import glob
import os
import shutil
import sys
import tempfile

import torch

from probe_timing import timed


def backward(dy, x, lse, dim):
    return dy.unsqueeze(dim) * torch.exp(x - lse.unsqueeze(dim))


def main(out_dir: str) -> None:
    cache = tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    for shape, dim in (((4096, 4096), 0), ((32, 4096, 128), 1), ((4096, 4096), -1)):
        for dtype in (torch.float16, torch.bfloat16):
            torch._dynamo.reset()
            fn = torch.compile(lambda dy, x, lse, d=dim: backward(dy, x, lse, d), dynamic=False)
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(8)]
            lse = [torch.logsumexp(x.float(), dim).to(dtype) for x in xs]
            dy = [torch.randn_like(v) for v in lse]
            fn(dy[0], xs[0], lse[0])
            us = timed(lambda i: fn(dy[i % 8], xs[i % 8], lse[i % 8]))
            print(f"{'x'.join(map(str, shape))} dim {dim} {dtype}: {us:.2f} us")
    os.makedirs(out_dir, exist_ok=True)
    for path in glob.glob(os.path.join(cache, "**", "*"), recursive=True):
        # the pointwise kernels only (Inductor's cache also holds its wrappers and autotuning modules)
        if path.endswith(".best_config") or (path.endswith(".py") and "def triton_poi" in open(path).read()):
            shutil.copy(path, os.path.join(out_dir, os.path.basename(path)))


if __name__ == "__main__":
    main(sys.argv[1])
