"""cuBLASLt algorithms as ``mm`` candidates: ``cublaslt_h<rank>`` runs the algorithm cuBLASLt's
heuristic ranks ``rank``-th for the problem (``backends/cublaslt.py``: the plan, the call).

Why: torch's ``mm`` runs cuBLAS's first choice only; the heuristic's next ones (other tiles,
split-K, stream-K) are sometimes faster, and timing them is what PyTorch's TunableOp does with
hipBLASLt on ROCm (on CUDA, torch 2.11's TunableOp has no candidate but the default). The rank is
the heuristic's for the problem on this cuBLAS release: a stored choice is valid where the
validators match (torch, hence its cuBLAS).

Scope: a product of two dense 2-D operands (row- or column-major: ``x @ w.t()`` and the backward's
transposes) of one dtype on one CUDA device, into a new result or a dense row-major ``out`` that
overlaps neither, no epilogue activation, not in deterministic mode (the ranked algorithms may
reduce split-K partials in any order; torch's default is the deterministic choice there).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .params import GemmParams
from ...backends import cublaslt
from ...tunable.candidate import Candidate, hash_source
from ...tunable.params import overlaps

__all__ = ["CublasLtAlgorithm", "cublaslt_candidates"]

_SOURCES = [Path(__file__), Path(cublaslt.__file__)]
_source_text: str | None = None
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class CublasLtAlgorithm(Candidate):
    """The heuristic's algorithm ``rank`` (0: its first choice) for the params' problem."""

    def __init__(self, rank: int):
        self.rank, self.name = rank, f"cublaslt_h{rank}"

    def supports(self, p) -> str | None:
        why = self._layout_problem(p)
        if why:
            return why
        try:
            offered = cublaslt.plan_for(p.a, p.b, p.tf32).algorithms
        except RuntimeError as exc:  # a descriptor cuBLASLt refused: torch's kernel runs these params
            return str(exc)
        if self.rank >= offered:
            return f"cuBLASLt's heuristic offers {offered} algorithm(s) for this problem"
        return None

    def _layout_problem(self, p) -> str | None:
        a, b, out = p.a, p.b, p.out
        if type(p) is not GemmParams:
            return "mm only (C, alpha and beta are addmm's)"
        if a.device.type != "cuda":
            return "CUDA only"
        why = cublaslt.unavailable()
        if why:
            return why
        if a.dim() != 2 or a.dtype not in _DTYPES or b.dtype is not a.dtype or b.device != a.device:
            return "2-D float32 / float16 / bfloat16 operands of one dtype on one device only"
        if p.activation != "none":
            return "no epilogue activation"
        if p.deterministic:
            return "excluded in deterministic mode (split-K partials may be reduced in any order)"
        if 0 in (*a.shape, b.shape[1]):
            return "empty problem (the default handles M, N or K of 0)"
        if cublaslt.operand_layout(a) is None or cublaslt.operand_layout(b) is None:
            return "dense row- or column-major operands only"
        if a.data_ptr() % a.element_size() or b.data_ptr() % b.element_size():
            return "operands aligned to their element size only"
        if out is not None and (out.dtype is not a.dtype or out.device != a.device or not out.is_contiguous()
                                or out.data_ptr() % 16 or overlaps(a, out) or overlaps(b, out)):
            return "out: a dense row-major, 16-byte aligned tensor of the operands' dtype that overlaps neither"
        return None

    def run(self, p):
        a, b, out = p.a, p.b, p.out
        if out is None:
            out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        return cublaslt.matmul(cublaslt.plan_for(a, b, p.tf32), self.rank, a, b, out)

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:
            _source_text = "".join(path.read_text() for path in _SOURCES)
        return hash_source(_source_text, self.rank)


def cublaslt_candidates() -> list[CublasLtAlgorithm]:
    """One candidate per rank the plans ask the heuristic for."""
    return [CublasLtAlgorithm(rank) for rank in range(cublaslt.MAX_ALGORITHMS)]
