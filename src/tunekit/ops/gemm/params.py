"""The GEMM family's params: ``out = ACT(alpha * A @ B + beta * C)`` for 2-D or batched (3-D) operands.

Two tunable ops share one layout of fields, so one candidate class serves both:

- :class:`GemmParams` (op ``mm``): ``a`` [batch?, M, K], ``b`` [batch?, K, N] (either may be any
  strided view: ``linear``'s ``b`` is ``weight.t()``; a batch stride of 0 broadcasts), ``out``
  (None: the op allocates a contiguous result), ``activation`` (``none``, ``relu``, ``silu``,
  ``gelu``, ``gelu_tanh``: applied to the product, the fused linear's epilogue).
- :class:`AddmmParams` (op ``addmm``): the same plus ``c`` (broadcastable to the result: addmm's
  ``input``, baddbmm's, or linear's bias as a row vector), ``alpha`` and ``beta``. ``out is c``
  is the in-place form (``addmm_``).

Two process-wide states of torch change what a GEMM computes or which kernels are allowed, and are
fields here, read when the params are made (so a recorded signature is rebuilt offline with the
values it was met with): ``tf32`` (float32 only: ``torch.backends.cuda.matmul.allow_tf32``, which
``torch.set_float32_matmul_precision("high")`` sets) and ``deterministic``
(``torch.use_deterministic_algorithms``: split-K candidates are left out).

The signature names what changes the choice or whether a candidate can run: dtype, M, N, K, the
batch, each operand's layout (``row``: dense row-major, ``col``: dense column-major, otherwise its
strides; ``/b<stride>`` for a batch stride that is not dense; ``@<pointer mod 16>``), whether C is
read (``beta=0`` says not) and how it broadcasts, ``alpha=0``, the activation, TF32 and
deterministic mode::

    mm bf16 M=4097 N=4095 K=4096 a=row@0 b=col@0 out=new act=none tf32=0 det=0 cuda
"""

from __future__ import annotations

import torch

from ...backends.device import peak_flops_bound
from ...tunable.dtypes import short_name
from ...tunable.params import OpParams, tensor_key, with_arguments

__all__ = ["GemmParams", "AddmmParams", "ACTIVATIONS", "layout", "current_tf32", "current_deterministic", "folded"]

#: the epilogue activations, by name (the kernels' ACTIVATION codes are in kernels/triton/gemm.py)
ACTIVATIONS = ("none", "relu", "silu", "gelu", "gelu_tanh")

_f32 = torch.float32
_get_tf32 = torch._C._get_cublas_allow_tf32
_deterministic = torch.are_deterministic_algorithms_enabled


def current_tf32() -> bool:
    """Whether torch's float32 matmuls on CUDA use TF32 now (``allow_tf32`` / precision "high")."""
    return bool(_get_tf32())


def current_deterministic() -> bool:
    return bool(_deterministic())


def folded(t: torch.Tensor) -> torch.Tensor:
    """``t``'s leading dims folded into one, as rows of a GEMM operand or result: ``reshape(-1, last)``
    with the row count spelled out, since an empty last dim makes ``-1`` ambiguous (torch raises; a
    [5, 5, 0] @ [0, 5] matmul is torch's OpInfo sample)."""
    rows = 1
    for size in t.shape[:-1]:
        rows = rows * size
    return t.reshape(rows, t.shape[-1])


def layout(t: torch.Tensor) -> str:
    """The readable layout of a matrix operand (its last two dims) and its batch stride: ``row``,
    ``col`` (dense), or ``s<row stride>,<column stride>``; ``/b<stride>`` when a 3-D operand's batch
    stride is not the dense one; ``@<data pointer mod 16>``. Exact: two operands of one layout
    string and shape have the same strides."""
    rows, cols = t.shape[-2], t.shape[-1]
    sr, sc = t.stride(-2), t.stride(-1)
    if sc == 1 and sr == cols:
        text = "row"
    elif sr == 1 and sc == rows:
        text = "col"
    else:
        text = f"s{sr},{sc}"
    if t.dim() == 3 and t.stride(0) != rows * cols:
        text += f"/b{t.stride(0)}"
    return f"{text}@{t.data_ptr() % 16}"


