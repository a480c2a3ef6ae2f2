"""The padded-copy strategy with a copy kernel of its own: ``mm`` / ``addmm`` candidates
``triton_padrows_m<BM>_n<BN>_...``, the TMA kernel after a Triton kernel (``kernels/triton/pad_rows.py``) copies
each operand TMA cannot read into a buffer with 16-byte aligned rows.

Why: the ``padded`` kind (``triton_candidates.py``) copies with torch's ``copy_``, which ran at ~1.55 TB/s into the
padded buffer: at ``a @ b`` 4097 x 4095 x 4096 bf16 (b's rows 8190 bytes) its copy took 43.2 us beside the TMA
kernel's 201 us, where a contiguous copy of that size takes 24.1 us (H100,
``benchmarks/results/gemm_mm_odd_breakdown-NVIDIA_H100_80GB_HBM3.txt``). Everything else is the padded kind's:
what it can run and where it is worth trying, the TMA kernel and its launcher, out through pointer stores where
TMA cannot store it. An operand with no unit stride in either dimension (a sliced view) is copied by torch, as
there.

In a file of its own, so adding it left the other GEMM candidates' source hashes, and the entries shipped for
them, as they were (as ``triton_swapped.py``); mm and addmm list it before the padded kind, so online tuning of an
unaligned problem compiles it first.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import triton_launch
from .triton_candidates import CONFIGS, TritonGemm
from .triton_launch import tma_readable
from ...backends import triton as triton_backend
from ...tunable.candidate import hash_source

__all__ = ["TritonPaddedRows", "padded_rows_candidates", "padded_rows_copy"]

#: the copy's tile: 16 rows of 256 elements (8 KB of bf16) per program, 4 warps (24.8 us at 4096 x 4095 bf16, H100;
#: 8x512, 4x1024, 32x256 w8 within 0.4 us: ``benchmarks/results/pad_rows_variants-NVIDIA_H100_80GB_HBM3.txt``)
BLOCK_R, BLOCK_C, WARPS = 16, 256, 4
#: padded rows' length, a multiple of 16 elements: Triton then sees it divisible by 16 and vectorizes the stores
ROW_UNIT = 16
_HERE = Path(__file__).resolve()
_FILES = [_HERE, _HERE.parent / "triton_launch.py", _HERE.parent / "triton_candidates.py"] + [
    _HERE.parents[2] / "kernels" / "triton" / name for name in ("pad_rows.py", "gemm_tma.py", "gemm.py",
                                                                 "activations.py")]
_source_text: str | None = None
_kernel = None


def padded_rows_copy(t: torch.Tensor, *, copy: bool = True) -> torch.Tensor:
    """``t`` in a buffer whose rows are padded to a multiple of :data:`ROW_UNIT` elements (what
    ``triton_launch.tma_readable`` accepts), of the same major order, a broadcast batch materialized; copied by
    ``pad_rows_kernel``, or by torch for an operand with no unit stride (a sliced view). ``copy=False`` (a
    preparation, inside ``triton_backend.warming``): the buffer, and the kernel's launch, which there only compiles;
    torch copies nothing."""
    col = t.stride(-1) != 1 and t.stride(-2) == 1
    src = t.mT if col else t
    *lead, rows, cols = src.shape
    padded = -(-max(cols, 1) // ROW_UNIT) * ROW_UNIT
    buf = torch.empty(*lead, rows, padded, dtype=t.dtype, device=t.device)
    view = buf[..., :cols]
    if src.stride(-1) != 1 and cols > 1:
        if copy:
            view.copy_(src)
    elif src.numel():
        global _kernel
        if _kernel is None:
            _kernel = triton_backend.kernel("pad_rows", "pad_rows_kernel")
        batch = lead[0] if lead else 1
        grid = (batch * -(-rows // BLOCK_R) * -(-padded // BLOCK_C),)
        sb, db = (src.stride(0), buf.stride(0)) if lead else (0, 0)
        with triton_backend.on_device(t.device):
            triton_launch._launch(_kernel, grid, src, buf, rows, cols, padded, sb, src.stride(-2), db, buf.stride(-2),
                                  BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=WARPS)
    return view.mT if col else view


class TritonPaddedRows(TritonGemm):
    """The TMA kernel with ``config`` after :func:`padded_rows_copy` of the operands it cannot read."""

    def __init__(self, config):
        self.kind, self.config, self.large = "padded", config, True
        self.name = config.name("triton_padrows", BLOCK_M="m", BLOCK_N="n", BLOCK_K="k", GROUP_M="g",
                                SPLIT_K="sk", num_warps="w", num_stages="s")

    def run(self, p, *, copy: bool = True):
        """``copy=False`` (a preparation): compile the copy kernel and the TMA kernel (inside ``warming`` the
        launches only compile), the operands' values unread."""
        out = p.out
        if out is None:
            out = torch.empty(p.out_shape(), dtype=p.a.dtype, device=p.a.device)
        if out.numel() == 0:
            return out
        a = p.a if tma_readable(p.a) else padded_rows_copy(p.a, copy=copy)
        b = p.b if tma_readable(p.b) else padded_rows_copy(p.b, copy=copy)
        triton_launch.launch_tma(self.config, p, out, a, b)
        return out

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernels, their launcher, this class and its base: a change to any re-tunes
            _source_text = "".join(f.read_text() for f in _FILES)
        return hash_source(_source_text, "padrows", self.config)


def padded_rows_candidates() -> list[TritonPaddedRows]:
    """The padded kind's configurations (fresh objects: each op gets its own)."""
    return [TritonPaddedRows(config) for kind, config, _ in CONFIGS if kind == "padded"]
