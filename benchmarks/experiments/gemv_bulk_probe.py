"""Timing probe, not a suite: does a one-row decode GEMM (M = 1, ``out = a @ w.t()``) reach the read ceiling when the
bulk copy engine brings the weight into shared memory? gemv.cu (a warp per row, loads into registers) reads 117 MB
weights at 3.92-3.98 TB/s on an H200 where a plain read kernel reaches 4.24-4.30 (``gemv_stream_probe-NVIDIA_H200.txt``;
persistent register layouts were slower still). ``gemv_bulk_variants.cu``: per warp a ring of shared-memory slots filled
by ``cp.async.bulk`` (S - 1 pieces in flight), the lanes multiplying from shared memory; and the same rings with
nothing computed (the engine's read ceiling). Per shape: cuBLAS (``F.linear``), gemv.cu's first candidate, read_x8
(``gemv_stream_variants.cu``), then each bulk form at 1, 2 and the most resident blocks per SM, each checked against a
float64 reference first (output filled with NaN); us per call (CUDA-graph replay of 40 calls over 8 rotating weights:
L2-cold), the weight's TB/s, and a 1 GiB copy's bandwidth in the same run.
``PYTHONPATH=src python benchmarks/experiments/gemv_bulk_probe.py``
"""
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

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
ROTATE = 8
FORMS = [(4, 4, 4096), (4, 8, 2048), (8, 4, 2048), (8, 3, 4096), (2, 8, 4096), (4, 6, 8192)]  # (W, S, P)
HERE = Path(__file__).parent


class Module(ProbeModule):
    """gemv.cu with gemv_stream_variants.cu (read_x8) and gemv_bulk_variants.cu appended."""

    def __init__(self):
        extra = (HERE / "gemv_stream_variants.cu").read_text() + (HERE / "gemv_bulk_variants.cu").read_text()
        super().__init__("gemv.cu", extra, "gemv_bulk")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def blocks_per_sm(self, name, block, smem):
        """Resident blocks per SM of ``name`` with ``smem`` bytes of dynamic shared memory (allowed first)."""
        d = self.driver
        d.cuFuncSetAttribute(self.fn(name), d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             smem)
        _, blocks = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.fn(name), block, smem)
        return blocks

    def launch_smem(self, name, grid, block, smem, *args):
        """``ProbeModule.launch`` with dynamic shared memory: tensors as pointers, ints as 64-bit integers."""
        c = self.ctypes
        holders = [c.c_uint64(a.data_ptr()) if torch.is_tensor(a) else c.c_int64(a) for a in args]
        array = (c.c_void_p * len(args))(*[c.addressof(h) for h in holders])
        (err,) = self.driver.cuLaunchKernel(self.fn(name), grid, 1, 1, block, 1, 1, smem,
                                            torch.cuda.current_stream().cuda_stream, c.addressof(array), 0)
        assert int(err) == 0, (name, err)


def error(out, x, w) -> float:
    """Largest |out - ref| over sum |x||w| of a row (NaN where out was never written)."""
    ref = x.double() @ w.double().t()
    return float(((out.double() - ref).abs() / (x.double().abs() @ w.double().abs().t())).max())


def bulk_rows(mod, line, N, K, xs, ws, outs, sink):
    """Each bulk form, gemv and read, at 1, 2 and the most resident blocks per SM."""
    for W, S, P in FORMS:
        block = 32 * W
        for kind in ("gemv", "read"):
            name = f"gemv_bulk_bf16_w{W}_s{S}_p{P}" if kind == "gemv" else f"bulk_read_w{W}_s{S}_p{P}"
            smem = (W * S * 8 + 127) // 128 * 128 + W * S * P + (2 * K if kind == "gemv" else 0)
            most = mod.blocks_per_sm(name, block, smem)
            for per_sm in sorted({1, 2, most} & set(range(1, most + 1))):
                grid = mod.sms * per_sm
                if kind == "gemv":
                    def run(i, name=name, grid=grid, block=block, smem=smem):
                        mod.launch_smem(name, grid, block, smem, xs[i % ROTATE], ws[i % ROTATE], outs[i % ROTATE],
                                        N, K, K)
                    outs[0].fill_(float("nan"))
                    run(0)
                    err = error(outs[0], xs[0], ws[0])
                else:
                    def run(i, name=name, grid=grid, block=block, smem=smem):
                        mod.launch_smem(name, grid, block, smem, ws[i % ROTATE], sink, N, K, K)
                    err = None
                line(f"{name} {per_sm}/SM (max {most})", timed(run), err)


def main() -> None:
    """Per shape: cuBLAS, gemv.cu, read_x8, then every bulk form, checked, then timed."""
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
            print(f"{label:38s} {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s  {base / us:.3f}x{tail}", flush=True)

        line("cublas (F.linear)", base)
        grid = mod.sms * 8
        line(f"read_x8 grid {grid}", timed(lambda i: mod.launch("read_x8", grid, 256, ws[i % ROTATE], sink,
                                                                nbytes // 16)))
        c = decode_candidates()[0]
        outs[0].fill_(float("nan"))
        err = error(c.run(params[0]), xs[0], ws[0])
        line(c.name, timed(lambda i: c.run(params[i % ROTATE])), err)
        bulk_rows(mod, line, N, K, xs, ws, outs, sink)


if __name__ == "__main__":
    main()
