"""Answers: which copy of an operand with unaligned rows (b = 4096 x 4095 bf16, rows of 8190 bytes) into a buffer with
16-byte aligned rows runs nearest a contiguous copy of its size? torch's strided ``copy_`` (``aligned_copy``), Triton
2-D tile kernels (loads element-sized; stores masked to the source's columns, or over the whole padded row and so
vectorized), and Inductor's own kernel for ``F.pad(b, (0, 1))`` (the pad its ``pad_mm`` pass puts before an unaligned
mm). CUDA-graph replay, medians; bit-exact check of every variant.

Run: ``PYTHONPATH=src python benchmarks/experiments/pad_rows_variants.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.bench.measure import time_callable
from tunekit.ops.gemm import triton_launch


@triton.jit
def _pad2d(src, dst, rows, cols, dst_cols, sr, dr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
           STORE_WHOLE_ROW: tl.constexpr):
    pid = tl.program_id(0)
    tiles_c = tl.cdiv(dst_cols, BLOCK_C)
    r = ((pid // tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = (pid % tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    rows_ok = r[:, None] < rows
    x = tl.load(src + r[:, None] * sr + c[None, :], mask=rows_ok & (c[None, :] < cols), other=0)
    if STORE_WHOLE_ROW:
        tl.store(dst + r[:, None] * dr + c[None, :], x, mask=rows_ok & (c[None, :] < dst_cols))
    else:
        tl.store(dst + r[:, None] * dr + c[None, :], x, mask=rows_ok & (c[None, :] < cols))


def triton_pad(b, block_r, block_c, warps, whole):
    rows, cols = b.shape
    buf = torch.empty(rows, (cols + 7) // 8 * 8, dtype=b.dtype, device=b.device)
    dcols = buf.shape[1]
    grid = (triton.cdiv(rows, block_r) * triton.cdiv(dcols if whole else cols, block_c),)
    _pad2d[grid](b, buf, rows, cols, dcols if whole else cols, b.stride(0), buf.stride(0), BLOCK_R=block_r,
                 BLOCK_C=block_c, STORE_WHOLE_ROW=whole, num_warps=warps)
    return buf[:, :cols]


def main() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    b = torch.randn(4096, 4095, device=dev, dtype=dt)
    src, dst = torch.randn(b.numel(), device=dev, dtype=dt), torch.empty(b.numel(), device=dev, dtype=dt)
    inductor_pad = torch.compile(lambda t: F.pad(t, (0, 1)), dynamic=False)
    rows = {"contiguous copy of b's size": lambda: dst.copy_(src),
            "torch copy_ into the padded buffer (aligned_copy)": lambda: triton_launch.aligned_copy(b),
            "Inductor F.pad(b, (0, 1))": lambda: inductor_pad(b)}
    for whole in (False, True):
        for block_r, block_c, warps in ((16, 256, 4), (32, 256, 8), (8, 512, 4), (4, 1024, 4), (64, 64, 4)):
            name = f"triton 2-D {block_r}x{block_c} w{warps} store {'whole padded row' if whole else 'masked to cols'}"
            rows[name] = lambda br=block_r, bc=block_c, w=warps, wh=whole: triton_pad(b, br, bc, w, wh)
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}, "
          f"bf16 {tuple(b.shape)} -> rows padded to 4096")
    for name, fn in rows.items():
        got = fn()
        same = "" if name.startswith("contiguous") else (
            "exact" if torch.equal(got[:, :4095].contiguous().view(torch.int16), b.view(torch.int16)) else "WRONG")
        med, spread = time_callable(fn, dev, repeats=15)
        print(f"{name:62s} {med * 1e3:7.1f} us (spread {spread:.1%}) {same}")


if __name__ == "__main__":
    main()
