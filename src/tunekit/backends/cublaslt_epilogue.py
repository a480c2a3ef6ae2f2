"""cuBLASLt's matmul with the bias, and an activation, in its epilogue: ``out = ACT(a @ b + bias)``
(``bias`` a vector of N, added to every row), each of the heuristic's ranked algorithms for it.

Why: ``torch._addmm_activation`` runs only the heuristic's first algorithm for the bias + GELU
epilogue, and ``F.linear(x, w, b)`` cuBLAS's first choice for the bias. The next ones are sometimes
faster: on an H100 (``benchmarks/experiments/cublaslt_epilogue_probe.py``) the bias + GELU epilogue
ran 4096 x 14336 x 4096 in 716 us against 794 us for ``torch._addmm_activation`` and 782 us for
addmm followed by gelu, and a bias epilogue ran 4096^3 in 197 us against 202 us for ``F.linear``
with a bias.

Built on :mod:`tunekit.backends.cublaslt` (its library, handles, workspaces, operand layouts and
plans) without changing it: the mm candidates' stored results depend on that module's source. An
epilogue plan is a plan whose descriptor also carries the epilogue, its heuristic asked again with
it. The bias pointer is an attribute of the descriptor, set before each call: a plan's calls hold
its lock from setting it to the call's return (both on the host; a CUDA graph captures the pointer
of each call).
"""

from __future__ import annotations

import ctypes
import threading

import torch

from . import cublaslt

__all__ = ["EPILOGUES", "EpiloguePlan", "plan_for", "matmul"]

#: cuBLASLt's epilogue for each activation: BIAS, RELU_BIAS, GELU_BIAS (GELU's tanh form)
EPILOGUES = {"none": 4, "relu": 6, "gelu_tanh": 36}
_DESC_EPILOGUE, _DESC_BIAS_POINTER = 7, 8


class EpiloguePlan(cublaslt.Plan):
    """A plan for ``a @ b`` whose algorithms add a bias and apply ``activation`` in the epilogue."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, tf32: bool, activation: str):
        super().__init__(a, b, tf32)
        lib = cublaslt._library()[0]
        value = ctypes.c_int32(EPILOGUES[activation])
        cublaslt._check(lib.cublasLtMatmulDescSetAttribute(self.desc, _DESC_EPILOGUE, ctypes.byref(value), 4),
                        "MatmulDescSetAttribute(EPILOGUE)")
        reduction = cublaslt._REDUCE_ANY if a.dtype is torch.float32 else cublaslt._REDUCE_IN_COMPUTE_TYPE
        alignments = {"a": cublaslt._alignment(b), "b": cublaslt._alignment(a), "c": 16, "d": 16}
        self.algorithms = self._heuristic(lib, alignments, reduction)  # ranked again, for this epilogue
        self.activation = activation
        self.lock = threading.Lock()


_plans: dict[tuple, EpiloguePlan] = {}
_lock = threading.Lock()


def plan_for(a: torch.Tensor, b: torch.Tensor, tf32: bool, activation: str) -> EpiloguePlan:
    """The epilogue plan of ``a @ b``'s problem (as :func:`cublaslt.plan_for` keys it) and
    ``activation``, made once."""
    key = (a.device, a.dtype, tf32, a.shape, b.shape[1], a.stride(), b.stride(), cublaslt._alignment(a),
           cublaslt._alignment(b), activation)
    plan = _plans.get(key)
    if plan is None:
        made = EpiloguePlan(a, b, tf32, activation)
        with _lock:
            plan = _plans.setdefault(key, made)
    return plan


def matmul(plan: EpiloguePlan, rank: int, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
           out: torch.Tensor) -> torch.Tensor:
    """``out = ACT(a @ b + bias)`` by the plan's algorithm ``rank`` on torch's current stream
    (``bias``: N contiguous elements of the operands' dtype; ``out``: dense row-major [M, N])."""
    lib = cublaslt._library()[0]
    pointer = ctypes.c_void_p(bias.data_ptr())
    with plan.lock:
        cublaslt._check(lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_BIAS_POINTER, ctypes.byref(pointer), 8),
                        "MatmulDescSetAttribute(BIAS_POINTER)")
        return cublaslt.matmul(plan, rank, a, b, out)
