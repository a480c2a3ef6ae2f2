"""quack's Hopper GEMM kernels as ``mm`` and ``addmm`` candidates: ``quack_m<tile_m>_n<tile_n>_<pp|coop>_c<cluster>``
runs quack's SM90 kernel in that configuration (``backends/quack.py``), the activation and linear's bias
in its epilogue.

Why: the fused linear + bias + activation is where cuBLASLt and Triton leave time (their epilogues
follow each tile's main loop: 1.03-1.05x and 1.13x the plain GEMM's time, H100); quack's ping-pong
kernels overlap the epilogue with the other warp group's main loop (bias + gelu tanh +0.5% over its
plain GEMM), and on some large aligned shapes its plain GEMM is as fast as cuBLAS's
(``benchmarks/experiments/quack_gemm_probe.py``).

Scope: ``act(a @ b)`` (mm) and linear's form of addmm (``c`` a bias of N contiguous elements,
alpha = beta = 1), activation none, relu, silu or gelu tanh; 2-D float16 / bfloat16 operands,
each dense row- or column-major and 16-byte aligned, M, N, K multiples of 8 (TMA); M and N of
at least :data:`MIN_MN` (at M <= 128 every configuration ran 1.4-1.7x cuBLAS's time); a new result
or a dense row-major ``out`` overlapping no input; compute capability 9.0 with quack-kernels
installed. No split-K: deterministic. The configurations are quack's own SM90 space, those the probe
found fastest on some shape. Online tuning compiles them only within the op's cap of preparations
(they come after the Triton ones): each compile takes seconds, so ``tunekit tune`` times them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .params import AddmmParams, GemmParams
from .torch_candidates import torch_addmm
from ...backends import quack
from ...tunable.candidate import Candidate, hash_source
from ...tunable.params import overlaps

__all__ = ["QuackGemm", "quack_candidates", "CONFIGS", "MIN_MN"]

#: (tile_m, tile_n, pingpong, cluster_m, cluster_n)
CONFIGS = ((128, 192, True, 2, 1), (128, 192, True, 1, 2), (128, 208, True, 2, 1), (128, 160, True, 2, 1),
           (256, 128, False, 2, 1), (256, 192, False, 2, 1), (128, 256, False, 2, 1))
#: the smallest M and N offered to quack's 128- and 256-row tiles
MIN_MN = 1024

_SOURCES = [Path(__file__), Path(quack.__file__), Path(quack.__file__).with_name("quack_build.py")]
_source_text: str | None = None
_DTYPES = (torch.float16, torch.bfloat16)


def _device_index(p) -> int:
    return p.a.device.index if p.a.device.index is not None else torch.cuda.current_device()


def _unit_scalars(p) -> bool:
    return all(type(x) in (int, float) and x == 1 for x in (p.alpha, p.beta))


def _bias_problem(p: AddmmParams) -> str | None:
    """Why ``p`` is not linear's form of addmm (None: it is)."""
    if not _unit_scalars(p):
        return "alpha = beta = 1 only (linear's bias, added unscaled)"
    c = p.c
    if c.dtype is not p.a.dtype or c.device != p.a.device or c.dim() not in (1, 2) or c.stride(-1) != 1 \
            or (c.dim() == 2 and c.shape[0] != 1) or c.shape[-1] != p.b.shape[-1] or c.data_ptr() % 16:
        return "c: a 16-byte aligned bias of N contiguous elements of the operands' dtype, broadcast over the rows"
    if p.out is not None and (p.out is c or overlaps(c, p.out)):
        return "out: not in place, and overlapping no input"
    return None


def _operand_problem(p) -> str | None:
    a, b, out = p.a, p.b, p.out
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in _DTYPES or b.dtype is not a.dtype or b.device != a.device:
        return "2-D float16 / bfloat16 operands of one dtype on one device only"
    M, N, K = p.mnk
    if 0 in (M, N, K):
        return "empty problem (the default handles M, N or K of 0)"
    if M % 8 or N % 8 or K % 8:
        return "M, N and K multiples of 8 only (TMA's 16-byte strides)"
    if M < MIN_MN or N < MIN_MN:
        return f"M and N of {MIN_MN} or more (smaller problems ran 1.4-1.7x cuBLAS's time)"
    if quack.major(a) is None or quack.major(b) is None or a.data_ptr() % 16 or b.data_ptr() % 16:
        return "dense row- or column-major, 16-byte aligned operands only"
    if out is not None and (out.dtype is not a.dtype or out.device != a.device or not out.is_contiguous()
                            or out.data_ptr() % 16 or overlaps(a, out) or overlaps(b, out)):
        return "out: a dense row-major, 16-byte aligned tensor of the operands' dtype that overlaps neither"
    return None


class QuackGemm(Candidate):
    """quack's SM90 GEMM in one configuration, with the activation (and bias) in its epilogue."""

    #: a first build takes seconds in a child process: as a shipped choice's stand-in, only one built before
    slow_build = True

    def __init__(self, config: tuple):
        tile_m, tile_n, pingpong, cluster_m, cluster_n = config
        self.config = config
        self.name = f"quack_m{tile_m}_n{tile_n}_{'pp' if pingpong else 'coop'}_c{cluster_m}x{cluster_n}"

    def supports(self, p) -> str | None:
        if type(p) not in (GemmParams, AddmmParams):
            return "mm and addmm only"
        if p.activation not in quack.ACTIVATIONS:
            return "activation none, relu, silu or gelu tanh only"
        if p.a.device.type != "cuda":
            return "CUDA only"
        why = quack.unavailable(_device_index(p))
        if why:
            return why
        return _operand_problem(p) or (_bias_problem(p) if type(p) is AddmmParams else None)

    def _parts(self, p):
        """(a, b, bias or None, out) of ``p``, ``out`` allocated when ``p`` has none."""
        a, b = p.a, p.b
        out = p.out if p.out is not None else torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        bias = p.c.reshape(-1) if type(p) is AddmmParams else None
        return a, b, bias, out

    def prepare(self, p) -> None:
        """Build (a child process: seconds) or load this configuration's kernel for ``p``'s class, never
        launching it (a worker thread does this while tuning or while a shipped choice gets ready)."""
        if p.a.device.type == "cuda":
            why = quack.unavailable(_device_index(p))
            if why:  # a shipped choice on a machine without quack: the entry's next fastest stands in
                raise RuntimeError(why)
            quack.kernel_for(p.a, p.b, p.c if type(p) is AddmmParams else None, p.activation, self.config)

    def run(self, p):
        if type(p) is AddmmParams and not _unit_scalars(p):  # a choice for linear's form met by other scalars
            return torch_addmm(p)  # in the same cache key (it holds only alpha == 0, beta == 0): torch's
        a, b, bias, out = self._parts(p)
        return quack.kernel_for(a, b, bias, p.activation, self.config)(a, b, bias, out)

    def source_hash(self) -> str:
        global _source_text
        if _source_text is None:
            _source_text = "".join(path.read_text() for path in _SOURCES)
        return hash_source(_source_text, self.config)


def quack_candidates() -> list[QuackGemm]:
    """One candidate per configuration of :data:`CONFIGS` (fresh objects: each op gets its own)."""
    return [QuackGemm(config) for config in CONFIGS]
