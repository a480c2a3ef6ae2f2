"""Triton candidates of logsumexp's gradient ``dx = dy * exp(x - lse)`` (kernels:
``tunekit.kernels.triton.logsumexp``): rows (:class:`~.triton_forward.TritonRows` with the gradient
kernel), columns, flat (the elementwise layout) and static (the flat kernel with the shape compiled in)."""

from __future__ import annotations

from .triton_forward import ROWS_CONFIGS, TritonRows, kernel_fn, rows_name
from .._shared.reduction import ceil_div
from ...backends import triton as triton_backend

__all__ = ["TritonBackwardColumns", "TritonBackwardFlat", "TritonBackwardStatic", "triton_logsumexp_backward_candidates"]

BACKWARD_COLUMNS_CONFIGS = [(16, 128, 4), (64, 16, 4)]
#: (BLOCK, warps) of the flat gradient kernel
BACKWARD_FLAT_CONFIGS = [(1024, 4), (2048, 4)]


class TritonBackwardColumns(TritonRows):
    """The gradient over a non-last dim (inner > 1): one [block_r, block_i] tile of
    ``dx = dy * exp(x - lse)`` per program, dy and lse read once per tile along inner."""

    def __init__(self, name: str, *, block_r: int = 16, block_i: int = 128, num_warps: int = 4):
        super().__init__(name, "logsumexp_backward_columns_kernel", inputs=("dy", "x", "lse"), block=block_i,
                         num_warps=num_warps, rows_per_program=block_r)
        self.block_r, self.block_i = block_r, block_i

    def layout(self, outer, R, inner, device):
        if inner == 1:
            return "reduces a non-last dimension only (inner > 1): the rows candidates take the last"
        return None

    def grid(self, outer, R, inner, device):
        return outer * ceil_div(R, self.block_r) * ceil_div(inner, self.block_i)

    def launch(self, tensors, out, outer, R, inner):
        tiles_i, tiles_r = ceil_div(inner, self.block_i), ceil_div(R, self.block_r)
        triton_backend.launch(kernel_fn(self.kernel_name), (outer * tiles_r * tiles_i,),
            *tensors, out, R, inner, tiles_i, tiles_r, BLOCK_R=self.block_r, BLOCK_I=self.block_i,
            num_warps=self.num_warps)


class TritonBackwardFlat(TritonRows):
    """The gradient over any layout as an elementwise op (what torch.compile generates): program
    ``o * tiles + t`` computes ``block`` contiguous elements of slice ``o`` (R x inner elements),
    dy and lse gathered per element (from L1/L2). The rows and columns kernels loop over R, which
    keeps fewer loads in flight on large inputs (``docs/measurements.md``). Declined on slices shorter
    than a sixteenth of a tile (mostly idle programs: the rows kernels take them)."""

    kernel_function = "logsumexp_backward_flat_kernel"
    #: offsets within a slice are int32
    int32_slices = True

    def __init__(self, name: str, *, block: int = 1024, num_warps: int = 4):
        super().__init__(name, self.kernel_function, inputs=("dy", "x", "lse"), block=block, num_warps=num_warps)

    def layout(self, outer, R, inner, device):
        if R * inner < self.block // 16:
            return (f"slices of {self.block // 16} elements or more only (shorter ones leave most of a program "
                    "idle: the rows kernels take them)")
        if inner >= 2**31 and self.int32_slices:
            return "inner sizes of 2^31 and more (int32 offsets within a slice)"
        return None

    def grid(self, outer, R, inner, device):
        return outer * ceil_div(R * inner, self.block)

    def launch(self, tensors, out, outer, R, inner):
        tiles = ceil_div(R * inner, self.block)
        triton_backend.launch(kernel_fn(self.kernel_name), (outer * tiles,),*tensors, out, R * inner, inner, tiles, BLOCK=self.block,
                                                    ROWS=inner == 1, num_warps=self.num_warps)


class TritonBackwardStatic(TritonBackwardFlat):
    """The flat gradient with the shape compiled in (what torch.compile generates,
    ``dynamic=False``): one compiled kernel per (numel, R x inner, inner), so the dy/lse indices are
    constant divisions and load as vectors, and offsets are 64-bit only past 2^31 elements. The
    compile (~1 s, then in Triton's cache on disk) is paid once per shape, at the first run."""

    kernel_function = "logsumexp_backward_static_kernel"
    int32_slices = False

    def grid(self, outer, R, inner, device):
        return ceil_div(outer * R * inner, self.block)

    def launch(self, tensors, out, outer, R, inner):
        triton_backend.launch(kernel_fn(self.kernel_name), (self.grid(outer, R, inner, out.device),),
            *tensors, out, N=outer * R * inner, SLICE=R * inner, INNER=inner, BLOCK=self.block,
            num_warps=self.num_warps)


def triton_logsumexp_backward_candidates() -> list[TritonRows]:
    """The Triton gradient candidates to register on ``logsumexp_backward_op``."""
    out: list[TritonRows] = [
        TritonRows(rows_name("logsumexp_backward", r, b, w), "logsumexp_backward_rows_kernel",
                   inputs=("dy", "x", "lse"), block=b, num_warps=w, rows_per_program=r)
        for r, b, w in ROWS_CONFIGS]
    out += [TritonBackwardColumns(f"logsumexp_backward_triton_columns_r{r}_i{i}_w{w}", block_r=r, block_i=i,
                                  num_warps=w) for r, i, w in BACKWARD_COLUMNS_CONFIGS]
    out += [TritonBackwardFlat(f"logsumexp_backward_triton_flat_b{b}_w{w}", block=b, num_warps=w)
            for b, w in BACKWARD_FLAT_CONFIGS]
    out.append(TritonBackwardStatic("logsumexp_backward_triton_static_b1024_w4"))
    return out
