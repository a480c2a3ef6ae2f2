"""Triton GEMM candidates of Inductor's mm template (``kernels/triton/gemm_wrapped.py``): small GEMMs with
odd sizes, where neither cuBLAS nor tunekit's pointer kernel reach the template's speed (777 x 1555 x 333
bf16 as ``F.linear``: cuBLAS 19.7 us, the template 13.95 with sizes as constants, 14.95 at run time,
tunekit's best pointer configuration 19.1; H100, ``benchmarks/results/gemm_odd_single_kernel-*.txt``).

Two kinds, each over the template's best-measured configurations there (Inductor's mm configs):
``wrapped`` (sizes and strides at run time) and ``wrapped_static`` (compile-time constants: a compile
per shape, so worth it where offline tuning ships the choice). They are :class:`TritonGemm` in all but
the kernel: the same hard requirements (device, dtypes, overlaps, shared memory), launched with the
shared argument list (``triton_launch._args``), planned like the pointer kernel (``launch_plans.py``).
Their own rules: a batch of one, element offsets below 2^31 (int32 indices), and worth trying only on
problems below ``WRAPPED_MAX_MNK`` (1024^3) with M > 16 (decode and large problems have kernels of their own).

In files of their own, so adding them left the other GEMM candidates' source hashes, and with them
the shipped entries tuned before, as they were (``tunable/shipped.problems``: an entry tuned before a
candidate was added keeps its choice).
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import triton_launch
from .triton_candidates import TritonGemm, _config
from ...backends import triton as triton_backend
from ...tunable.candidate import hash_source

__all__ = ["TritonWrapped", "WRAPPED_CONFIGS", "wrapped_candidates", "WRAPPED_KINDS", "WRAPPED_MAX_MNK"]

WRAPPED_KINDS = ("wrapped", "wrapped_static")
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), best first at 777 x 1555 x 333 (H100)
WRAPPED_CONFIGS = [(64, 128, 32, 8, 4), (128, 64, 32, 8, 4), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3),
                   (128, 128, 64, 8, 5), (64, 64, 32, 4, 2)]
_KERNELS = {"wrapped": "matmul_wrapped_kernel", "wrapped_static": "matmul_wrapped_static_kernel"}
_HERE = Path(__file__).resolve()
_FILES = [_HERE, _HERE.parent / "triton_launch.py", _HERE.parent / "triton_candidates.py"] + [
    _HERE.parents[2] / "kernels" / "triton" / name for name in ("gemm_wrapped.py", "gemm.py", "activations.py")]
_source_text: str | None = None
_loaded: dict[str, object] = {}
_INT32 = 2 ** 31
#: M * N * K from which the TMA kernels run the problem (1024^3); 777 x 1555 x 333 is 2^28.6
WRAPPED_MAX_MNK = 2 ** 30


def _reach(t: torch.Tensor) -> int:
    """One past the largest element offset of ``t`` from its data pointer (its strides >= 0)."""
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


def _kernel(kind: str):
    """The kind's kernel (a reference: loaded at its first launch, Triton imported only then)."""
    found = _loaded.get(kind)
    if found is None:
        found = _loaded[kind] = triton_backend.kernel("gemm_wrapped", _KERNELS[kind])
    return found


class TritonWrapped(TritonGemm):
    """``kind`` ("wrapped", "wrapped_static") with ``config`` (BLOCK_M/N/K, GROUP_M, num_warps, num_stages)."""

    def __init__(self, kind: str, config):
        if kind not in WRAPPED_KINDS:
            raise ValueError(f"unknown wrapped GEMM kernel kind {kind!r}")
        self.kind, self.config, self.large = kind, config, False
        self.name = config.name(f"triton_{kind}", BLOCK_M="m", BLOCK_N="n", BLOCK_K="k", GROUP_M="g",
                                SPLIT_K="sk", num_warps="w", num_stages="s")

    def cannot_run(self, p) -> str | None:
        why = super().cannot_run(p)
        if why is not None:
            return why
        if p.batch != 1:
            return "wrapped kernel: a batch of one only"
        M, N, K = p.mnk
        tensors = [p.a, p.b, getattr(p, "c", None), p.out]
        new_out = M * N if p.out is None else 0  # the output it allocates: contiguous M x N
        cfg = self.config
        past = max(M + cfg.BLOCK_M, N + cfg.BLOCK_N, K + cfg.BLOCK_K)  # the last tile's row / column / K indices
        if any(t is not None and _reach(t) >= _INT32 for t in tensors) or new_out >= _INT32 or past >= _INT32:
            return "wrapped kernel: int32 indices (element offsets below 2^31)"
        return None

    def not_worth(self, p) -> str | None:
        M, N, K = p.mnk
        if M <= 16:
            return "wrapped kernel: M > 16 only (decode has kernels of its own)"
        if M * N * K >= WRAPPED_MAX_MNK:
            return "wrapped kernel: small problems only (the TMA kernels run large ones)"
        cfg = self.config
        if cfg.BLOCK_M > 2 * max(16, 1 << (M - 1).bit_length()) or cfg.BLOCK_N > 2 * max(16, 1 << (N - 1).bit_length()):
            return "tile more than twice the problem"
        return None

    def run(self, p, *, copy: bool = True):
        out = p.out
        if out is None:
            out = torch.empty(p.out_shape(), dtype=p.a.dtype, device=p.a.device)
        if out.numel() == 0:
            return out
        M, N, K = p.mnk
        cfg = self.config
        c_ptr, bias, tail, epilogue = triton_launch._args(p, p.a, p.b, out)
        grid = (-(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N),)
        with triton_backend.on_device(out.device):
            triton_launch._launch(
                _kernel(self.kind), grid, p.a, p.b, c_ptr, bias, out, None, *tail,
                BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
                EVEN_K=K % cfg.BLOCK_K == 0, INPUT_PRECISION=triton_launch._precision(p), **epilogue,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernels, their launcher, this class and its base: a change to any re-tunes
            _source_text = "".join(f.read_text() for f in _FILES)
        return hash_source(_source_text, self.kind, self.config)


def wrapped_candidates() -> list[TritonWrapped]:
    """Each kind over :data:`WRAPPED_CONFIGS` (fresh objects: each op gets its own)."""
    return [TritonWrapped(kind, _config(bm, bn, bk, warps, stages)) for kind in WRAPPED_KINDS
            for bm, bn, bk, warps, stages in WRAPPED_CONFIGS]
