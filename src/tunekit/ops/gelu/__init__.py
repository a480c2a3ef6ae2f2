"""gelu as ``torch.nn.functional.gelu``, both forms, and its gradient.

- ``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``
- ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``

Two tunable ops, each with its candidates (kernels live in ``tunekit/kernels/<backend>/``):

``gelu``
- ``torch_gelu`` (default): PyTorch's fused kernel, both forms. Runs any input.
- ``gelu_<form>`` (erf) and ``gelu_tanh_<form>``: CUDA C (``kernels/cuda/gelu.cu``), fp32 math for
  every storage type (a half-precision tanh turns into NaN for x > ~4), the forms of
  ``kernels/cuda/elementwise.cuh``; each declines the other ``approximate``.
- ``gelu_triton_b<BLOCK>_w<warps>``: Triton, both forms (a compile-time switch).

``gelu_backward``: ``torch_gelu_backward`` (default, ``aten.gelu_backward``), the CUDA C forms
(``gelu_backward_<form>``, ``gelu_tanh_backward_<form>``) and Triton configurations.

The package: ``op.py`` (what ``ops/silu.py`` holds for silu: params, candidates, tunable ops, public
functions and autograd (:class:`GeluFunction`), the custom ops ``tunekit::gelu`` /
``tunekit::gelu_backward``); ``dropin.py`` (the drop-in :class:`GELU` module and the
``tunekit.patch()`` replacements).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dropin import GELU, patched_forward, patched_functional
from .op import (GeluBackwardParams, GeluFunction, GeluParams, compiled_gelu, compiled_gelu_backward, gelu,
                 gelu_backward, gelu_backward_custom, gelu_backward_op, gelu_custom, gelu_op, gelu_tolerance)
from .._shared.family import OpFamily, PatchTarget

__all__ = ["GeluParams", "GeluBackwardParams", "GeluFunction", "GELU", "gelu", "gelu_backward", "gelu_op",
           "gelu_backward_op", "gelu_tolerance", "compiled_gelu", "compiled_gelu_backward", "FAMILY"]

FAMILY = OpFamily(
    name="gelu",
    functions={"gelu": gelu, "gelu_backward": gelu_backward},
    modules={"GELU": GELU},
    patches=(PatchTarget(F, "gelu", patched_functional), PatchTarget(torch.nn.GELU, "forward", patched_forward)),
    custom_ops={"gelu": gelu_custom, "gelu_backward": gelu_backward_custom},
)
