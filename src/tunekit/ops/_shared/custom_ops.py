"""What every op's ``torch.library`` registration shares (each op registers its own custom ops in
its own module; ``tunekit/ops/silu.py`` is the simplest).

Why custom ops. Dynamo cannot trace a TunableOp call (a ContextVar, dicts keyed on data pointers
and, on a miss, candidates timed on real data), so each tunekit call would break the graph. A custom
op is opaque to the compiler: tracing runs only its fake implementation (the result's shape, dtype
and strides: no data, no tuning), and the compiled graph calls its real implementation at run time,
which is the very call eager code makes: the same choice cache, the same results store, tuning on
the first *run* of a new signature, never while tracing.

Why eager calls do not go through them. Crossing the dispatcher into a Python custom op costs
several times tunekit's whole cached path in host time (``docs/measurements.md``). The public
functions keep their direct path and hand over to the custom op only while
``torch.compiler.is_compiling()`` (one test at the top of each; Dynamo inlines the handover into
the graph).

Layouts: a custom op's real implementation must return exactly the strides its fake one promises,
so :func:`like_x` and :func:`contiguous` copy when a candidate returned another layout (only torch's
kernels on non-dense inputs do).

Limits, for every op: only the functional forms are custom ops (``out=`` and ``inplace=True`` under
torch.compile run torch's own ops, which the compiler functionalizes and may fuse); a custom op is a
fusion barrier; tracing the public functions without Dynamo (``make_fx``, ``torch.func``,
``torch.jit.trace``) is not supported (call ``torch.ops.tunekit.*`` there); settings apply around a
compiled call, at run time; under CUDA-graph capture, and in the warm-up Inductor runs before one
(``mode="reduce-overhead"``), nothing is tuned: the stored, shipped or default choice runs
(``tunable/graph_making.py``).
"""

from __future__ import annotations

import torch

__all__ = ["like_x", "contiguous", "compute_dtype", "save_inputs", "tunekit_ops"]

_HALF = (torch.float16, torch.bfloat16)

#: ``torch.ops.tunekit``, resolved lazily by attribute, so it can be bound before the ops exist
tunekit_ops = torch.ops.tunekit


def like_x(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` laid out as ``torch.empty_like(x)`` (an elementwise fake's result): a copy only when it is not."""
    if y.stride() == x.stride() and x.is_contiguous():  # every call on a contiguous x
        return y
    if y.stride() == torch.empty_like(x, device="meta").stride():
        return y
    return torch.empty_like(x).copy_(y)


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def contiguous(y: torch.Tensor) -> torch.Tensor:
    """``y`` with exactly ``torch.empty(y.shape)``'s strides (size-1 dims included)."""
    if y.stride() == _contiguous_strides(y.shape):
        return y
    return torch.empty(y.shape, dtype=y.dtype, device=y.device).copy_(y)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a differentiable composite computes in: float32 for 16-bit inputs."""
    return torch.float32 if t.dtype in _HALF else t.dtype


def save_inputs(ctx, inputs, output):
    """``setup_context`` of an op whose backward needs its tensor inputs (saved) and its other
    arguments (``ctx.arguments``, in order)."""
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ctx.arguments = [a for a in inputs if not isinstance(a, torch.Tensor)]