class GemmParams(OpParams):
    """``out = ACT(a @ b)``; see the module docstring."""

    op_name = "mm"
    inputs = ("a", "b")
    outputs = ("out",)

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, activation: str = "none",
                 tf32: bool | None = None, deterministic: bool | None = None):
        self.a, self.b, self.out, self.activation = a, b, out, activation
        self.tf32 = (a.dtype is _f32 and bool(_get_tf32())) if tf32 is None else bool(tf32)
        self.deterministic = bool(_deterministic()) if deterministic is None else bool(deterministic)

    # -- what every candidate needs ---------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.a.shape[0] if self.a.dim() == 3 else 1

    @property
    def mnk(self) -> tuple[int, int, int]:
        a = self.a
        return a.shape[-2], self.b.shape[-1], a.shape[-1]

    def out_shape(self) -> tuple[int, ...]:
        a = self.a
        return (*a.shape[:-1], self.b.shape[-1])

    def fastest_possible_ms(self) -> float:
        """A lower bound on any candidate's time: the FLOPs at an upper bound of the GPU's dense peak
        (``backends.device.peak_flops_bound``); 0.0 where none is known (CPU, other GPUs). Tuning uses
        it to skip challengers that could not save what their call costs (``tunable/session.py``)."""
        a = self.a
        if a.device.type != "cuda":
            return 0.0
        kind = "16bit" if a.dtype in (torch.float16, torch.bfloat16) else "tf32" if self.tf32 else "fp32"
        peak = peak_flops_bound(a.device.index if a.device.index is not None else torch.cuda.current_device(), kind)
        M, N, K = self.mnk
        return 0.0 if not peak else 2.0 * M * N * K * self.batch / peak * 1e3

    def new_outputs(self):
        a = self.a
        return {"out": torch.empty(self.out_shape(), dtype=a.dtype, device=a.device)}

    # -- identity -------------------------------------------------------------------------------
    def cache_key(self):
        out = self.out
        return (tensor_key(self.a), tensor_key(self.b), None if out is None else tensor_key(out), self.activation,
                self.tf32, self.deterministic)

    def _head(self) -> str:
        M, N, K = self.mnk
        batch = f" batch={self.batch}" if self.a.dim() == 3 else ""
        return f"{self.op_name} {short_name(self.a.dtype)} M={M} N={N} K={K}{batch}"

    def _tail(self) -> str:
        return (f"act={self.activation} tf32={int(self.tf32)} det={int(self.deterministic)} "
                f"{self.a.device.type}")

    def _operand(self, t: torch.Tensor) -> str:
        """``layout(t)``, with its dtype first when it is not A's (only the default runs such params)."""
        text = layout(t)
        return text if t.dtype is self.a.dtype else f"{short_name(t.dtype)}:{text}"

    def _out_text(self) -> str:
        return "new" if self.out is None else self._operand(self.out)

    def signature(self) -> str:
        return (f"{self._head()} a={layout(self.a)} b={self._operand(self.b)} out={self._out_text()} "
                f"{self._tail()}")

    def _arguments(self) -> dict:
        return {"activation": self.activation, "tf32": self.tf32, "deterministic": self.deterministic}

    def spec(self):
        return with_arguments(super().spec(), **self._arguments())


class AddmmParams(GemmParams):
    """``out = ACT(alpha * a @ b + beta * c)``, ``c`` broadcastable to the result; ``out is c``: in place."""

    op_name = "addmm"
    inputs = ("c", "a", "b")

    def __init__(self, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha=1, beta=1,
                 out: torch.Tensor | None = None, activation: str = "none", tf32: bool | None = None,
                 deterministic: bool | None = None):
        super().__init__(a, b, out, activation, tf32, deterministic)
        self.c, self.alpha, self.beta = c, alpha, beta

    def cache_key(self):
        out, c = self.out, self.c
        dest = None if out is None else "inplace" if out is c else tensor_key(out)
        return (tensor_key(c), tensor_key(self.a), tensor_key(self.b), dest, self.alpha == 0, self.beta == 0,
                self.activation, self.tf32, self.deterministic)

    def c_expanded(self) -> torch.Tensor:
        """``c`` broadcast to the result's shape (a view: stride 0 where it broadcasts)."""
        return self.c.expand(self.out_shape())

    def signature(self) -> str:
        c = "beta=0" if self.beta == 0 else self._operand(self.c_expanded())
        out = "inplace" if self.out is self.c else self._out_text()
        alpha = " alpha=0" if self.alpha == 0 else ""
        return (f"{self._head()} a={layout(self.a)} b={self._operand(self.b)} c={c} out={out}{alpha} "
                f"{self._tail()}")

    def _arguments(self) -> dict:
        return {**super()._arguments(), "alpha": self.alpha, "beta": self.beta}
