"""CUDA C elementwise kernels (``kernels/cuda/elementwise.cuh`` forms) as candidates of an op whose
params name their input tensors (``x``; ``dy, x`` for a gradient) and an output ``out`` (None: the
candidate allocates; one of the inputs: in place).

``supports`` says why a kernel cannot run: not on a CUDA device, NVRTC missing, another dtype, a
non-contiguous tensor, or a pointer not aligned for the kernel's access width (``x[1:]`` of float16
is 2 bytes off a 16-byte boundary, so the 16-byte forms decline it and never read it). Sizes need no
check: kernels index with 64 bits and handle any tail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import torch

from ...backends import cuda, fast_call, fast_launch, nvrtc
from ...backends.device import sm_count
from ...tunable.candidate import Candidate, hash_source

__all__ = ["CudaElementwise", "Form", "FORMS", "parse_forms", "cuda_candidates"]

BLOCK = 256  # the kernels' __launch_bounds__

#: the C storage type of each dtype in the forms table
_C_TYPES = {"float": torch.float32, "__half": torch.float16, "__nv_bfloat16": torch.bfloat16}
_FORM_LINE = re.compile(r"DEF\(prefix##_(\w+),\s*([\w]+),\s*\w+,\s*(map_consecutive|map_strided),\s*(\d+),\s*(\d+)\)")


@dataclass(frozen=True)
class Form:
    """One vector form of the elementwise kernels: ``name`` (the kernel's suffix), its storage
    ``dtype``, ``load_bytes`` per access (the pointer alignment it needs), ``per_thread`` elements
    per thread per tile, and whether it is launched ``persistent`` (one wave of resident blocks
    walking the tiles grid-stride)."""

    name: str
    dtype: torch.dtype
    load_bytes: int
    per_thread: int
    persistent: bool = False

    @property
    def kernel_suffix(self) -> str:
        return self.name.removesuffix("_persistent")


def parse_forms(text: str) -> list[Form]:
    """The forms ``TUNEKIT_FORMS`` in ``elementwise.cuh`` instantiates, in its order: that macro is the
    one table of them (the kernels exist only where it defines them). The strided two-pack form of
    each dtype is also offered persistent, a launch choice of the same kernel (listed after that
    dtype's forms)."""
    by_dtype: dict[torch.dtype, list[Form]] = {}
    persistent: dict[torch.dtype, Form] = {}
    for name, ctype, walk, vec, n in _FORM_LINE.findall(text):
        dtype, vec, n = _C_TYPES[ctype], int(vec), int(n)
        load_bytes = vec * torch.empty(0, dtype=dtype).element_size()
        by_dtype.setdefault(dtype, []).append(Form(name, dtype, load_bytes, vec * n))
        if walk == "map_strided" and n == 2:
            persistent[dtype] = Form(name + "_persistent", dtype, load_bytes, vec * n, persistent=True)
    return [f for dtype, forms in by_dtype.items() for f in forms + [persistent[dtype]] * (dtype in persistent)]


#: every form, read from the kernels' own table (``kernels/cuda/elementwise.cuh``)
FORMS = parse_forms(resources.files("tunekit.kernels.cuda").joinpath("elementwise.cuh").read_text())


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
        self.kernel = cuda.kernel(filename, kernel_name or name)
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

    def prepare(self, p) -> None:
        """Compile and load this form's kernel on ``p``'s device (tuning calls it on a worker
        thread, so the candidate's first run does not wait for NVRTC), build the C launch its runner
        uses, and start building the C++ one on its own worker: it takes 12-14 s on a machine's
        first use (H100), which a shipped choice's preparation must not wait for."""
        index = p.x.get_device()
        self.kernel.address(index)
        if self.persistent:
            self.kernel.resident_blocks(index, BLOCK)
        if cuda.direct_launch() is not None:
            fast_call.start_loading()

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
        return min(grid, sm_count(index) * self.kernel.resident_blocks(index, BLOCK))

    def fast_runner(self, p):
        """``run`` for unary params with ``out`` None, as a function of ``x`` with the kernel's address,
        grid and launch entry bound: what the fast path calls. The C++ ``Launcher`` of
        ``backends/fast_call.cpp`` (allocation and launch in one call) where it builds, else a
        closure over the C launch (one frame, one allocation, one launch) when it is not built yet (that
        runner then stays for the key). Valid for every ``x`` of
        this cache key (dtype, element count, alignment, device)."""
        launch = cuda.direct_launch()
        x = p.x
        n = x.numel()
        if not self._unary or p.out is not None or launch is None or n == 0:
            return None
        index = x.get_device()
        function = self.kernel.address(index)
        grid = self._grid(n, index)
        stream = cuda.current_stream
        native = fast_call.loaded()  # the C++ Launcher once built; the C launch until then
        if native is not None:
            return native.Launcher(fast_launch.driver_entry_point(), function, grid, BLOCK, n, index, stream)
        empty_like = torch.empty_like
        current_device = cuda.current_device
        kernel = self.kernel

        def runner(x):
            out = empty_like(x)
            if current_device() != index:  # the driver launches in the current device's context
                kernel.launch(index, grid, BLOCK, x, out, n)
                return out
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
    return [CudaElementwise(filename, f"{name_prefix or prefix}_{f.name}", f.dtype, f.load_bytes, f.per_thread,
                            inputs=inputs, persistent=f.persistent, kernel_name=f"{prefix}_{f.kernel_suffix}",
                            when=when)
            for f in FORMS]
