"""Launching the GEMM Triton kernels (``kernels/triton/gemm.py``, ``gemm_tma.py``) for GEMM params: the
host side those kernels' docstrings ask for.

- Strides of every operand go in as they are (transposed and sliced views, no copies); a batch
  stride is passed as 0 when the batch has one entry (an odd unused stride would cost Triton's
  divisibility hint and drop every load to scalar).
- ``c`` (addmm's input, linear's bias) is read through its view broadcast to the result. A row
  vector added with beta = 1 (linear's bias) goes through the kernels' bias path (one vector load
  per tile); anything else through the C path. With beta = 0, C is not read at all (torch's rule:
  its NaN and infinities do not reach the result).
- Split-K writes fp32 partials to a workspace ``[SPLIT_K, batch, M, N]``, summed in a fixed order by
  ``splitk_reduce_kernel`` (deterministic, no atomics).
- The persistent TMA kernel gets ``NUM_SMS`` programs (the device's SM count; 4 in the
  interpreter) and Triton's allocator for its device-side descriptors (a ContextVar: set before
  every launch, in the launching thread).
- :func:`aligned_copy`: an operand TMA cannot read (rows not 16-byte aligned, a misaligned base)
  copied into a buffer with padded rows, of the same major order; the padded-copy strategy.

Kernels are loaded at first use (:mod:`tunekit.backends.triton`): importing tunekit never imports Triton.
"""

from __future__ import annotations

import torch

from ...backends import triton as triton_backend
from ...backends.device import sm_count

__all__ = ["kernels", "tma_readable", "aligned_copy", "launch_pointer", "launch_tma", "INTERPRETER_SMS"]

#: NUM_SMS of the persistent kernel in Triton's interpreter (a few programs, each walking several tiles)
INTERPRETER_SMS = 4

_loaded: dict[str, object] = {}
_NAMES = {"matmul": ("gemm", "matmul_kernel"), "reduce": ("gemm", "splitk_reduce_kernel"),
          "skinny": ("gemm", "matmul_skinny_kernel"), "tma": ("gemm_tma", "matmul_tma_persistent_kernel"),
          "activations": ("gemm", "ACTIVATIONS"), "descriptors": ("gemm_tma", "HAS_TENSOR_DESCRIPTORS")}


def kernels(name: str):
    """A kernel (or constant) of the GEMM kernel modules by its short name, or None without Triton."""
    found = _loaded.get(name)
    if found is None:
        found = triton_backend.kernel(*_NAMES[name])
        if found is not None:
            _loaded[name] = found
    return found


#: ``fn[grid](...)``, or only its compilation inside ``triton_backend.warming()`` (a candidate's prepare)
_launch = triton_backend.launch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _strides(t: torch.Tensor, batch: int) -> tuple[int, int, int]:
    """(batch, row, column) strides of a 2-D or 3-D operand; batch stride 0 for a batch of one."""
    if t.dim() == 2:
        return 0, t.stride(0), t.stride(1)
    return (t.stride(0) if batch > 1 else 0), t.stride(1), t.stride(2)


def tma_readable(t: torch.Tensor) -> bool:
    """Whether the TMA kernel can read (or store) ``t`` through a descriptor: 16-byte aligned base,
    a unit stride in one of the last two dims, the other a non-zero multiple of 16 bytes, and a
    non-zero 16-byte multiple batch stride when the batch has more than one entry."""
    size = t.element_size()
    if t.data_ptr() % 16:
        return False
    rows, cols = t.stride(-2), t.stride(-1)
    outer = rows if cols == 1 else cols if rows == 1 else 0
    if outer <= 0 or (outer * size) % 16:
        return False
    if t.dim() == 3 and t.shape[0] > 1:
        return t.stride(0) > 0 and (t.stride(0) * size) % 16 == 0
    return True


