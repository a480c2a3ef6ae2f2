"""cuBLASLt algorithms with the bias (and the activation) in their epilogue as ``addmm`` candidates:
``cublaslt_bias_h<rank>`` runs the algorithm cuBLASLt's heuristic ranks ``rank``-th for the problem
with that epilogue (``backends/cublaslt_epilogue.py``).

Why: a linear with a bias, and the fused linear + bias + gelu tanh / relu, are addmm calls whose
defaults run cuBLAS's first choice (``torch_addmm``) or cuBLASLt's first choice with the epilogue
(``torch_addmm_epilogue``). The heuristic's other algorithms for the same epilogue are sometimes
faster (H100: bias + GELU at 4096 x 14336 x 4096 in 716 us where torch's epilogue took 794:
``benchmarks/experiments/cublaslt_epilogue_probe.py``), as its other algorithms without an epilogue
are for mm (``cublaslt_candidates.py``, whose checks of the operands these share).

Scope: linear's form of addmm: 2-D operands as the mm candidates take them, ``c`` a bias of N
contiguous elements of their dtype (16-byte aligned) broadcast over the rows, ``alpha = beta = 1``,
a new result or a dense row-major ``out`` that overlaps no input, activation none, relu or gelu tanh
(not gelu tanh in float16: cuBLASLt's float16 GELU measured 14x the error of torch's addmm + gelu,
the reason torch's own epilogue candidate refuses it), not in deterministic mode.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import cublaslt_candidates
from .cublaslt_candidates import CublasLtAlgorithm
from .params import AddmmParams, GemmParams
from .torch_candidates import torch_addmm
from ...backends import cublaslt, cublaslt_epilogue
from ...tunable.candidate import hash_source
from ...tunable.params import overlaps

__all__ = ["CublasLtEpilogue", "cublaslt_epilogue_candidates"]

_SOURCES = [Path(__file__), Path(cublaslt_candidates.__file__), Path(cublaslt.__file__),
            Path(cublaslt_epilogue.__file__)]
_source_text: str | None = None


def _product(p: AddmmParams) -> GemmParams:
    """The product ``a @ b`` of ``p`` as mm params (what the operand checks of mm's ranks read)."""
    return GemmParams(p.a, p.b, p.out, "none", p.tf32, p.deterministic)


def _unit_scalars(p: AddmmParams) -> bool:
    return type(p.alpha) in (int, float) and type(p.beta) in (int, float) and p.alpha == 1 and p.beta == 1


def _bias_problem(p: AddmmParams) -> str | None:
    """Why ``p`` is not linear's form of addmm for the epilogue (None: it is)."""
    if p.activation not in cublaslt_epilogue.EPILOGUES:
        return "cuBLASLt epilogue: activation none, relu or gelu_tanh only"
    if p.activation == "gelu_tanh" and p.a.dtype is torch.float16:
        return "cuBLASLt epilogue: its float16 GELU measured 14x the error of torch's addmm + gelu (H200)"
    if not _unit_scalars(p):
        return "alpha = beta = 1 only (linear's bias, added unscaled)"
    c = p.c
    if c.dtype is not p.a.dtype or c.device != p.a.device or c.dim() not in (1, 2) or c.stride(-1) != 1 \
            or (c.dim() == 2 and c.shape[0] != 1) or c.shape[-1] != p.b.shape[-1]:
        return "c: a bias of N contiguous elements of the operands' dtype, broadcast over the rows"
    if c.data_ptr() % 16:
        return "c: a 16-byte aligned bias"
    if p.out is not None and (p.out is c or overlaps(c, p.out)):
        return "out: not in place, and overlapping no input"
    return None


class CublasLtEpilogue(CublasLtAlgorithm):
    """The heuristic's algorithm ``rank`` for the params' problem with a bias (and activation) epilogue."""

    def __init__(self, rank: int):
        super().__init__(rank)
        self.name = f"cublaslt_bias_h{rank}"

    def supports(self, p) -> str | None:
        if type(p) is not AddmmParams:
            return "addmm only (a bias in cuBLASLt's epilogue)"
        why = self._layout_problem(_product(p)) or _bias_problem(p)
        if why:
            return why
        try:
            offered = cublaslt_epilogue.plan_for(p.a, p.b, p.tf32, p.activation).algorithms
        except RuntimeError as exc:  # a descriptor or epilogue cuBLASLt refused: the default runs these
            return str(exc)
        if self.rank >= offered:
            return f"cuBLASLt's heuristic offers {offered} algorithm(s) with this epilogue"
        return None

    def run(self, p):
        if not _unit_scalars(p):  # a choice for linear's form (alpha = beta = 1) met by a call whose scalars
            return torch_addmm(p)  # differ, in the same cache key (it holds only alpha == 0, beta == 0): torch's
        a, b, out = p.a, p.b, p.out
        if out is None:
            out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        plan = cublaslt_epilogue.plan_for(a, b, p.tf32, p.activation)
        return cublaslt_epilogue.matmul(plan, self.rank, a, b, p.c, out)

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:
            _source_text = "".join(path.read_text() for path in _SOURCES)
        return hash_source(_source_text, self.rank)


def cublaslt_epilogue_candidates() -> list[CublasLtEpilogue]:
    """One candidate per rank the epilogue plans ask the heuristic for."""
    return [CublasLtEpilogue(rank) for rank in range(cublaslt.MAX_ALGORITHMS)]
