"""Triton GEMM candidates: one class, :class:`TritonGemm`, and a list of configurations.

A candidate is a kernel *kind* and a :class:`~tunekit.tunable.config.Config` (BLOCK_M, BLOCK_N,
BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages):

- ``matmul``: ``matmul_kernel``, any strides, masked tiles (odd sizes), optional split-K;
- ``skinny``: ``matmul_skinny_kernel``, decode (M of one or two rows against a weight);
- ``tma``: the persistent Hopper kernel (TMA descriptors, wgmma), operands TMA can read;
- ``padded``: the same kernel after copying each operand TMA cannot read (rows not 16-byte
  aligned: 4097 x 4095 x 4096) into a buffer with padded rows; out written with pointer stores.

``supports`` says why a candidate cannot run some params (:meth:`TritonGemm.cannot_run`: device,
dtypes, split-K in deterministic mode, TMA requirements) and, cheaply, why it is not worth trying
(:meth:`TritonGemm.not_worth`: tiles far larger than the problem, decode configurations for large M,
split-K where the tiles already fill the GPU, the pointer kernel's long tail where TMA runs): with
forty configurations, a signature screens and times the dozen that can win. The configurations and
what was measured come from ``benchmarks/experiments/gemm_kernels_notes.md`` and Inductor's H100
mm / persistent mm configurations.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import triton_launch
from .triton_launch import kernels, tma_readable
from ...backends import triton as triton_backend
from ...backends.device import sm_count
from ...tunable.candidate import Candidate, hash_source
from ...tunable.config import Config
from ...tunable.dtypes import KERNEL_DTYPES
from ...tunable.params import overlaps

__all__ = ["TritonGemm", "CONFIGS", "triton_candidates", "LARGE_MNK", "PADDED_MIN_MNK"]

#: M * N * K from which a problem (M > 16) counts as large: with TMA available, the pointer kernel's
#: long tail of configurations is not tried (8% behind the TMA kernel there on H100 / H200)
LARGE_MNK = 2 ** 28
#: M * N * K from which the padded-copy strategy is worth its copies (777 x 1555 x 333 is 2**28.6)
PADDED_MIN_MNK = 2 ** 26
#: shared memory per block the compiled kernels may use (H100 / H200: 227 KB)
SMEM_BYTES = 227 * 1024

_HERE = Path(__file__).resolve()
_KERNEL_FILES = [_HERE.parents[2] / "kernels" / "triton" / name for name in ("gemm.py", "gemm_tma.py", "activations.py")]
_source_text: str | None = None


def _config(bm, bn, bk, warps, stages, split=1, group=8, **extra) -> Config:
    return Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, SPLIT_K=split, num_warps=warps,
                  num_stages=stages, **extra)


#: (kind, config, "large": also tried on large problems where the TMA kernel runs), best first
CONFIGS: list[tuple[str, Config, bool]] = [
    # persistent TMA (notes: 128x256x64 w8 s3 with a TMA store is the best measured everywhere)
    *[("tma", _config(*c), True) for c in [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3),
                                          (256, 128, 64, 8, 4), (128, 128, 64, 8, 5), (128, 128, 128, 4, 3),
                                          (64, 128, 64, 4, 4), (128, 64, 64, 4, 4)]],
    *[("padded", _config(*c), True) for c in [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4),
                                             (128, 64, 64, 4, 4)]],
    # decode (M <= 16): BLOCK_M = 16, split-K so the weight streams from enough programs
    *[("matmul", _config(*c), False) for c in [(16, 64, 128, 4, 4, 4), (16, 64, 256, 4, 3, 4), (16, 128, 128, 4, 4, 8),
                                              (16, 64, 128, 4, 5, 8), (16, 32, 256, 4, 4, 4), (16, 64, 128, 4, 4),
                                              (16, 128, 64, 4, 4)]],
    *[("skinny", _config(*c, group=1), False) for c in [(1, 16, 512, 4, 1, 2), (1, 32, 256, 4, 1, 4),
                                                        (1, 64, 256, 4, 1, 4), (2, 32, 256, 4, 1, 4)]],
    # the general pointer kernel (odd sizes, strided views, Hopper-less GPUs)
    *[("matmul", _config(*c), large) for c, large in [
        ((128, 128, 32, 4, 4), True), ((128, 256, 64, 8, 3), True), ((128, 64, 64, 4, 4), True),
        ((64, 128, 64, 4, 3), True), ((128, 128, 64, 8, 3), True), ((64, 64, 64, 4, 3), False),
        ((128, 128, 64, 4, 3), False), ((64, 128, 32, 4, 4), False), ((128, 64, 32, 4, 4), False),
        ((64, 64, 32, 4, 2), False), ((32, 64, 128, 4, 3), False), ((64, 32, 128, 4, 4), False),
        ((32, 32, 128, 4, 2), False)]],
    # split-K for few tiles and a long K (its own rule says where: kept on large problems)
    *[("matmul", _config(*c), True) for c in [(64, 128, 64, 4, 3, 2), (64, 64, 64, 4, 3, 4), (32, 64, 128, 4, 3, 4),
                                             (64, 64, 128, 4, 3, 8)]],
]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return triton_launch.INTERPRETER_SMS
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


class TritonGemm(Candidate):
    """``kind`` ("matmul", "skinny", "tma", "padded") with ``config``; ``large``: also worth trying on
    large problems where the TMA kernel runs."""

    def __init__(self, kind: str, config: Config, large: bool = False):
        if kind not in ("matmul", "skinny", "tma", "padded"):
            raise ValueError(f"unknown GEMM kernel kind {kind!r}")
        self.kind, self.config, self.large = kind, config, large
        self.name = config.name(f"triton_{kind}", BLOCK_M="m", BLOCK_N="n", BLOCK_K="k", GROUP_M="g",
                                SPLIT_K="sk", num_warps="w", num_stages="s")

    # -- can it run, is it worth trying ---------------------------------------------------------
    def supports(self, p) -> str | None:
        return self.cannot_run(p) or self.not_worth(p)

    def cannot_run(self, p) -> str | None:
        a, b, out, c = p.a, p.b, p.out, getattr(p, "c", None)
        device = a.device
        why = triton_backend.device_problem(device)
        if why:
            return why
        kernel = kernels("matmul")
        if kernel is None:
            return triton_backend.NO_TRITON
        why = triton_backend.device_problem(device, kernel)  # built for this device (interpreter or GPU)
        if why:
            return why
        if a.dtype not in KERNEL_DTYPES:
            return "float32, float16 or bfloat16 only"
        tensors = [t for t in (b, out, c) if t is not None]
        if any(t.dtype is not a.dtype for t in tensors):
            return "needs one dtype for every operand"
        if any(t.device != device for t in tensors):
            return "needs every operand on one device"
        M, N, K = p.mnk
        if M == 0 or N == 0 or p.batch == 0:
            return "empty result: nothing to launch (the default returns it)"
        if getattr(p, "alpha", 1) == 0:
            return "alpha == 0: torch's semantics (A and B not read)"
        if out is not None and (any(s == 0 and n > 1 for s, n in zip(out.stride(), out.shape))
                                or overlaps(a, out) or overlaps(b, out)
                                or (c is not None and c is not out and overlaps(c, out))):
            return "out overlaps itself or an input (in place is out = c only)"
        if self.config.SPLIT_K > 1 and p.deterministic:
            return "split-K excluded in deterministic mode (torch.use_deterministic_algorithms)"
        if device.type == "cuda" and self._shared_memory(p) > SMEM_BYTES:
            return f"needs about {self._shared_memory(p) // 1024} KB of shared memory (227 KB per block)"
        if self.kind in ("tma", "padded"):
            return self._tma_problem(p, device)
        return None

    def _shared_memory(self, p) -> int:
        """Bytes of shared memory the compiled kernel needs, from above: the pipeline's A and B tiles;
        the TMA kinds also stage the output tile, and a C of rows (not a bias), through shared memory
        for their TMA epilogue. Refusing here saves a compile that fails at launch (bf16 256x128x64 in
        4 stages through TMA: 240 KB). An upper bound: every configuration it passed launched in the H100
        tests, and a few float32 decode ones it refuses would fit."""
        cfg, size = self.config, p.a.element_size()
        pipeline = cfg.num_stages * (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * size
        if self.kind not in ("tma", "padded"):
            return pipeline
        c = getattr(p, "c", None)
        tiles = 1 + (c is not None and c.dim() >= 2 and c.size(-2) > 1 and c.stride(-2) != 0)
        return pipeline + tiles * cfg.BLOCK_M * cfg.BLOCK_N * size

    def _tma_problem(self, p, device) -> str | None:
        if device.type == "cuda" and _capability(device) < (9, 0):
            return "TMA kernel: needs sm_90 or newer (Hopper)"
        if kernels("descriptors") is None:
            return triton_backend.NO_TRITON
        if not kernels("descriptors"):
            return "TMA kernel: needs Triton >= 3.4 (tl.make_tensor_descriptor)"
        if self.kind == "tma" and not (tma_readable(p.a) and tma_readable(p.b)):
            return "TMA kernel: an operand TMA cannot read (rows or base not 16-byte aligned, or no unit stride)"
        return None

    def not_worth(self, p) -> str | None:
        """Why these params are not worth this configuration's compile and timing (None: they are)."""
        M, N, K = p.mnk
        cfg, kind = self.config, self.kind
        decode = M <= 16
        if kind == "skinny":
            if M > cfg.BLOCK_M or p.b.stride(-2) != 1:
                return "skinny kernel: M <= BLOCK_M against a K-contiguous B (x @ weight.t()) only"
            return None
        if cfg.BLOCK_M == 16 and not decode:
            return "decode configuration: M <= 16 only"
        if decode and cfg.BLOCK_M > 16:
            return "M <= 16: decode configurations only"
        if cfg.BLOCK_M > 2 * max(16, _pow2_at_least(M)) or cfg.BLOCK_N > 2 * max(16, _pow2_at_least(N)):
            return "tile more than twice the problem"
        if cfg.BLOCK_K > 2 * max(16, _pow2_at_least(K)):
            return "BLOCK_K more than twice K"
        if cfg.SPLIT_K > 1:
            tiles = p.batch * -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
            if tiles >= _sms(p.a.device) or K < 4 * cfg.SPLIT_K * cfg.BLOCK_K:
                return "split-K: only for fewer tiles than SMs and K of 4+ blocks per split"
        large = M * N * K >= LARGE_MNK and not decode
        if kind == "padded":
            if tma_readable(p.a) and tma_readable(p.b):
                return "padded copies: every operand is TMA-readable already (the tma kind runs it)"
            if M * N * K < PADDED_MIN_MNK:
                return "padded copies: too small a problem for their cost"
        if kind == "matmul" and large and not self.large and self._tma_runs(p):
            return "large problem where the TMA kernel runs: the pointer kernel's best configurations only"
        return None

    def _tma_runs(self, p) -> bool:
        return p.a.is_cuda and _capability(p.a.device) >= (9, 0) and bool(kernels("descriptors"))

    # -- running --------------------------------------------------------------------------------
    def run(self, p, *, copy: bool = True):
        out = p.out
        if out is None:
            a = p.a
            out = torch.empty(p.out_shape(), dtype=a.dtype, device=a.device)
        if out.numel() == 0:
            return out
        if self.kind == "tma":
            triton_launch.launch_tma(self.config, p, out, p.a, p.b)
        elif self.kind == "padded":
            a, b = p.a, p.b
            if not tma_readable(a):
                a = triton_launch.aligned_copy(a, copy=copy)
            if not tma_readable(b):
                b = triton_launch.aligned_copy(b, copy=copy)
            triton_launch.launch_tma(self.config, p, out, a, b)
        else:
            triton_launch.launch_pointer(self.kind, self.config, p, out)
        return out

    def prepare(self, p) -> None:
        """Compile this configuration's kernels for ``p`` without launching them (tuning calls it on a
        worker thread, so the check's first launch finds them compiled)."""
        if p.a.device.type == "cuda":
            with triton_backend.warming(p.a.device):
                self.run(p, copy=False)

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:  # the kernels and their launchers: a change to either re-tunes
            launcher = (_HERE.parent / "triton_launch.py").read_text()
            _source_text = "".join(f.read_text() for f in _KERNEL_FILES) + launcher + _HERE.read_text()
        return hash_source(_source_text, self.kind, self.config)


def triton_candidates() -> list[TritonGemm]:
    """One candidate per entry of :data:`CONFIGS` (fresh objects: each op gets its own)."""
    return [TritonGemm(kind, config, large) for kind, config, large in CONFIGS]
