"""The GEMM family's two tunable ops and their candidates.

``mm`` (:class:`GemmParams`: mm, bmm, matmul, linear without bias, the fused linear's product, every
backward GEMM) and ``addmm`` (:class:`AddmmParams`: addmm, addmm_, baddbmm, linear with a bias).
Each: ``torch_mm`` / ``torch_addmm`` (default: torch's kernels), for addmm torch's fused epilogue
(``torch_addmm_epilogue``), for mm cuBLASLt's ranked algorithms (``cublaslt_candidates.py``: the
library torch loaded, through ctypes) and CUDA C decode kernels (``cuda_decode.py``: M <= 16), for addmm in linear's form the same with the bias and the
activation in the epilogue (``cublaslt_epilogue_candidates.py``), then the Triton configurations
(``triton_candidates.py``) and, where quack-kernels is installed, quack's Hopper kernels with the bias and
activation in their epilogue (``quack_candidates.py``: after the Triton ones, so online tuning's cap of
compiles leaves them to offline tuning), checked by the GEMM numerical check (``numerics.py``).
"""

from __future__ import annotations

import torch

from .cublaslt_candidates import cublaslt_candidates
from .cublaslt_epilogue_candidates import cublaslt_epilogue_candidates
from .cuda_decode import decode_candidates
from .launch_plans import plannable, possible as plans_possible
from .numerics import check_gemm, warm_reference
from .params import AddmmParams, GemmParams
from .quack_candidates import quack_candidates
from .torch_candidates import epilogue_support, torch_addmm, torch_addmm_epilogue, torch_mm
from .triton_candidates import triton_candidates
from .triton_padded_rows import padded_rows_candidates
from .triton_swapped import swapped_candidates
from .triton_wrapped import wrapped_candidates
from .._shared import routing
from ...tunable.registry import register
from ...tunable.shipped import uses_triton
from ...tunable.tunable_op import TunableOp

__all__ = ["mm_op", "addmm_op", "make_example", "make_addmm_example", "mnk_of", "ONLINE_PREPARATIONS",
           "CHALLENGER_HOST_MS", "PLANNED_HOST_MS", "challenger_floor", "triton_order"]

#: Triton configurations an online tuning session compiles per GEMM signature (tunable/preparations.py)
ONLINE_PREPARATIONS = 4
#: ms of device time a challenger must save over torch's kernel (tunable/session.py): what a call through
#: tunekit's general path costs the host beyond a call of torch's kernel through the C++ routes (per
#: linear on the H200 host: 22.9 against torch's 14.9 us, a routed call 17.3 against 16.9; 23.9 against
#: 15.1 in the run before; benchmarks/results/gemm_host_time-NVIDIA_H200.md and its history). With
#: no such floor, cuBLASLt algorithms 2-5% faster on 10-30 us GEMMs took a patched LLaMA-style step to
#: 0.75x (model_step-gemm_patched-NVIDIA_H200.md of 2026-11-26).
CHALLENGER_HOST_MS = 0.010


#: ms of device time a challenger whose calls are planned must save: none beyond the margin. A call
#: autograd does not record replays its launches from C++ (``launch_plans.py``) and costs the host less
#: than torch's own: per ``F.linear``-form call on the H100 host, planned 6.5-15.0 us against torch's
#: 12.5-25.9 (routed 13.6-28.4, the general path 45.7-74.1), 777x1555x333, 1x4096x4096, 64^3,
#: 512x1024x512 bfloat16 (``benchmarks/results/gemm_plan_host-NVIDIA_H100_80GB_HBM3.txt``). A call
#: autograd records keeps torch's kernels unless the challenger saves CHALLENGER_HOST_MS (``routes.verdict``).
PLANNED_HOST_MS = 0.0


def challenger_floor(p, candidate) -> float:
    """What ``candidate`` must save over torch's kernel on ``p`` (``tunable/margin_rule.floor_ms``):
    :data:`CHALLENGER_HOST_MS` where the default's call is routed to torch's function from C++ (every
    call but the fused linear's: ``linear_act`` is never routed) and for a Triton candidate anywhere
    (its launch through tunekit's Python path), but only :data:`PLANNED_HOST_MS` for a Triton
    candidate whose routed calls are planned (``launch_plans.plannable`` where plans are possible here, no
    ``out=``, alpha = beta = the int 1, as the routes take them);
    nothing for the fused linear's torch and cuBLASLt
    candidates: that call takes tunekit's general path whatever runs, and their one call costs the
    host no more than the default's two (addmm, then the activation in place): per call on the H100
    host 22.8-28.4 us for the default, 15.2-22.4 for ``_addmm_activation``, 20.7-23.7 for
    ``cublaslt_bias_h0`` (16 x 14336 x 4096 and 64^3, bfloat16 and float32). With the floor there,
    16 x 14336 x 4096 bfloat16 kept addmm + gelu tanh (44.9 us) over cuBLASLt's bias + GELU
    epilogue (43.1 us), H100."""
    if p.activation != "none":
        return CHALLENGER_HOST_MS if uses_triton(candidate) else 0.0
    routed = p.out is None and all(type(x) is int and x == 1 for x in (getattr(p, "alpha", 1), getattr(p, "beta", 1)))
    return PLANNED_HOST_MS if routed and plannable(candidate) and plans_possible(candidate) else CHALLENGER_HOST_MS


