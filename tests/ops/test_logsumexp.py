"""tunekit.logsumexp and logsumexp_backward: every candidate against a float64 reference on fresh inputs
(outputs pre-filled with NaN), torch.logsumexp's semantics through the public function, autograd."""

import math

import pytest
import torch

import tunekit
from elementwise_checks import DTYPES, triton_on_cpu
from tunekit.ops._rows import CudaRows
from tunekit.ops._triton_rows import TritonRows
from tunekit.ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, logsumexp_backward_op, logsumexp_op)
from tunekit.tunable import results_store
from tunekit.tunable.numerics import compare, tolerance

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
#: (rows, cols) and one 3-D shape, reduced over the last dim; the row lengths the issue names
SHAPES = [(3, 1), (5, 31), (4, 33), (3, 1000), (2, 1025), (2, 4097), (2, 3, 33), (7,), (6, 200), (3, 4096)]
LARGE = [(2, 2**20 + 1), (4099, 64), (3, 2**18)]
INTERPRETER_MAX_ELEMENTS = 20000


def cases(op, shapes):
    out = []
    for c in op.candidates:
        dtype = getattr(c, "dtype", None)
        runs = ([(d, "cpu") for d in DTYPES] if dtype is None else []) + \
               [(d, "cuda") for d in ([dtype] if dtype else DTYPES)]
        for d, device in runs:
            for shape in shapes:
                if isinstance(c, CudaRows) and (shape[-1] % c.vec or shape[-1] > c.max_cols):
                    continue  # declined by design (tested in test_cuda_forms_decline_...)
                triton_cpu = device == "cpu" and isinstance(c, TritonRows)
                if triton_cpu and math.prod(shape) > INTERPRETER_MAX_ELEMENTS:
                    continue
                marks = [pytest.mark.gpu] if device == "cuda" else []
                if triton_cpu and triton_on_cpu():
                    marks.append(pytest.mark.skip(reason=triton_on_cpu()))
                out.append(pytest.param(c.name, d, device, shape, marks=marks,
                                        id=f"{c.name}-{str(d).removeprefix('torch.')}-{device}-{shape}"))
    return out


def close(actual, expected, dtype, x=None):
    """Within the dtype's tolerance; for logsumexp values (``x`` given) also within rtol x max|x|:
    lse = max + log(sum) cancels when the result is near 0, so its error scales with the inputs'
    magnitude, not the result's (torch's own float16 result is off by 4e-4 at lse ~ 0.03)."""
    rtol, atol = tolerance(dtype)
    if x is not None:
        finite = x[torch.isfinite(x)]
        atol = max(atol, rtol * float(finite.abs().max())) if finite.numel() else atol
    problem = compare(actual, expected.to(dtype), (rtol * 1.5, atol))
    assert problem is None, problem


def fresh(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, device=device) * scale).to(dtype)


def last(x):
    return (x.dim() - 1,)


@pytest.mark.parametrize("name, dtype, device, shape", cases(logsumexp_op, SHAPES + LARGE))
def test_every_candidate_matches_float64(name, dtype, device, shape):
    c = logsumexp_op.candidate(name)
    x = fresh(shape, dtype, device)
    for keepdim in (False, True):
        p = LogsumexpParams(x, last(x), keepdim)
        out = torch.full(p.new_outputs()["out"].shape, float("nan"), dtype=dtype, device=device)
        p = LogsumexpParams(x, last(x), keepdim, out)
        assert c.supports(p) is None, c.supports(p)
        assert c.run(p).data_ptr() == out.data_ptr()
        close(out, torch.logsumexp(x.double(), -1, keepdim), dtype, x)
    close(c.run(LogsumexpParams(x, last(x))), torch.logsumexp(x.double(), -1), dtype, x)


@pytest.mark.parametrize("name, dtype, device, shape", cases(logsumexp_op, [(6, 40)]))
def test_every_candidate_on_special_values(name, dtype, device, shape):
    c = logsumexp_op.candidate(name)
    huge = 6e4 if dtype == torch.float16 else 1e4
    x = fresh(shape, torch.float32, device)
    x[0, 3] = float("inf")                     # +inf wins
    x[1] = -float("inf")                       # a row of -inf
    x[2, 5] = float("nan")                     # NaN propagates
    x[3, 7], x[3, 9] = float("nan"), float("inf")  # NaN beats +inf
    x[4] = torch.linspace(-huge, huge, shape[1])   # huge magnitudes
    x[5, ::2] = -float("inf")                  # -inf mixed with finite values
    x = x.to(dtype)
    p = LogsumexpParams(x, (1,), False, torch.full((shape[0],), float("nan"), dtype=dtype, device=device))
    assert c.supports(p) is None
    close(c.run(p), torch.logsumexp(x.double(), 1), dtype)


@pytest.mark.parametrize("name, dtype, device, shape", cases(logsumexp_backward_op, [(5, 31), (2, 4097), (2, 3, 33)]))
def test_every_backward_candidate_matches_float64(name, dtype, device, shape):
    c = logsumexp_backward_op.candidate(name)
    x = fresh(shape, dtype, device)
    lse = torch.logsumexp(x.float(), -1).to(dtype)
    dy = fresh(lse.shape, dtype, device, 1.0)
    out = torch.full_like(x, float("nan"))
    p = LogsumexpBackwardParams(dy, x, lse, last(x), False, out)
    assert c.supports(p) is None, c.supports(p)
    c.run(p)
    expected = dy.double().unsqueeze(-1) * torch.exp(x.double() - lse.double().unsqueeze(-1))
    close(out, expected, dtype)


