"""logsumexp as ``torch.logsumexp(x, dim, keepdim)``, fused into one pass per row, and its gradient.

``torch.logsumexp`` is a composite (amax, subtract, exp, sum, log, add: several kernels and a
full-size temporary); the candidates here read the input once. Layouts: see
``ops/_shared/reduction.py`` (a contiguous input reduced over adjacent dims is (outer, R, inner);
rows: inner = 1; columns: > 1).

``logsumexp``
- ``torch_logsumexp`` (default): runs any input (every dim, tuples of dims, strides, dtypes).
- CUDA C (``kernels/cuda/logsumexp.cu``), ``_vec``: 16-byte loads:
  ``logsumexp_{rows8,warp,block}_<dtype>[_vec]`` (8 threads per row for rows of 64 and fewer, a
  warp, a block per row), ``logsumexp_block_split_<dtype>[_vec]`` (several blocks per row, then a
  combine pass: 4 x 16M), ``logsumexp_chunks{32,64}k_<dtype>`` (one block per 32 or 64 KB chunk of a
  row, the grid every chunk), ``logsumexp_rowblock{128,256}_<dtype>_vec`` (a block of 128 or 256
  threads per row, the grid every row: 1024 rows of 32768 16-bit elements in one wave),
  ``logsumexp_columns_<dtype>[_vec]`` (reduce a non-last dim in place).
- Triton (``kernels/triton/logsumexp.py``): ``logsumexp_triton_*``.

``logsumexp_backward`` (``dx = dy * exp(x - lse)``, one pass over x): ``fused_logsumexp_backward``
(default: a fused CUDA C kernel wherever one runs the layout, torch's composite in float32
elsewhere: ``default_backward.py``), ``torch_logsumexp_backward`` (the composite), CUDA C
``logsumexp_backward_{rows8,warp,block,columns,flat}_<dtype>[_vec]``
(``kernels/cuda/logsumexp_backward.cu``) and Triton.

Autograd: :func:`logsumexp` on a tensor that requires grad records :class:`LogsumexpFunction`.

The package: ``params.py``; ``cuda_common.py``, ``cuda_forward.py``, ``cuda_backward.py`` (CUDA C
candidates), ``default_backward.py`` (the gradient's default); ``triton_forward.py``, ``triton_backward.py`` (Triton); ``op.py`` (the tunable ops,
public functions, autograd, the custom ops ``tunekit::logsumexp*`` and the ``tunekit.patch()``
replacements of ``torch.logsumexp`` and ``Tensor.logsumexp``).
"""

from __future__ import annotations

import torch

from .op import (LogsumexpFunction, compiled_logsumexp, compiled_logsumexp_backward, logsumexp, logsumexp_backward,
                 logsumexp_backward_custom, logsumexp_backward_op, logsumexp_custom, logsumexp_op, patched_function,
                 patched_method, torch_logsumexp, torch_logsumexp_backward)
from .params import LogsumexpBackwardParams, LogsumexpParams, normalize_dims, reduced_shape, unsqueezed
from .._shared.family import OpFamily, PatchTarget

__all__ = ["LogsumexpParams", "LogsumexpBackwardParams", "LogsumexpFunction", "logsumexp", "logsumexp_backward",
           "logsumexp_op", "logsumexp_backward_op", "compiled_logsumexp", "compiled_logsumexp_backward",
           "normalize_dims", "reduced_shape", "unsqueezed", "torch_logsumexp", "torch_logsumexp_backward", "FAMILY"]

FAMILY = OpFamily(
    name="logsumexp",
    functions={"logsumexp": logsumexp, "logsumexp_backward": logsumexp_backward},
    patches=(PatchTarget(torch, "logsumexp", patched_function), PatchTarget(torch.Tensor, "logsumexp", patched_method)),
    custom_ops={"logsumexp": logsumexp_custom, "logsumexp_backward": logsumexp_backward_custom},
)
