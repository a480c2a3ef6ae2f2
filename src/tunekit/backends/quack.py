"""quack's Hopper GEMM kernels (``quack-kernels``: CuTe DSL, Tri Dao) with their fused epilogues: plans
(compiled without a launch) and calls, for tunekit's GEMM candidates (``ops/gemm/quack_candidates.py``).

Why: a linear + bias + gelu tanh runs cuBLASLt's bias + GELU algorithms at 1.03-1.05x the time of its
plain ones on an H100, Triton's epilogues at 1.13x: the activation's arithmetic follows each tile's
main loop. quack's ping-pong kernels give each SM two consumer warp groups whose epilogues overlap
the other's main loop; its bias + gelu tanh cost 0.5% over its own plain GEMM at 8192^3 and
4096 x 4096 x 14336, whose plain GEMM was within 2% of cuBLAS there (H100,
``benchmarks/results/quack_gemm_probe-NVIDIA_H100_80GB_HBM3.txt``).

Optional: ``pip install quack-kernels`` (it brings ``nvidia-cutlass-dsl``); without it, or off
compute capability 9.0 (its SM90 kernels), :func:`unavailable` says why and nothing here imports it.
Importing quack takes seconds (the CuTe DSL's MLIR), and a kernel's first compile 2-4 s (cached on
disk by quack, per its version), so plans are made by a candidate's ``prepare`` on a worker thread:
``EpiMod.plan`` compiles without launching, and ``EpiPlan.run`` launches with no host decision. A
plan serves every shape of its metadata class (dtype, operand majors, epilogue, configuration): the
kernels take M, N and K at run time.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import threading

import torch

from . import thread_context
from ..tunable.preparations import NeedsCompiler, compilers_allowed

__all__ = ["ACTIVATIONS", "unavailable", "version", "plan_for", "matmul", "major"]

#: tunekit's epilogue activations that quack's epilogue library computes, by quack's name
ACTIVATIONS = {"none": None, "relu": "relu", "silu": "silu", "gelu_tanh": "gelu_tanh_approx"}

_lock = threading.Lock()
_plans: dict[tuple, object] = {}


@functools.lru_cache(maxsize=None)
def version() -> str | None:
    """The installed quack-kernels version (without importing it), or None."""
    try:
        return importlib.metadata.version("quack-kernels")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def unavailable(device_index: int) -> str | None:
    """Why quack's kernels cannot run on CUDA device ``device_index``, or None."""
    if version() is None or importlib.util.find_spec("quack") is None:
        return "quack-kernels is not installed (optional: pip install quack-kernels)"
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return "quack's SM90 kernels: compute capability 9.0 (H100, H200) only"
    return None


def major(t: torch.Tensor) -> str | None:
    """"row" (the last dim contiguous), "col" (the first), or None for a 2-D operand neither dense
    row- nor column-major."""
    rows, cols = t.shape
    sr, sc = t.stride()
    if sc == 1 and (sr == cols or rows == 1):
        return "row"
    if sr == 1 and (sc == rows or cols == 1):
        return "col"
    return None


@functools.lru_cache(maxsize=None)
def _epilogue(activation: str, bias: bool):
    """quack's epilogue module for ``act(a @ b + bias)`` (import on first use: seconds)."""
    from quack.epilogue.library import linear_act_mod

    return linear_act_mod(ACTIVATIONS[activation], gated=False, has_c=False, has_rowvec=bias, has_colvec=False,
                          sr=False, has_alpha=False)


def _config(config: tuple):
    from quack.gemm_config import GemmConfig

    tile_m, tile_n, pingpong, cluster_m, cluster_n = config
    return GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m, cluster_n=cluster_n,
                      swap_ab=False, device_capacity=9, is_dynamic_persistent=False, use_tma_gather=False)


def _operands(bias):
    return {} if bias is None else {"mRowVecBroadcast": bias}


def plan_for(a, b, bias, out, activation: str, config: tuple):
    """The compiled plan for ``out = act(a @ b + bias)`` in configuration ``config`` (tile_m, tile_n,
    pingpong, cluster_m, cluster_n), made once per metadata class and device; never launches. Inside
    ``preparations.builds_only()`` a plan not made yet raises NeedsCompiler."""
    key = (a.dtype, major(a), major(b), bias is not None, activation, config, a.device.index)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if not compilers_allowed():
        raise NeedsCompiler("a quack plan compiles (CuTe DSL) on first use")
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    with _lock:
        plan = _plans.get(key)
        if plan is None:  # on a worker thread: no context is current there (CUDA_ERROR_INVALID_CONTEXT, H100)
            with torch.cuda.device(index), thread_context.capture_relaxed():
                thread_context.bind(index)
                plan = _epilogue(activation, bias is not None).plan(
                    a, b, None, out={"mAuxOut": out}, config=_config(config), **_operands(bias))
            _plans[key] = plan
    return plan


def matmul(plan, a, b, bias, out):
    """``out = act(a @ b + bias)`` by ``plan`` (made by :func:`plan_for` for these tensors' metadata)
    on the current stream; returns ``out``."""
    plan.run(a, b, None, out={"mAuxOut": out}, **_operands(bias))
    return out
