"""Timing probe, not a suite: can a one-row decode GEMM (M = 1, ``out = a @ w.t()``) read the weight at the
read ceiling? The committed kernel (``kernels/cuda/gemv.cu``: a warp per row, then it ends) reads 117 MB
weights at 3.97-4.02 TB/s on an H200 where a pure read of 128 MiB reaches 4.30 (``read_ceiling-NVIDIA_H200.md``).
``gemv_stream_variants.cu`` holds persistent layouts (``a`` in shared memory, the next row's loads issued
before the current row is reduced). Per shape: cuBLAS (``F.linear``), the committed gemv candidates, every
variant at one to four resident blocks per SM, and the read kernel on the weight's bytes; each checked
against a float64 reference first; us per call (CUDA-graph replay of 40 calls over 8 rotating weights:
L2-cold), the weight's TB/s, and a 1 GiB copy's bandwidth in the same run.
``PYTHONPATH=src python benchmarks/experiments/gemv_stream_probe.py``
"""
import ctypes
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from probe_timing import ProbeModule, timed

sys.path.insert(0, "src")
from tunekit.backends import nvrtc  # noqa: E402
from tunekit.bench.measure import copy_bandwidth  # noqa: E402
from tunekit.ops.gemm.cuda_decode import decode_candidates  # noqa: E402
from tunekit.ops.gemm.params import GemmParams  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
ROTATE = 8
VARIANTS = ["gemv_persist_bf16_u4", "gemv_persist_bf16_u8", "gemv_rowblock_bf16_l2", "gemv_rowblock_bf16_l4",
            "gemv_rowblock_bf16_l8"]


class Module(ProbeModule):
    """gemv.cu with gemv_stream_variants.cu appended, launched with dynamic shared memory (``a`` staged there)."""

    def __init__(self):
        super().__init__("gemv.cu", (Path(__file__).parent / "gemv_stream_variants.cu").read_text(), "gemv_stream")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def blocks_per_sm(self, name, smem):
        """Resident 256-thread blocks per SM of ``name`` with ``smem`` bytes of dynamic shared memory (allowed
        first)."""
        d = self.driver
        limit = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        d.cuFuncSetAttribute(self.fn(name), limit, smem)
        _, blocks = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.fn(name), 256, smem)
        return blocks

    def launch_smem(self, name, grid, smem, *args):
        """``ProbeModule.launch`` with dynamic shared memory: tensors as pointers, ints as 64-bit integers."""
        c = self.ctypes
        holders = [c.c_uint64(a.data_ptr()) if torch.is_tensor(a) else c.c_int64(a) for a in args]
        array = (c.c_void_p * len(args))(*[c.addressof(h) for h in holders])
        (err,) = self.driver.cuLaunchKernel(self.fn(name), grid, 1, 1, 256, 1, 1, smem,
                                            torch.cuda.current_stream().cuda_stream, c.addressof(array), 0)
        assert int(err) == 0, (name, err)


def error(out, x, w) -> float:
    ref = x.double() @ w.double().t()
    return float(((out.double() - ref).abs() / (x.double().abs() @ w.double().abs().t())).max())


def main() -> None:
    """Per shape: cuBLAS, the read kernel, the committed gemv candidates and each variant, checked, then timed."""
    torch.manual_seed(0)
    assert nvrtc.available() is None
    mod = Module()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {mod.sms} SMs; 1 GiB copy "
          f"{copy_bandwidth(torch.device('cuda')):.0f} GB/s (read + write, the suites' measure)")
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    for N, K in SHAPES:
        xs = [torch.randn(1, K, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        ws = [torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(ROTATE)]
        outs = [torch.empty(1, N, dtype=torch.bfloat16, device="cuda") for _ in range(ROTATE)]
        params = [GemmParams(x, w.t(), o) for x, w, o in zip(xs, ws, outs)]
        nbytes = N * K * 2
        base = timed(lambda i: F.linear(xs[i % ROTATE], ws[i % ROTATE]))
        print(f"## 1x{N}x{K} bfloat16: weight {nbytes / 1e6:.1f} MB", flush=True)

        def line(label, us, err=None):
            """One printed row: time, the weight's TB/s, speed-up over cuBLAS, and the error when checked."""
            tail = "" if err is None else f"  max err / scale {err:.2e}"
            print(f"{label:36s} {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s  {base / us:.3f}x{tail}", flush=True)

        line("cublas (F.linear)", base)
        for grid_per_sm in (4, 8):
            grid = mod.sms * grid_per_sm
            def read(i, grid=grid):
                mod.launch("read_x8", grid, 256, ws[i % ROTATE], sink, nbytes // 16)
            line(f"read_x8 grid {grid}", timed(read))
        for c in decode_candidates()[:3]:
            outs[0].fill_(float("nan"))
            err = error(c.run(params[0]), xs[0], ws[0])
            line(c.name, timed(lambda i: c.run(params[i % ROTATE])), err)
        smem = K * 2
        for name in VARIANTS:
            if "rowblock" in name and K > 256 * 8 * int(name.rsplit("_l", 1)[1]):
                continue
            most = mod.blocks_per_sm(name, smem)
            for per_sm in sorted({1, 2, most} | ({4} if most >= 4 else set())):
                grid = mod.sms * per_sm
                run = (lambda i, name=name, grid=grid: mod.launch_smem(name, grid, smem, xs[i % ROTATE], ws[i % ROTATE],
                                                                      outs[i % ROTATE], N, K, K))
                outs[0].fill_(float("nan"))
                run(0)
                line(f"{name} {per_sm}/SM (max {most})", timed(run), error(outs[0], xs[0], ws[0]))


if __name__ == "__main__":
    main()