def test_layouts_the_kernels_cannot_take_are_declined_with_reasons():
    x = torch.randn(8, 64)
    reasons = {
        "reduces the last dimension only": LogsumexpParams(x, (0,)),
        "contiguous": LogsumexpParams(x.t(), (1,)),
        "non-empty": LogsumexpParams(torch.randn(4, 0), (1,)),
        "float32, float16 or bfloat16": LogsumexpParams(x.double(), (1,)),
    }
    for c in logsumexp_op.candidates:
        if c is logsumexp_op.default:
            continue
        for word, p in reasons.items():
            why = c.supports(p)
            assert why is not None and (word in why or "CUDA" in why or "only" in why), (c.name, why)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_public_logsumexp_has_torch_semantics(dtype, device):
    for shape, dim, keepdim in [((64, 33), 1, False), ((64, 33), 0, True), ((4, 5, 6), (0, 2), False),
                                ((4, 5, 6), -2, True), ((2, 3, 4, 5), (1, 3), False), ((2, 3, 4, 5), 3, False)]:
        x = fresh(shape, dtype, device)
        got = tunekit.logsumexp(x, dim, keepdim)
        want = torch.logsumexp(x, dim, keepdim)
        assert got.shape == want.shape and got.dtype == want.dtype
        close(got, torch.logsumexp(x.double(), dim, keepdim), dtype, x)
    base = fresh((1 + 40 * 33,), dtype, device)
    misaligned = base[1:].view(40, 33)  # contiguous, pointer 2 or 4 bytes off 16
    close(tunekit.logsumexp(misaligned, 1), torch.logsumexp(misaligned.double(), 1), dtype, misaligned)
    strided = fresh((40, 66), dtype, device)[:, ::2]
    close(tunekit.logsumexp(strided, 1), torch.logsumexp(strided.double(), 1), dtype, strided)
    assert len(results_store().entries("logsumexp")) >= 1


def test_edge_cases_follow_torch():
    assert tunekit.logsumexp(torch.tensor(2.5), 0).item() == 2.5                     # 0-d
    assert tunekit.logsumexp(torch.tensor(2.5), -1, keepdim=True).shape == torch.Size([])
    empty = tunekit.logsumexp(torch.randn(3, 0), 1)                                  # empty reduction
    assert empty.shape == (3,) and torch.all(empty == -float("inf"))
    ints = torch.arange(6).view(2, 3)
    torch.testing.assert_close(tunekit.logsumexp(ints, 1), torch.logsumexp(ints, 1))  # torch's promotion
    with pytest.raises((IndexError, RuntimeError)):
        tunekit.logsumexp(torch.randn(3, 4), 2)                                      # torch's own error
    with pytest.raises(RuntimeError):
        tunekit.logsumexp(torch.randn(3, 4), (1, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
def test_gradients_match_float64_torch(dtype, device):
    x = fresh((37, 65), dtype, device).requires_grad_()
    y = tunekit.logsumexp(x, 1)
    assert "LogsumexpFunction" in type(y.grad_fn).__name__
    dy = fresh((37,), dtype, device, 1.0)
    y.backward(dy)
    close(y, torch.logsumexp(x.detach().double(), 1), dtype, x.detach())
    # The gradient is dy * exp(x - lse) with the lse the forward returned: in 16-bit types that
    # rounding (half an ulp of lse, 0.4% in float16 at lse ~ 10) is in every gradient, torch's too,
    # so the float64 reference starts from the same rounded lse.
    expected = dy.double().unsqueeze(1) * torch.exp(x.detach().double() - y.detach().double().unsqueeze(1))
    close(x.grad, expected, dtype)
    x64 = x.detach().double().requires_grad_()
    torch.logsumexp(x64, 1).backward(dy.double())
    if dtype in (torch.float32, torch.float64):
        close(x.grad, x64.grad, dtype)
    assert len(results_store().entries("logsumexp_backward")) == 1


def test_gradcheck_and_double_backward_in_float64():
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    for dim, keepdim in ((1, False), ((0, 1), False), (0, True)):
        fn = lambda t: tunekit.logsumexp(t, dim, keepdim)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements(cuda):
    rows, cols = 2, 2**30 + 8
    x = torch.full((rows, cols), -float("inf"), dtype=torch.float16, device=cuda)
    x[1, -3:] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=cuda)  # past element 2^31
    x[0, :4] = torch.tensor([0.5, 1.5, -2.0, 0.0], dtype=torch.float16, device=cuda)
    expected = torch.stack([torch.logsumexp(x[0, :4].double(), 0), torch.logsumexp(x[1, -3:].double(), 0)])
    for name in ("logsumexp_block_f16_vec", "logsumexp_warp_f16", "logsumexp_triton_b4096_w8"):
        out = torch.full((rows,), float("nan"), dtype=torch.float16, device=cuda)
        logsumexp_op.candidate(name).run(LogsumexpParams(x, (1,), False, out))
        close(out, expected, torch.float16)


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
    assert CudaRows in kinds and TritonRows in kinds
