"""Triton logsumexp kernels (``kernels/triton/logsumexp.py``) through their candidates
(``ops/logsumexp/triton_*.py``), against float64 torch on fresh inputs, outputs pre-filled with NaN.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py
before the kernels load): sizes stay at a few thousand elements there. Besides the registered
candidates, small-tile variants force the split paths (several partials per row or column, merged
by the combine kernel) and the no-split path on these small sizes. GPU-sized shapes are marked gpu.
"""

import os

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels module decorates its kernels

from tunekit.ops.logsumexp import triton_forward as tr  # noqa: E402
from tunekit.ops.logsumexp.triton_backward import (TritonBackwardColumns,  # noqa: E402
                                                   triton_logsumexp_backward_candidates)
from tunekit.ops.logsumexp.triton_forward import (TritonColumns, TritonRows, TritonSplitRows,  # noqa: E402
                                                  triton_logsumexp_candidates)
from tunekit.ops.logsumexp import LogsumexpBackwardParams, LogsumexpParams  # noqa: E402
from reduction_checks import close  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # numpy, interpreter
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORWARD = triton_logsumexp_candidates()
BACKWARD = triton_logsumexp_backward_candidates()
#: not registered: tiles small enough that the CPU sizes below split into several partials
#: (split_b256: 4-17 chunks per row; columns: up to 19 chunks of R), or never split (programs=1)
EXTRA_FORWARD = [TritonSplitRows("test_split_b256_w4", block=256, num_warps=4),
                 TritonColumns("test_columns_r16_i8_split", block_r=16, block_i=8, programs=10**6),
                 TritonColumns("test_columns_r8_i8_nosplit", block_r=8, block_i=8, programs=1)]
#: (shape, dims): rows (inner = 1: last dim, trailing dims) of the odd lengths, then columns
ROWS = [((3, 1), (1,)), ((3, 31), (1,)), ((3, 33), (1,)), ((3, 1000), (1,)), ((2, 1025), (1,)),
        ((2, 4097), (1,)), ((40, 64), (1,)), ((2, 3, 33), (2,)), ((7,), (0,)), ((3, 4, 10), (1, 2))]
COLUMNS = [((37, 5), (0,)), ((3, 50, 7), (1,)), ((2, 3, 4, 5), (1, 2)), ((33, 130), (0,)), ((300, 3), (0,)),
           ((5, 70, 2), (0, 1))]
LAYOUT_WORDS = ("only", "longer", "split")  # reasons a candidate declines a layout by design




