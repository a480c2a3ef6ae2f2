"""CUDA C elementwise kernels (``kernels/cuda/elementwise.cuh`` forms) as candidates of an op whose
params name their input tensors (``x``; ``dy, x`` for a gradient) and an output ``out`` (None: the
candidate allocates; one of the inputs: in place).

``supports`` says why a kernel cannot run: not on a CUDA device, NVRTC missing, another dtype, a
non-contiguous tensor, or a pointer not aligned for the kernel's access width (``x[1:]`` of float16
is 2 bytes off a 16-byte boundary, so the 16-byte forms decline it and never read it). Sizes need no
check: kernels index with 64 bits and handle any tail.
"""

from __future__ import annotations

import functools

import torch

from ..backends import fast_call, fast_launch, nvrtc
from ..tunable.candidate import Candidate, hash_source

__all__ = ["CudaElementwise", "FORMS", "cuda_candidates"]

BLOCK = 256  # the kernels' __launch_bounds__

#: (form, dtype, bytes per access, elements per thread per tile, persistent grid) for the kernels
#: that ``TUNEKIT_FORMS`` in elementwise.cuh defines as ``<prefix>_<form>``. Persistent forms launch
#: the strided x2 kernel on one wave of resident blocks, walking the tiles grid-stride.
FORMS = [
    ("f32", torch.float32, 4, 1, False), ("f32x4", torch.float32, 16, 4, False),
    ("f32x4_x2", torch.float32, 16, 8, False), ("f32x4_x4", torch.float32, 16, 16, False),
    ("f32x4_x2_persistent", torch.float32, 16, 8, True),
    ("f16", torch.float16, 2, 1, False), ("f16x2", torch.float16, 4, 2, False), ("f16x8", torch.float16, 4, 8, False),
    ("f16x8_pack", torch.float16, 16, 8, False), ("f16x8_pack_x2", torch.float16, 16, 16, False),
    ("f16x8_pack_x4", torch.float16, 16, 32, False), ("f16x8_pack_x2_persistent", torch.float16, 16, 16, True),
    ("bf16", torch.bfloat16, 2, 1, False), ("bf16x2", torch.bfloat16, 4, 2, False),
    ("bf16x8", torch.bfloat16, 4, 8, False), ("bf16x8_pack", torch.bfloat16, 16, 8, False),
    ("bf16x8_pack_x2", torch.bfloat16, 16, 16, False), ("bf16x8_pack_x4", torch.bfloat16, 16, 32, False),
    ("bf16x8_pack_x2_persistent", torch.bfloat16, 16, 16, True),
]


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class CudaElementwise(Candidate):
    """``name`` is the candidate; ``kernel_name`` the ``extern "C"`` function in ``filename``.

    ``when`` restricts it to params whose attributes have the given values (gelu's ``approximate``).
    """

    def __init__(self, filename: str, name: str, dtype: torch.dtype, load_bytes: int, per_thread: int, *,
                 inputs: tuple[str, ...] = ("x",), persistent: bool = False, kernel_name: str | None = None,
                 when: dict | None = None):
        self.name = name
        self.dtype = dtype
        self.load_bytes = load_bytes
        self.per_thread = per_thread
        self.inputs = inputs
        self._unary = inputs == ("x",)
        self.persistent = persistent
        self.when = dict(when or {})
        self.kernel = nvrtc.kernel(filename, kernel_name or name)
        self.elements_per_block = BLOCK * per_thread

    def supports(self, p) -> str | None:
        for attr, value in self.when.items():
            if getattr(p, attr) != value:
                return f"{attr}={value!r} only"
        tensors = [getattr(p, name) for name in self.inputs]
        x, out = tensors[0], p.out
        if x.device.type != "cuda":
            return "needs a CUDA device"
        if out is not None:
            tensors.append(out)
        if any(t.dtype != self.dtype for t in tensors):
            return f"{str(self.dtype).removeprefix('torch.')} only"
        missing = nvrtc.available()
        if missing:
            return missing
        if any(not t.is_contiguous() for t in tensors):
            return "needs contiguous tensors"
        if any(t.shape != x.shape or t.device != x.device for t in tensors):
            return "needs tensors of one shape on one device"
        for name, t in zip((*self.inputs, "out"), tensors):
            if t.data_ptr() % self.load_bytes:
                return f"{name} is not {self.load_bytes}-byte aligned (offset {t.data_ptr() % 16} mod 16)"
        return None

    def run(self, p):
        # the cached call's path: every line here is host time on each call
        x = p.x
        out = p.out
        if out is None:
            out = torch.empty_like(x)
        n = x.numel()
        if n:
            index = x.get_device()
            grid = self._grid(n, index)
            if self._unary:
                self.kernel.launch(index, grid, BLOCK, x, out, n)
            else:
                self.kernel.launch(index, grid, BLOCK, *[getattr(p, name) for name in self.inputs], out, n)
        return out

    def _grid(self, n: int, index: int) -> int:
        grid = (n + self.elements_per_block - 1) // self.elements_per_block
        if not self.persistent:
            return grid
        return min(grid, _sm_count(index) * self.kernel.resident_blocks(index, BLOCK))

    def fast_runner(self, p):
        """``run`` for unary params with ``out`` None, as a function of ``x`` with the kernel's address,
        grid and launch entry bound: what the fast path calls. The C++ ``Launcher`` of
        ``backends/fast_call.cpp`` (allocation and launch in one call) where it builds, else a
        closure over the C launch (one frame, one allocation, one launch). Valid for every ``x`` of
        this cache key (dtype, element count, alignment, device)."""
        launch = nvrtc.direct_launch()
        x = p.x
        n = x.numel()
        if not self._unary or p.out is not None or launch is None or n == 0:
            return None
        index = x.get_device()
        function = self.kernel.address(index)
        grid = self._grid(n, index)
        stream = nvrtc.current_stream
        native = fast_call.load()
        if native is not None:
            return native.Launcher(fast_launch.driver_entry_point(), function, grid, BLOCK, n, index, stream)
        empty_like = torch.empty_like

        def runner(x):
            out = empty_like(x)
            launch(function, grid, BLOCK, stream(index), x, out, n)
            return out

        return runner

    def source_hash(self) -> str:
        return hash_source(self.kernel.source_hash(), self.kernel.name, self.load_bytes, self.per_thread, BLOCK,
                           self.persistent)


def cuda_candidates(filename: str, prefix: str, *, inputs: tuple[str, ...] = ("x",), when: dict | None = None,
                    name_prefix: str | None = None) -> list[CudaElementwise]:
    """One candidate per form of ``FORMS`` for the kernels ``<prefix>_<form>`` of ``filename``.
    Candidates are named ``<name_prefix or prefix>_<form>``."""
    out = []
    for form, dtype, load_bytes, per_thread, persistent in FORMS:
        kernel_form = form.removesuffix("_persistent")
        out.append(CudaElementwise(filename, f"{name_prefix or prefix}_{form}", dtype, load_bytes, per_thread,
                                   inputs=inputs, persistent=persistent, kernel_name=f"{prefix}_{kernel_form}",
                                   when=when))
    return out
