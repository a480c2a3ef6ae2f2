"""logsumexp's kernels at the edges of their index arithmetic (past 2**31 elements, on the GPU) and the forms
each candidate declines, with its reasons; the candidate families; split_chunk (test_logsumexp.py: every
candidate against float64, torch's semantics, autograd)."""

import pytest
import torch

from tunekit.ops._shared.reduction import MAX_TERMS
from tunekit.ops.logsumexp.cuda_backward import CudaColumnsBackward, CudaFlatBackward, CudaRowsBackward
from tunekit.ops.logsumexp.cuda_common import split_chunk
from tunekit.ops.logsumexp.cuda_forward import CudaColumns, CudaColumnStrip, CudaRowBlock, CudaRows
from tunekit.ops.logsumexp.triton_backward import TritonBackwardFlat, TritonBackwardStatic
from tunekit.ops.logsumexp.triton_forward import TritonRows
from tunekit.ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, logsumexp_backward_op, logsumexp_op)
from reduction_checks import close


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements(cuda):
    rows, cols = 2, 2**30 + 8
    x = torch.full((rows, cols), -float("inf"), dtype=torch.float16, device=cuda)
    x[1, -3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)  # past element 2^31
    x[0, :4] = torch.tensor([0.5, 1.5, -2.0, 0.0], dtype=torch.float16, device=cuda)
    expected = torch.stack([torch.logsumexp(x[0, :4].double(), 0), torch.logsumexp(x[1, -3:].double(), 0)])
    names = ["logsumexp_block_f16_vec", "logsumexp_warp_f16", "logsumexp_block_split_f16_vec",
             "logsumexp_chunks32k_f16"]
    names += [c.name for c in logsumexp_op.candidates if isinstance(c, TritonRows)]
    for name in names:
        out = torch.full((rows,), float("nan"), dtype=torch.float16, device=cuda)
        p = LogsumexpParams(x, (1,), False, out)
        if logsumexp_op.candidate(name).supports(p) is None:
            logsumexp_op.candidate(name).run(p)
            close(out, expected, torch.float16)
    del x
    # columns: dim 0 of (2^16 + 1, 2^15), the last row past element 2^31
    x = torch.full((2**16 + 1, 2**15), -float("inf"), dtype=torch.float16, device=cuda)
    x[-1, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)
    x[0, 0] = 0.5
    expected = torch.full((2**15,), -float("inf"), dtype=torch.float64, device=cuda)
    expected[:3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, device=cuda)
    expected[0] = torch.logsumexp(torch.tensor([0.5, 1.0], dtype=torch.float64), 0)
    for c in logsumexp_op.candidates:
        p = LogsumexpParams(x, (0,), False, torch.full((2**15,), float("nan"), dtype=torch.float16, device=cuda))
        if c is not logsumexp_op.default and c.supports(p) is None:
            c.run(p)
            close(p.out, expected, torch.float16)


@pytest.mark.gpu
def test_float32_columns_past_2_to_the_31_elements(cuda):
    """Column strips and the split columns kernels in float32: dim 0 of (2^16 + 1, 2^15), the last
    row past element 2^31 (8.6 GB)."""
    x = torch.full((2**16 + 1, 2**15), -float("inf"), dtype=torch.float32, device=cuda)
    x[-1, -3:] = torch.tensor([1.0, 2.0, 3.0], device=cuda)
    x[0, -1] = 0.5
    expected = torch.full((2**15,), -float("inf"), dtype=torch.float64, device=cuda)
    expected[-3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, device=cuda)
    expected[-1] = torch.logsumexp(torch.tensor([0.5, 3.0], dtype=torch.float64), 0)
    ran = []
    for c in logsumexp_op.candidates:
        p = LogsumexpParams(x, (0,), False, torch.full((2**15,), float("nan"), device=cuda))
        if c is not logsumexp_op.default and c.supports(p) is None:
            c.run(p)
            close(p.out, expected, torch.float32)
            ran.append(c.name)
    assert "logsumexp_columns_strip_f32_vec" in ran and "logsumexp_columns_f32" in ran, ran


def test_column_strips_decline_reductions_too_long_for_one_thread_sum():
    c = logsumexp_op.candidate("logsumexp_columns_strip_f32_vec")
    assert c.layout(1, 128 * MAX_TERMS, 64) is None
    assert "longer than" in c.layout(1, 128 * MAX_TERMS + 1, 64)
    assert "multiple of 4" in c.layout(1, 64, 6)
    assert "other than the last" in c.layout(4, 64, 1)


