"""GEMM: ``out = ACT(alpha * A @ B + beta * C)``, as ``torch.mm`` / ``addmm`` / ``addmm_`` / ``bmm`` /
``baddbmm`` / ``matmul`` / ``nn.functional.linear`` and a linear with a fused activation epilogue.

Two tunable ops (``op.py``): ``mm`` (no C: mm, bmm, matmul, linear without bias, every backward
GEMM) and ``addmm`` (with C: addmm, addmm_, baddbmm, linear with a bias). Candidates:

- ``torch_mm`` / ``torch_addmm`` (default): torch's kernels (cuBLAS), then torch's activation;
- ``triton_<kind>_m<BLOCK_M>_n<BLOCK_N>_k<BLOCK_K>_g<GROUP_M>_sk<SPLIT_K>_w<warps>_s<stages>``: the
  Triton kernels of ``kernels/triton/gemm.py`` / ``gemm_tma.py`` in forty configurations, one class
  (``triton_candidates.py``): the general masked pointer kernel (odd sizes, any strides, split-K),
  a GEMV-style kernel for decode, the persistent Hopper TMA kernel, and the padded-copy strategy
  for rows TMA cannot read;
- ``quack_m<tile_m>_n<tile_n>_<pp|coop>_c<cluster>``: quack's Hopper kernels (optional quack-kernels),
  whose ping-pong epilogue hides the bias and activation (``quack_candidates.py``).

The package: ``params.py`` (GemmParams, AddmmParams: key, signature, spec), ``numerics.py`` (the
check against a float64 reference with a bound that grows with K, or 2x torch's own error),
``torch_candidates.py``, ``triton_launch.py`` and ``triton_candidates.py``, ``op.py`` (the tunable
ops), ``checks.py`` (which calls tunekit takes), ``autograd.py`` (one Function; the backward is
tuned GEMMs), ``functions.py`` (the public functions), ``custom_ops.py`` (``tunekit::mm``,
``tunekit::addmm`` for torch.compile) and ``drop_in.py`` (``tunekit.nn.Linear``, the patch targets).
``docs/gemm.md`` gives the design and what was measured.
"""

from __future__ import annotations

from .autograd import GemmFunction
from .custom_ops import addmm_custom, mm_custom
from .drop_in import PATCHES, Linear
from .functions import addmm, addmm_, baddbmm, bmm, linear, linear_act, matmul, mm
from .op import addmm_op, make_addmm_example, make_example, mm_op
from .params import ACTIVATIONS, AddmmParams, GemmParams
from .triton_candidates import CONFIGS, TritonGemm
from .._shared.family import OpFamily, PatchTarget

__all__ = ["GemmParams", "AddmmParams", "GemmFunction", "TritonGemm", "CONFIGS", "ACTIVATIONS", "Linear", "mm",
           "addmm", "addmm_", "bmm", "baddbmm", "matmul", "linear", "linear_act", "mm_op", "addmm_op",
           "make_example", "make_addmm_example", "FAMILY"]

FAMILY = OpFamily(
    name="gemm",
    functions={"mm": mm, "addmm": addmm, "addmm_": addmm_, "bmm": bmm, "baddbmm": baddbmm, "matmul": matmul,
               "linear": linear, "linear_act": linear_act},
    modules={"Linear": Linear},
    patches=tuple(PatchTarget(owner, name, make) for owner, name, make in PATCHES),
    custom_ops={"mm": mm_custom, "addmm": addmm_custom},
    # opt-in: a model's GEMMs mostly keep cuBLAS, and the routing's host time per call made a patched
    # LLaMA-style training step 0.82x as fast on an H200 (benchmarks/results/model_step-NVIDIA_H200.md)
    patch_by_default=False,
)