def fresh(shape, dtype, scale=3.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


def nan_like(shape, dtype):
    return torch.full(shape, NAN, dtype=dtype, device=DEVICE)


def run_forward(c, x, dims, keepdim):
    """The candidate into a NaN-filled output (checked to be the one returned), or None if declined."""
    shape = LogsumexpParams(x, dims, keepdim).new_outputs()["out"].shape
    p = LogsumexpParams(x, dims, keepdim, nan_like(shape, x.dtype))
    why = c.supports(p)
    if why is not None:
        assert any(w in why for w in LAYOUT_WORDS), (c.name, x.shape, dims, why)
        return None
    assert c.run(p).data_ptr() == p.out.data_ptr()
    return p.out


def test_candidate_lists():
    names = [c.name for c in FORWARD + BACKWARD]
    assert len(set(names)) == len(names)
    assert all(isinstance(c, TritonRows) for c in FORWARD + BACKWARD)  # tests/ops picks Triton by this
    assert {"logsumexp_triton_rows_b1024_w4", "logsumexp_triton_rows_r16_b64_w4", "logsumexp_triton_split_b4096_w8",
            "logsumexp_triton_columns_r32_i64_w4"} <= set(names)
    assert {"logsumexp_backward_triton_rows_b1024_w4", "logsumexp_backward_triton_columns_r16_i128_w4"} <= set(names)
    assert all(not c.backward for c in FORWARD) and all(c.backward for c in BACKWARD)
    assert len({c.source_hash() for c in FORWARD + BACKWARD}) == len(names)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("c", FORWARD + EXTRA_FORWARD, ids=lambda c: c.name)
def test_forward_matches_float64(c, dtype):
    ran = 0
    for shape, dims in ROWS + COLUMNS:
        x = fresh(shape, dtype)
        for keepdim in (False, True):
            out = run_forward(c, x, dims, keepdim)
            if out is not None:
                ran += 1
                close(out, torch.logsumexp(x.double(), dims, keepdim), dtype, x)
        if out is not None:  # a new output when none is given
            close(c.run(LogsumexpParams(x, dims)), torch.logsumexp(x.double(), dims), dtype, x)
    assert ran, f"{c.name} took none of the layouts"


def special_rows(cols, dtype):
    """8 rows: +inf, all -inf, NaN, NaN with +inf (far apart: other partials when split), ±huge,
    -inf mixed in, two +inf, all NaN."""
    huge = 6e4 if dtype == torch.float16 else 1e4
    x = fresh((8, cols), torch.float32)
    x[0, 3] = INF
    x[1] = -INF
    x[2, 5] = NAN
    x[3, 7], x[3, cols - 2] = NAN, INF
    x[4] = torch.linspace(-huge, huge, cols)
    x[5, ::2] = -INF
    x[6, 0], x[6, cols - 1] = INF, INF
    x[7] = NAN
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("c", FORWARD + EXTRA_FORWARD, ids=lambda c: c.name)
def test_forward_special_values(c, dtype):
    ran = 0
    for cols in (40, 1100):
        rows = special_rows(cols, dtype)
        for x, dims in ((rows, (1,)), (rows.t().contiguous(), (0,)), (rows.reshape(8, cols, 1), (1,))):
            out = run_forward(c, x, dims, False)
            if out is not None:
                ran += 1
                close(out, torch.logsumexp(x.double(), dims), dtype)
    assert ran or c.name == "logsumexp_triton_split_b4096_w8", c.name  # takes rows over 4096 only


def autograd_reference(dy, x, lse, dims, keepdim):
    """The float64 autograd gradient of torch.logsumexp, times exp(lse64 - lse): the kernel is
    given ``lse`` rounded to the dtype (half an ulp: 0.4% of the gradient in float16 at lse ~ 10),
    and that rounding is in every implementation's gradient, torch's too. Rows whose lse is not
    finite (±inf, NaN: the same in every precision) take autograd's value as is."""
    x64 = x.double().requires_grad_()
    lse64 = torch.logsumexp(x64, dims, keepdim)
    lse64.backward(dy.double())
    factor = torch.where(torch.isfinite(lse64), torch.exp(lse64.detach() - lse.double()), 1.0)
    if not keepdim:
        for d in dims:
            factor = factor.unsqueeze(d)
    return x64.grad * factor


def run_backward(c, x, dims, keepdim, dtype):
    lse = torch.logsumexp(x.float(), dims, keepdim).to(dtype)
    dy = fresh(lse.shape, dtype, 1.0)
    p = LogsumexpBackwardParams(dy, x, lse, dims, keepdim, nan_like(x.shape, dtype))
    why = c.supports(p)
    if why is not None:
        assert any(w in why for w in LAYOUT_WORDS), (c.name, x.shape, dims, why)
        return None
    assert c.run(p).data_ptr() == p.out.data_ptr()
    return p.out, autograd_reference(dy, x, lse, dims, keepdim)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("c", BACKWARD, ids=lambda c: c.name)
def test_backward_matches_float64_autograd(c, dtype):
    ran = 0
    for shape, dims in ROWS + COLUMNS:
        x = fresh(shape, dtype)
        for keepdim in (False, True):
            result = run_backward(c, x, dims, keepdim, dtype)
            if result is not None:
                ran += 1
                close(*result, dtype)
    for x, dims in ((special_rows(40, dtype), (1,)), (special_rows(40, dtype).t().contiguous(), (0,))):
        result = run_backward(c, x, dims, False, dtype)
        if result is not None:
            ran += 1
            close(*result, dtype)
    assert ran, f"{c.name} took none of the layouts"
    if dtype == torch.float32:  # straight against autograd: float32's lse rounding is within tolerance
        x = fresh((3, 33), dtype) if not isinstance(c, TritonBackwardColumns) else fresh((33, 3), dtype)
        dims = (1,) if not isinstance(c, TritonBackwardColumns) else (0,)
        dy = fresh((3,), dtype, 1.0)
        p = LogsumexpBackwardParams(dy, x, torch.logsumexp(x, dims), dims, False)
        x64 = x.double().requires_grad_()
        torch.logsumexp(x64, dims).backward(dy.double())
        close(c.run(p), x64.grad, dtype)


def test_declines_what_the_kernels_cannot_take(monkeypatch):
    rows, cols = FORWARD[0], next(c for c in FORWARD if isinstance(c, TritonColumns))
    brows, bcols = BACKWARD[0], next(c for c in BACKWARD if isinstance(c, TritonBackwardColumns))
    split = next(c for c in FORWARD if isinstance(c, TritonSplitRows))
    multi = next(c for c in FORWARD if c.rows_per_program > 1)
    x = torch.randn(8, 64, device=DEVICE)
    P = LogsumexpParams
    cases = [
        (rows, P(x, (0,)), "only"), (cols, P(x, (1,)), "only"), (rows, P(x.t(), (1,)), "contiguous"),
        (cols, P(torch.randn(3, 4, 5, device=DEVICE), (0, 2)), "adjacent"), (rows, P(x.double(), (1,)), "float32"),
        (rows, P(torch.randn(4, 0, device=DEVICE), (1,)), "non-empty"),
        (rows, P(x, (1,), False, torch.empty(8, device=DEVICE, dtype=torch.float16)), "dtype"),
        (rows, P(x, (1,), False, torch.empty(9, device=DEVICE)), "number of elements"),
        (split, P(x, (1,)), "split"), (multi, P(torch.randn(2, 4 * multi.block + 1, device=DEVICE), (1,)), "longer"),
        (rows, P(torch.empty(1, rows.block * tr.MAX_TERMS + 1, device=DEVICE, dtype=torch.float16), (1,)), "longer"),
    ]
    lse, lse0 = torch.logsumexp(x, 1), torch.logsumexp(x, 0)
    B = LogsumexpBackwardParams
    cases += [
        (brows, B(lse.float(), x.half(), lse.half(), (1,)), "dtype"),
        (brows, B(lse[:1].expand(8), x, lse, (1,)), "contiguous"),
        (brows, B(lse, x, torch.randn(8, 2, device=DEVICE)[:, 0], (1,)), "contiguous"),
        (brows, B(lse[:4], x, lse[:4], (1,)), "one value per result"),
        (brows, B(lse, x, lse, (1,), False, torch.empty(8, device=DEVICE)), "number of elements"),
        (bcols, B(lse, x, lse, (1,)), "only"), (brows, B(lse0, x, lse0, (0,)), "only"),
    ]
    for c, p, word in cases:
        why = c.supports(p)
        assert why is not None and word in why, (c.name, word, why)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert "CUDA" in rows.supports(P(x, (1,)))


def test_split_plan():
    """Few thousand programs, whole tiles, at most MAX_TERMS terms per lane, chunks cover the row."""
    for length, parallel, programs, tile in [(16 * 2**20, 4, 2112, 4096), (2**20, 64, 2112, 4096),
                                             (4096, 64, 2112, 32), (2**30, 1, 1, 1024), (5, 1, 100, 4)]:
        chunk, splits = tr.split(length, parallel, programs, tile)
        assert chunk % tile == 0 and chunk <= tile * tr.MAX_TERMS
        assert (splits - 1) * chunk < length <= splits * chunk
        if chunk < tile * tr.MAX_TERMS:  # not cut for accuracy: about ``programs`` in all, or one tile each
            assert parallel * splits < programs + parallel or chunk == tile
    assert tr.split(16 * 2**20, 4, 2112, 4096)[1] == 512  # 4 x 16M: 2048 programs of 8 tiles


# -- GPU sizes ------------------------------------------------------------------------------------
GPU_FORWARD = [((4, 16 * 2**20), (1,)), ((64, 2**20), (1,)), ((32768, 64), (1,)), ((4096, 4096), (1,)),
               ((4096, 4096), (0,)), ((32, 4096, 128), (1,)), ((3, 70001, 5), (1,)), ((1000, 3, 257), (1,))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_sizes(cuda, dtype):
    for shape, dims in GPU_FORWARD:
        x = (torch.randn(shape, device=cuda) * 3).to(dtype)
        expected = torch.logsumexp(x.double(), dims)
        taken = 0
        for c in FORWARD:
            p = LogsumexpParams(x, dims, False, torch.full(expected.shape, NAN, dtype=dtype, device=cuda))
            if c.supports(p) is None:
                taken += 1
                close(c.run(p), expected, dtype, x)
        assert taken, shape
        lse = torch.logsumexp(x.float(), dims).to(dtype)
        dy = torch.randn_like(lse)
        want = dy.double().unsqueeze(dims[0]) * torch.exp(x.double() - lse.double().unsqueeze(dims[0]))
        for c in BACKWARD:
            p = LogsumexpBackwardParams(dy, x, lse, dims, False, torch.full_like(x, NAN))
            if c.supports(p) is None:
                close(c.run(p), want, dtype)


@pytest.mark.gpu
def test_gpu_more_than_2_to_the_31_elements(cuda):
    """Offsets past 2^31 in every kernel: values that matter sit at the end of the input."""
    x = torch.full((2, 2**30 + 8), -INF, dtype=torch.float16, device=cuda)
    x[1, -3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)
    x[0, :2] = 0.5
    expected = torch.stack([torch.logsumexp(x[0, :2].double(), 0), torch.logsumexp(x[1, -3:].double(), 0)])
    for c in FORWARD:
        p = LogsumexpParams(x, (1,), False, torch.full((2,), NAN, dtype=torch.float16, device=cuda))
        if c.supports(p) is None:
            close(c.run(p), expected, torch.float16)
    lse = expected.half()
    for c in BACKWARD:
        p = LogsumexpBackwardParams(torch.ones_like(lse), x, lse, (1,), False)
        if c.supports(p) is None:
            dx = c.run(p)
            close(dx[1, -3:], torch.exp(x[1, -3:].double() - lse[1].double()), torch.float16)
            del dx
    del x
    x = torch.full((2**16 + 1, 2**15), -INF, dtype=torch.float16, device=cuda)  # dim 0, last row past 2^31
    x[-1, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)
    expected = torch.full((2**15,), -INF, dtype=torch.float64, device=cuda)
    expected[:3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, device=cuda)
    taken = 0
    for c in FORWARD:
        p = LogsumexpParams(x, (0,), False, torch.full((2**15,), NAN, dtype=torch.float16, device=cuda))
        if c.supports(p) is None:
            taken += 1
            close(c.run(p), expected, torch.float16)
    assert taken
    lse = expected.half()
    for c in BACKWARD:
        p = LogsumexpBackwardParams(torch.ones_like(lse), x, lse, (0,), False)
        if c.supports(p) is None:
            taken += 1
            dx = c.run(p)
            close(dx[-1, :3], torch.exp(x[-1, :3].double() - lse[:3].double()), torch.float16)
            del dx
    assert taken > 1