@pytest.mark.gpu
def test_row_blocks_past_2_to_the_31_elements(cuda):
    """A row block starts at blockIdx.x * cols: 64-bit once rows x cols passes 2^31 (short rows,
    so every row-block candidate takes them)."""
    rows, cols = 2**18 + 1, 2**13
    x = torch.full((rows, cols), -float("inf"), dtype=torch.float16, device=cuda)
    x[0, :2] = torch.tensor([0.5, -1.0], dtype=torch.float16, device=cuda)
    x[-1, -3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)  # past element 2^31
    expected = torch.full((rows,), -float("inf"), dtype=torch.float64, device=cuda)
    expected[0] = torch.logsumexp(x[0, :2].double(), 0)
    expected[-1] = torch.logsumexp(x[-1, -3:].double(), 0)
    names = [c.name for c in logsumexp_op.candidates if isinstance(c, CudaRowBlock) and c.dtype == torch.float16]
    assert len(names) == 2
    for name in names:
        out = torch.full((rows,), float("nan"), dtype=torch.float16, device=cuda)
        p = LogsumexpParams(x, (1,), False, out)
        assert logsumexp_op.candidate(name).supports(p) is None, name
        logsumexp_op.candidate(name).run(p)
        close(out, expected, torch.float16)


@pytest.mark.gpu
def test_flat_backward_past_2_to_the_31_elements(cuda):
    """The flat and static gradient kernels index 64-bit: two rows of 2^30 + 8 float16, values past element 2^31."""
    rows, cols = 2, 2**30 + 8
    x = torch.full((rows, cols), -float("inf"), dtype=torch.float16, device=cuda)
    x[0, :2] = torch.tensor([0.5, 1.5], dtype=torch.float16, device=cuda)
    x[1, -3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)
    lse = torch.tensor([2.0, 3.5], dtype=torch.float16, device=cuda)
    dy = torch.tensor([1.0, -2.0], dtype=torch.float16, device=cuda)
    expected = (dy.double()[:, None] * torch.exp(torch.stack([x[0, :2], x[1, -2:]]).double() - lse.double()[:, None]))
    names = [c.name for c in logsumexp_backward_op.candidates
             if isinstance(c, (CudaFlatBackward, TritonBackwardFlat, TritonBackwardStatic))]
    ran = []
    for name in names:
        c = logsumexp_backward_op.candidate(name)
        out = torch.full_like(x, float("nan"))
        p = LogsumexpBackwardParams(dy, x, lse, (1,), False, out)
        if c.supports(p) is not None:
            continue
        c.run(p)
        close(torch.stack([out[0, :2], out[1, -2:]]), expected, torch.float16)
        assert not out.isnan().any() and int((out != 0).sum()) == 5, name
        ran.append(name)
        del out
    assert any(n.startswith("logsumexp_backward_flat_f16") for n in ran), ran
    assert any(n.startswith("logsumexp_backward_triton_static") for n in ran), ran


def test_cuda_forms_decline_unaligned_rows_and_rows_too_long_for_one_thread_sum():
    c = logsumexp_op.candidate("logsumexp_warp_f32_vec")
    x = torch.randn(4, 33)
    if x.device.type == "cpu":
        x_cuda_like = LogsumexpParams(x, (1,))
        assert "CUDA" in c.supports(x_cuda_like)
    assert c.max_cols == 32 * 2**13 and logsumexp_op.candidate("logsumexp_block_f32").max_cols == 256 * 2**13


@pytest.mark.gpu
def test_cuda_forms_decline_on_the_gpu(cuda):
    vec = logsumexp_op.candidate("logsumexp_warp_f32_vec")
    assert "aligned" in vec.supports(LogsumexpParams(torch.randn(4, 33, device=cuda), (1,)))
    assert "aligned" in vec.supports(LogsumexpParams(torch.randn(4 * 32 + 1, device=cuda)[1:].view(4, 32), (1,)))
    assert "longer than" in vec.supports(LogsumexpParams(torch.randn(1, 2**18 + 4, device=cuda), (1,)))


def test_candidate_families_are_registered():
    kinds = {type(c) for c in logsumexp_op.candidates}
    assert {CudaRows, CudaRowBlock, CudaColumns, CudaColumnStrip} <= kinds and any(issubclass(k, TritonRows) for k in kinds)
    backward = {type(c) for c in logsumexp_backward_op.candidates}
    assert {CudaRowsBackward, CudaColumnsBackward, CudaFlatBackward, TritonBackwardFlat, TritonBackwardStatic} <= backward


@pytest.mark.parametrize("length, parallel, threads, tile", [(2**24, 4, 256, 2048), (4096, 1, 8, 64), (64, 1024, 8, 64),
                                                             (2**30 + 8, 2, 256, 1024), (1, 1, 32, 128)])
def test_split_chunk_fills_the_gpu_keeps_sums_short_and_covers_the_length(length, parallel, threads, tile):
    chunk, splits = split_chunk(length, parallel, 132, threads=threads, tile=tile)
    assert chunk % tile == 0 and (splits - 1) * chunk < length <= splits * chunk
    assert chunk <= max(tile, threads * MAX_TERMS)
    if length >= 132 * 8 * tile:
        assert parallel * splits >= 0.75 * 132 * 8 or chunk == tile  # chunks round up to whole tiles
