"""Triton decode GEMMs turned over: ``out.t() = b.t() @ a.t()`` for M <= 16 rows of ``a`` against a weight,
through the pointer kernel (``kernels/triton/gemm.py``'s ``matmul_kernel``), as ``mm`` candidates
``triton_swapped_m<BM>_n16_k<BK>_...``.

Why: in a decode GEMM (a token, or a few, against a linear layer's weight) the weight's bytes are the time.
Laid out as usual (M tokens in a tile of 16 rows), each program streams a narrow slice of the weight;
turned over, the weight's rows fill the MMA's 32-64 rows and the tokens its 16 columns, and the weight
streams through the kernel's pipeline of shared-memory stages rather than through registers, so more of
it is in flight. H200, bfloat16, 16 x 4096 x 4096 (``benchmarks/results/gemm_decode_swapped_triton-NVIDIA_H200.txt``):
11.9-12.1 us against cuBLAS's 12.7, the CUDA C decode kernel's 13.2 and the usual Triton layout's 12.3+;
16 x 4096 x 14336 1.03x cuBLAS; at M = 1 near the one-row kernel (gemv.cu).

Scope: a 2-D ``mm`` (a bias would lie along the turned kernel's rows), M <= 16 (worth trying there only),
any strides and an activation epilogue (elementwise, so the same turned over); split-K is not among the
configurations (the reduction's launch cost more than the split gained at these sizes). Planned like the
pointer kernel (``launch_plans.py``). In a file of its own, so adding it left the other GEMM candidates'
source hashes, and the entries shipped for them, as they were (as ``triton_wrapped.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import triton_launch
from .params import GemmParams
from .triton_candidates import TritonGemm, _config
from ...tunable.candidate import hash_source

__all__ = ["TritonSwapped", "SWAPPED_CONFIGS", "swapped_candidates"]

#: (BLOCK_M rows of the weight, BLOCK_K, num_warps, num_stages); BLOCK_N = 16 tokens; best first on the H200
SWAPPED_CONFIGS = [(64, 128, 4, 8), (64, 128, 4, 4), (32, 256, 4, 6), (64, 256, 4, 4), (64, 128, 4, 6)]
_HERE = Path(__file__).resolve()
_FILES = [_HERE, _HERE.parent / "triton_launch.py", _HERE.parent / "triton_candidates.py"] + [
    _HERE.parents[2] / "kernels" / "triton" / name for name in ("gemm.py", "activations.py")]
_source_text: str | None = None


class TritonSwapped(TritonGemm):
    """The pointer kernel with ``config`` on the product turned over (see the module docstring)."""

    def __init__(self, config):
        self.kind, self.config, self.large = "swapped", config, False
        self.name = config.name("triton_swapped", BLOCK_M="m", BLOCK_N="n", BLOCK_K="k", GROUP_M="g",
                                SPLIT_K="sk", num_warps="w", num_stages="s")

    def cannot_run(self, p) -> str | None:
        if type(p) is not GemmParams or p.a.dim() != 2 or p.b.dim() != 2:
            return "swapped decode kernel: a 2-D mm only (a bias would lie along the turned kernel's rows)"
        return super().cannot_run(p)

    def not_worth(self, p) -> str | None:
        M = p.mnk[0]
        return None if M <= self.config.BLOCK_N else f"swapped decode kernel: M <= {self.config.BLOCK_N} only"

    def run(self, p, *, copy: bool = True):
        out = p.out
        if out is None:
            out = torch.empty(p.out_shape(), dtype=p.a.dtype, device=p.a.device)
        if out.numel() == 0:
            return out
        turned = GemmParams(p.b.t(), p.a.t(), out.t(), p.activation, p.tf32, p.deterministic)
        triton_launch.launch_pointer("matmul", self.config, turned, out.t())
        return out

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernel, its launcher, this class and its base: a change to any re-tunes
            _source_text = "".join(f.read_text() for f in _FILES)
        return hash_source(_source_text, self.kind, self.config)


def swapped_candidates() -> list[TritonSwapped]:
    """One candidate per entry of :data:`SWAPPED_CONFIGS` (fresh objects: each op gets its own)."""
    return [TritonSwapped(_config(bm, 16, bk, warps, stages, group=1)) for bm, bk, warps, stages in SWAPPED_CONFIGS]
