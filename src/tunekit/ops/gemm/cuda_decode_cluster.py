"""Decode GEMMs split over K by a thread block cluster (``kernels/cuda/gemm_decode_cluster.cu``): ``a @ w.t()``
for M <= 16 rows against a linear layer's weight, as ``mm`` candidates ``cuda_decode_cluster_g<G>_w<W>_u<U>_s<S>``.

Why, beside ``cuda_decode.py``'s kernels: its MMA form reads all of ``a`` once per block of 8 G rows (twice
the weight's bytes at M = 16) and holds a's fragments of two passes in registers, which caps the weight's
bytes in flight; on an H200 it ran 1.00x cuBLAS at 16 x 4096 x 4096, where a pure read of those bytes
leaves 1.3x (``benchmarks/results/read_ceiling-NVIDIA_H200.md``). Here a cluster of S blocks owns 8 G W
rows and splits K; each block copies its slice of ``a`` into shared memory once and its warps hold only
the weight in registers; the partial sums meet through distributed shared memory in rank order (one
launch, no workspace, no atomics: deterministic). Scope and refusals are the MMA form's, on sm_90 and
later (clusters).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .cuda_decode import _SUFFIX, CudaDecode
from ...backends import cuda
from ...tunable.candidate import hash_source

__all__ = ["CudaDecodeCluster", "cluster_candidates", "CLUSTER_CONFIGS"]

#: (form, G, W, S, KC) of the kernels gemm_decode_cluster.cu instantiates: W warps of 8 G rows each, S blocks
#: of a cluster splitting K, KC the most k of a chunk of ``a`` staged in shared memory; "rows" forms read each
#: row of w 512 contiguous bytes per load instruction (the others 64 bytes of each of 8 rows)
CLUSTER_CONFIGS = [("g2_w4_u4_s4", 2, 4, 4, 1024), ("g2_w8_u4_s4", 2, 8, 4, 1024), ("rows_g1_w4_s2", 1, 4, 2, 512),
                   ("rows_g1_w4_s4", 1, 4, 4, 512), ("rows_g1_w4_s8", 1, 4, 8, 512), ("rows_g1_w2_s4", 1, 2, 4, 512),
                   ("rows_g1_w8_s4", 1, 8, 4, 256), ("plainrows_w4", 1 / 4, 4, 1, 1024),
                   ("plainrows_w2", 1 / 2, 2, 1, 1024), ("plainrows_w8", 1 / 8, 8, 1, 1024),
                   ("swap_g1_w4_u4", 2 / 4, 4, 1, 1024), ("swap_g1_w4_u2", 2 / 4, 4, 1, 1024),
                   ("swap_g2_w4_u2", 4 / 4, 4, 1, 1024), ("swap_g1_w8_u4", 2 / 8, 8, 1, 1024),
                   ("swap_g1_w2_u4", 2 / 2, 2, 1, 1024)]
_source_text: str | None = None


class CudaDecodeCluster(CudaDecode):
    """``gemm_decode_cluster_<dtype>_<form>`` of gemm_decode_cluster.cu (see the module docstring)."""

    def __init__(self, form: str, groups: int, warps: int, cluster: int, most_k: int):
        self.groups, self.warps, self.cluster, self.most_k = groups, warps, cluster, most_k
        self.name = f"cuda_decode_cluster_{form}"
        self.kernels = {dtype: cuda.kernel("gemm_decode_cluster.cu", f"gemm_decode_cluster_{sfx}_{form}")
                        for dtype, sfx in _SUFFIX.items()}

    def supports(self, p) -> str | None:
        why = super().supports(p)
        if why is None and torch.cuda.get_device_capability(p.a.device) < (9, 0):
            return "thread block clusters: sm_90 and later only"
        return why

    def chunk(self, K: int) -> int:
        """k of a chunk: the fewest chunks per block that fit the staged size, cut evenly (a multiple of 32)."""
        per_block = -(-K // (self.cluster * self.most_k))
        return min(self.most_k, -(-K // (self.cluster * per_block * 32)) * 32)

    def launch_shape(self, p, out) -> tuple[int, int, tuple]:
        """(grid, block, arguments): S consecutive blocks per 8 G W rows of w (a cluster)."""
        M, N, K = p.mnk
        grid = -(-N // round(8 * self.groups * self.warps)) * self.cluster
        return grid, 32 * self.warps, (p.a, p.b, out, M, N, K, p.a.stride(0), p.b.stride(1), N, self.chunk(K))

    def source_hash(self) -> str:
        """This module's text, the MMA form's checks (its module) and the kernel's file."""
        global _source_text
        if _source_text is None:
            _source_text = Path(__file__).read_text()
        return hash_source(_source_text, super().source_hash(), self.kernels[torch.bfloat16].source_hash())


def cluster_candidates() -> list[CudaDecodeCluster]:
    """One candidate per entry of :data:`CLUSTER_CONFIGS`; fresh objects: each op gets its own."""
    return [CudaDecodeCluster(*c) for c in CLUSTER_CONFIGS]