def mnk_of(shape) -> tuple[int, int, int, int | None]:
    """(M, N, K, batch) from an example shape: ``(n,)`` square, ``(M, N)`` with K = N, ``(M, N, K)``,
    ``(batch, M, N, K)``. The order is the CLI's: ``tunekit explore mm --shape 4096x14336x4096``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        return shape[0], shape[0], shape[0], None
    if len(shape) == 2:
        return shape[0], shape[1], shape[1], None
    if len(shape) == 3:
        return shape[0], shape[1], shape[2], None
    if len(shape) == 4:
        return shape[1], shape[2], shape[3], shape[0]
    raise ValueError(f"a GEMM example shape is (M, N, K) or (batch, M, N, K), got {shape}")


def _operands(shape, dtype, device, layout: str):
    """A [batch?, M, K] and B [batch?, K, N] of fresh normal values; ``layout`` "nt" gives B as a
    transposed [N, K] weight (``linear``'s ``weight.t()``)."""
    M, N, K, batch = mnk_of(shape)
    pre = () if batch is None else (batch,)
    a = torch.randn(*pre, M, K, dtype=dtype, device=device)
    b = torch.randn(*pre, N, K, dtype=dtype, device=device).mT if layout == "nt" else \
        torch.randn(*pre, K, N, dtype=dtype, device=device)
    return a, b


def make_example(shape, dtype=torch.float32, device="cpu", layout: str = "nn", activation: str = "none") -> GemmParams:
    """``mm`` params on fresh random inputs (``shape``: see :func:`mnk_of`)."""
    a, b = _operands(shape, dtype, device, layout)
    return GemmParams(a, b, activation=activation)


def make_addmm_example(shape, dtype=torch.float32, device="cpu", layout: str = "nn", activation: str = "none",
                       bias: bool = False) -> AddmmParams:
    """``addmm`` params: C [batch?, M, N] (``bias=True``: a vector of N, linear's bias)."""
    a, b = _operands(shape, dtype, device, layout)
    N = b.shape[-1]
    c = torch.randn(N if bias else (*a.shape[:-1], N), dtype=dtype, device=device)
    return AddmmParams(c, a, b, activation=activation)


def _make_params(a, b, out=None, activation: str = "none") -> GemmParams:
    return GemmParams(a, b, out, activation)


def _make_addmm_params(c, a, b, *, beta=1, alpha=1, out=None, activation: str = "none") -> AddmmParams:
    return AddmmParams(c, a, b, alpha, beta, out, activation)


mm_op = register(TunableOp("mm", GemmParams, make_params=_make_params, make_example=make_example,
                           numerics=check_gemm))
mm_op.add(torch_mm, default=True)
for _c in [*cublaslt_candidates(), *decode_candidates()]:
    mm_op.add(_c)
addmm_op = register(TunableOp("addmm", AddmmParams, make_params=_make_addmm_params, make_example=make_addmm_example,
                              numerics=check_gemm))
addmm_op.add(torch_addmm, default=True)
addmm_op.add(torch_addmm_epilogue, supports=epilogue_support)
for _c in cublaslt_epilogue_candidates():
    addmm_op.add(_c)


def triton_order(turned: bool = False) -> list:
    """Every Triton candidate, in the order online tuning compiles them (the first ONLINE_PREPARATIONS worth
    trying per signature): the TMA kind, then (``turned``: mm's) the turned-over decode kernels (M <= 16:
    ahead of the pointer kernel's decode configurations, which they beat on the H200; the CUDA decode
    kernels, earlier in mm's list, take the first preparations: at M = 1 all four), then the wrapped
    template (constant sizes first: 13.95 against 14.95 us at 777 x 1555 x 333, H100), then padded copies (the
    copy kernel's first, ``triton_padded_rows.py``) and the pointer kernels. Each kind says where it is worth
    trying (the wrapped ones below 1024^3, M > 16), so small odd problems compile the template that wins there
    (padded: 17.3 us) and larger ones the padded TMA kernel, as before."""
    base, wrapped = triton_candidates(), wrapped_candidates()
    return ([c for c in base if c.kind == "tma"] + (swapped_candidates() if turned else [])
            + [c for c in wrapped if c.kind == "wrapped_static"]
            + [c for c in wrapped if c.kind == "wrapped"] + padded_rows_candidates()
            + [c for c in base if c.kind != "tma"])


for _op in (mm_op, addmm_op):
    for _c in [*triton_order(turned=_op is mm_op), *quack_candidates()]:
        _op.add(_c)
    # Online, a signature compiles its first 4 Triton configurations worth trying (best first per shape class:
    # the winners measured on H100 / H200 lead each kind); `tunekit tune` compiles every one.
    _op.online_preparations = ONLINE_PREPARATIONS
    _op.challenger_host_ms = CHALLENGER_HOST_MS
    _op.challenger_floor = challenger_floor
    _op.warm_numerics = warm_reference  # the check's first float64 kernels: not a signature's budget
    _op.off_thread = routing.off_thread  # the screen and that warm-up on workers online: no call stalls for them
