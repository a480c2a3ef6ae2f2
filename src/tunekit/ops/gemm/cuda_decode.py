"""Decode GEMMs in CUDA C: ``a @ w.t()`` for M <= 16 rows against a linear layer's weight, one pass
over the weight, as ``mm`` candidates: ``cuda_gemv_w<W>_u<U>`` (M = 1, ``kernels/cuda/gemv.cu``) and
``cuda_decode_g<G>_w<W>_u<U>`` (M <= 16, ``kernels/cuda/gemm_decode.cu``).

Why: a decode step's GEMMs read a weight of megabytes for one token, or a few; their time is those
bytes. cuBLAS reads them at 2.0 TB/s at 1 x 4096 x 4096 and 2.6-2.8 TB/s on 117 MB weights on an H100,
whose pure read reaches 2.6 TB/s at 32 MiB and 3.0 at 128 MiB
(``benchmarks/results/read_ceiling-NVIDIA_H100_80GB_HBM3.md``); the Triton decode kernels gained 7% at
best, once. Both kernels are one launch, no workspace, no atomics (deterministic):

- gemv: a warp per row of w, each load instruction 512 contiguous bytes of it, the next U loads per
  lane issued before the current ones are multiplied (fp32 FMAs), a shuffle reduction. H100: 1.07-1.23x
  cuBLAS on the three M = 1 shapes, 2.9-3.0 TB/s on the 117 MB weights (the read ceiling);
- decode: tensor-core MMAs (mma.sync m16n8k16) take up to 16 rows for the price of one; a block per
  8 x G rows of w, its W warps splitting K, the next pass of loads in registers behind each pass's MMAs,
  partial sums met in shared memory. H100: 1.08-1.09x cuBLAS at 16 x 4096 x 4096, 0.90-0.99x on the
  117 MB weights (its loads cover 8 rows per instruction; whole 128-byte lines per row, V = 2, did not
  help; a cp.async ring in shared memory was slower everywhere).

Scope: ``mm`` in linear's layout (``a`` [M, K] with unit column stride, ``b`` = ``w.t()`` with w
[N, K] of unit column stride), float16 and bfloat16, 1 <= M <= 16 (gemv: M = 1), K a multiple of 8
and at least 8, operands 16-byte aligned with row strides of multiples of 8, no activation, a new or
dense row-major ``out`` that overlaps no input. Launches through CudaKernel; calls decided for one are
planned as the Triton kernels' are (``launch_plans.py``: the launch is recorded, replayed from C++).
Measurements: ``benchmarks/results/gemm_decode_probe-NVIDIA_H100_80GB_HBM3.txt``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .params import GemmParams
from ...backends import cuda, nvrtc, triton_static
from ...backends.device import current_device
from ...tunable.candidate import Candidate, hash_source
from ...tunable.params import overlaps

__all__ = ["CudaDecode", "CudaGemv", "decode_candidates", "CONFIGS", "GEMV_CONFIGS", "MAX_M"]

#: (G, W, U) of the kernels gemm_decode.cu instantiates: 1.08-1.09x cuBLAS at 16 x 4096 x 4096, H100
#: (``benchmarks/results/gemm_decode_probe-*``; their other configurations were never the best)
CONFIGS = [(1, 4, 4), (2, 8, 2)]
#: (W, U) of gemv.cu's kernels (M = 1)
GEMV_CONFIGS = [(2, 8), (4, 8), (8, 4)]
#: rows of ``a`` the MMA's 16 rows hold
MAX_M = 16
_SUFFIX = {torch.float16: "f16", torch.bfloat16: "bf16"}
_source_text: str | None = None


def _aligned(t: torch.Tensor) -> bool:
    """Rows of 16-byte vectors: a 16-byte aligned base and a row stride of whole vectors."""
    return t.data_ptr() % 16 == 0 and (t.shape[0] == 1 or t.stride(0) % 8 == 0)


class CudaDecode(Candidate):
    """``gemm_decode_<dtype>_g<G>_w<W>_u<U>`` of gemm_decode.cu (see the module docstring)."""

    def __init__(self, groups: int, warps: int, unroll: int):
        self.groups, self.warps, self.unroll = groups, warps, unroll
        form = f"g{groups}_w{warps}_u{unroll}"
        self.name = f"cuda_decode_{form}"
        self.kernels = {dtype: cuda.kernel("gemm_decode.cu", f"gemm_decode_{sfx}_{form}") for dtype, sfx in _SUFFIX.items()}

    def supports(self, p) -> str | None:
        if type(p) is not GemmParams:
            return "mm only (a product without C)"
        a, b, out = p.a, p.b, p.out
        M, N, K = p.mnk
        if a.dtype not in _SUFFIX or b.dtype is not a.dtype or (out is not None and out.dtype is not a.dtype):
            return "float16 or bfloat16 operands of one dtype only"
        if a.dim() != 2 or b.dim() != 2 or b.device != a.device or (out is not None and out.device != a.device):
            return "2-D operands and out on one device only"
        if out is not None and tuple(out.shape) != (M, N):
            return "out: the product's shape"
        if p.activation != "none":
            return "no epilogue: activation none only"
        if not 1 <= M <= MAX_M or N == 0:
            return f"decode: 1 <= M <= {MAX_M} rows and N >= 1 only"
        if K < 8 or K % 8:
            return "K a multiple of 8 (16-byte loads), at least 8"
        if a.stride(1) != 1 or b.stride(0) != 1:
            return "linear's layout only: a with unit column stride, b = w.t() with w of unit column stride"
        if a.device.type != "cuda":  # before the pointers are read (meta and fake tensors have none)
            return "needs a CUDA device"
        if not (_aligned(a) and _aligned(b.t())):
            return "16-byte aligned operands with row strides of whole 16-byte vectors"
        if out is not None and (not out.is_contiguous() or overlaps(a, out) or overlaps(b, out)):
            return "out: dense row-major, overlapping no input"
        return nvrtc.available()

    def launch_shape(self, p, out) -> tuple[int, int, tuple]:
        """(grid, block, arguments) of the kernel's launch on ``p`` into ``out``."""
        M, N, K = p.mnk
        return -(-N // (8 * self.groups)), 32 * self.warps, (p.a, p.b, out, M, N, K, p.a.stride(0), p.b.stride(1), N)

    def run(self, p):
        a = p.a
        out = p.out if p.out is not None else torch.empty(p.out_shape(), dtype=a.dtype, device=a.device)
        kernel, index = self.kernels[a.dtype], a.get_device()
        grid, block, args = self.launch_shape(p, out)
        if triton_static.is_recording():  # a plan records the launch (launch_plans.py)
            triton_static.record_launch(kernel.address(index), grid, block, args)
        else:
            kernel.launch(index, grid, block, *args)
        return out

    def prepare(self, p) -> None:
        """Compile and load the kernel on ``p``'s device (tuning calls it on a worker thread)."""
        self.kernels[p.a.dtype].address(p.a.get_device() if p.a.is_cuda else current_device())
        cuda.direct_launch()

    def source_hash(self) -> str:
        """This module's text (its checks and constants decide what runs) and the kernel's file."""
        global _source_text
        if _source_text is None:
            _source_text = Path(__file__).read_text()
        return hash_source(_source_text, self.kernels[torch.bfloat16].source_hash(), self.name)


class CudaGemv(CudaDecode):
    """``gemv_<dtype>_w<W>_u<U>`` of gemv.cu: M = 1, a warp per row of the weight reading 512 contiguous
    bytes per load instruction, fp32 FMAs (the MMA form reads 64 bytes of each of 8 rows per instruction)."""

    def __init__(self, warps: int, unroll: int):
        self.groups, self.warps, self.unroll = 1, warps, unroll
        self.name = f"cuda_gemv_w{warps}_u{unroll}"
        self.kernels = {dtype: cuda.kernel("gemv.cu", f"gemv_{sfx}_w{warps}_u{unroll}") for dtype, sfx in _SUFFIX.items()}

    def supports(self, p) -> str | None:
        if type(p) is GemmParams and p.mnk[0] != 1:
            return "one row of a (M = 1) only"
        return super().supports(p)

    def launch_shape(self, p, out) -> tuple[int, int, tuple]:
        _, N, K = p.mnk
        return -(-N // self.warps), 32 * self.warps, (p.a, p.b, out, N, K, p.b.stride(1))


def decode_candidates() -> list[CudaDecode]:
    """One candidate per entry of :data:`GEMV_CONFIGS` and :data:`CONFIGS`, the one-row kernels first (online
    tuning compiles the first few worth trying: at M = 1 those); fresh objects: each op gets its own."""
    return [CudaGemv(*c) for c in GEMV_CONFIGS] + [CudaDecode(*c) for c in CONFIGS]
