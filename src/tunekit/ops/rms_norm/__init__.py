"""rms_norm as ``torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)``, and its gradient.

Why it is here: a LLaMA-style model normalizes twice per layer, and eager code (Hugging Face's
``LlamaRMSNorm``) spends seven kernels and as many autograd nodes on each, forward and backward;
its training step is bound by the host's launches, so one fused call per norm makes the step
faster where tuning GEMMs cannot (``docs/measurements.md``).

``rms_norm``
- ``torch_rms_norm`` (default): torch's ``F.rms_norm`` (a fused kernel on CUDA). Runs any input.
- ``rms_norm_triton_r<rows>_w<warps>``: Triton (``kernels/triton/rms_norm.py``), a row per
  ``rows``-th of a program, contiguous rows of up to 16384 elements.

``rms_norm_backward`` ((dx, dweight)): ``torch_rms_norm_backward`` (default: torch's fused
gradient on CUDA, the float32 formula on the CPU) and ``rms_norm_backward_triton_w<warps>_p<programs
per SM>`` (dx per row, dweight from one float32 partial per program).

Autograd: a call that needs gradients gets torch's own node once the choice is torch's kernel, else
:class:`RmsNormFunction` with the tuned gradient. ``op.py``: the ops, public functions, autograd and
custom ops; ``drop_in.py``: ``tunekit.nn.RMSNorm`` and the ``tunekit.patch()`` replacements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .drop_in import HF_RMS_NORMS, RMSNorm, patched_forward, patched_functional, patched_hf_forward
from .op import (RmsNormFunction, compiled_rms_norm, rms_norm, rms_norm_backward, rms_norm_backward_custom,
                 rms_norm_backward_op, rms_norm_custom, rms_norm_op, torch_rms_norm, torch_rms_norm_backward)
from .params import RmsNormBackwardParams, RmsNormParams
from .._shared.family import OpFamily, PatchTarget

__all__ = ["RmsNormParams", "RmsNormBackwardParams", "RmsNormFunction", "RMSNorm", "rms_norm", "rms_norm_backward",
           "rms_norm_op", "rms_norm_backward_op", "torch_rms_norm", "torch_rms_norm_backward", "compiled_rms_norm",
           "FAMILY"]

FAMILY = OpFamily(
    name="rms_norm",
    functions={"rms_norm": rms_norm, "rms_norm_backward": rms_norm_backward},
    modules={"RMSNorm": RMSNorm},
    patches=(PatchTarget(F, "rms_norm", patched_functional), PatchTarget(torch.nn.RMSNorm, "forward", patched_forward),
             *(PatchTarget(owner, "forward", patched_hf_forward) for owner in HF_RMS_NORMS)),
    custom_ops={"rms_norm": rms_norm_custom, "rms_norm_backward": rms_norm_backward_custom},
)