def aligned_copy(t: torch.Tensor, *, copy: bool = True) -> torch.Tensor:
    """A copy of ``t`` that :func:`tma_readable` accepts: rows padded to 16 bytes, the same major
    order (a column-major operand, e.g. ``weight.t()``, stays column-major: a straight copy).
    ``copy=False``: the buffer alone (compiling needs its layout, not its values)."""
    unit = max(1, 16 // t.element_size())
    col = t.stride(-1) != 1 and t.stride(-2) == 1
    src = t.mT if col else t
    *lead, rows, cols = src.shape
    buf = torch.empty(*lead, rows, _cdiv(max(cols, 1), unit) * unit, dtype=t.dtype, device=t.device)[..., :cols]
    if copy:
        buf.copy_(src)
    return buf.mT if col else buf


def _args(p, a, b, out):
    """The kernels' shared arguments after the six pointers' slots, and the epilogue constexprs."""
    M, N, K = p.mnk
    batch = p.batch
    c, beta = getattr(p, "c", None), getattr(p, "beta", 0)
    c_ptr = bias = None
    c_strides, bias_stride = (0, 0, 0), 0
    if c is not None and beta != 0:
        view = c.expand(out.shape)
        scb, scm, scn = _strides(view, batch)
        if scb == 0 and scm == 0 and beta == 1:
            bias, bias_stride = c, scn
        else:
            c_ptr, c_strides = view, (scb, scm, scn)
    code = kernels("activations")[p.activation]
    epilogue = dict(HAS_C=c_ptr is not None, HAS_BIAS=bias is not None, ACTIVATION=code)
    tail = [M, N, K, batch, *_strides(a, batch), *_strides(b, batch), *c_strides, bias_stride,
            *_strides(out, batch), float(getattr(p, "alpha", 1)), float(beta)]
    return c_ptr, bias, tail, epilogue


def _precision(p) -> str:
    return "tf32" if p.a.dtype is torch.float32 and p.tf32 else "ieee"


def launch_pointer(kind: str, config, p, out: torch.Tensor) -> None:
    """``matmul_kernel`` or ``matmul_skinny_kernel`` (then ``splitk_reduce_kernel`` when SPLIT_K > 1)
    with ``config`` (BLOCK_M/N/K, GROUP_M, SPLIT_K, num_warps, num_stages)."""
    a, b = p.a, p.b
    M, N, K = p.mnk
    batch = p.batch
    c_ptr, bias, tail, epilogue = _args(p, a, b, out)
    bm, bn, bk, split = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K, config.SPLIT_K
    ws = None
    if split > 1:
        ws = torch.empty(split * batch * M * N, dtype=torch.float32, device=out.device)
    ptrs = [a, b, c_ptr, bias, out if split == 1 else None, ws]
    grid = (batch * split * _cdiv(M, bm) * _cdiv(N, bn),)
    tiling = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, EVEN_K=K % (bk * split) == 0,
                  num_warps=config.num_warps, num_stages=config.num_stages)
    with triton_backend.on_device(out.device):
        if kind == "skinny":
            _launch(kernels("skinny"), grid, *ptrs, *tail, **tiling, **epilogue)
        else:
            _launch(kernels("matmul"), grid, *ptrs, *tail, GROUP_M=config.GROUP_M, INPUT_PRECISION=_precision(p),
                    **tiling, **epilogue)
        if split > 1:
            _reduce(ws, c_ptr, bias, out, tail, split, M, N, batch, epilogue)


def _reduce(ws, c_ptr, bias, out, tail, split, M, N, batch, epilogue) -> None:
    """The fixed-order sum of the split-K partials and the epilogue."""
    rm = 1 if M == 1 else 16
    rn = 1024 if M == 1 else 256
    grid = (batch * _cdiv(M, rm) * _cdiv(N, rn),)
    c_strides, bias_stride, out_strides, scalars = tail[10:13], tail[13], tail[14:17], tail[17:]
    _launch(kernels("reduce"), grid, ws, c_ptr, bias, out, M, N, batch, *c_strides, bias_stride, *out_strides,
            *scalars, SPLIT_K=split, BLOCK_M=rm, BLOCK_N=rn, **epilogue, num_warps=4)


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch_tma(config, p, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The persistent TMA kernel on operands ``a``, ``b`` (``p``'s or aligned copies of them, which
    :func:`tma_readable` accepts); out through a descriptor when it can be, else pointer stores."""
    M, N, K = p.mnk
    batch = p.batch
    c_ptr, bias, tail, epilogue = _args(p, a, b, out)
    bm, bn = config.BLOCK_M, config.BLOCK_N
    if out.is_cuda:
        import triton  # present: the kernel loaded

        triton.set_allocator(_scratch)
        sms = sm_count(out.get_device())
    else:
        sms = INTERPRETER_SMS
    tiles = batch * _cdiv(M, bm) * _cdiv(N, bn)
    out_tma = out.stride(-1) == 1 and tma_readable(out)
    with triton_backend.on_device(out.device):
        _launch(
            kernels("tma"), (min(sms, tiles),), a, b, c_ptr, bias, out, None, *tail, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=config.BLOCK_K,
            GROUP_M=config.GROUP_M, NUM_SMS=sms, A_ROW_MAJOR=a.stride(-1) == 1, B_ROW_MAJOR=b.stride(-1) == 1,
            BATCHED=batch > 1, OUT_TMA=out_tma, INPUT_PRECISION=_precision(p), FLATTEN=config.get("FLATTEN", True),
            WARP_SPECIALIZE=False, **epilogue, num_warps=config.num_warps, num_stages=config.num_stages)
