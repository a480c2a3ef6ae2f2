"""tunekit.logsumexp and logsumexp_backward: every candidate against a float64 reference on fresh inputs
(outputs pre-filled with NaN), torch.logsumexp's semantics through the public function, autograd."""

import importlib
import math

import pytest
import torch

import tunekit
from elementwise_checks import DTYPES, triton_on_cpu
from tunekit.ops.logsumexp.cuda_forward import CudaColumns, CudaRows
from tunekit.ops.logsumexp.triton_forward import TritonRows
from tunekit.ops.logsumexp import (LogsumexpBackwardParams, LogsumexpParams, logsumexp_backward_op, logsumexp_op)
from tunekit.tunable import results_store
from reduction_checks import close

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
#: (shape, dims): rows (the last dim; the row lengths the issue names), trailing dims, columns
CASES = [((3, 1), (1,)), ((5, 31), (1,)), ((4, 33), (1,)), ((3, 1000), (1,)), ((2, 1025), (1,)), ((2, 4097), (1,)),
         ((2, 3, 33), (2,)), ((7,), (0,)), ((6, 200), (1,)), ((3, 4096), (1,)), ((3, 4, 40), (1, 2)),
         ((37, 5), (0,)), ((33, 64), (0,)), ((3, 50, 7), (1,)), ((2, 3, 4, 8), (1, 2)), ((4, 6, 8), (0,))]
LARGE = [((2, 2**20 + 1), (1,)), ((4099, 64), (1,)), ((3, 2**18), (1,)), ((4, 40000), (1,)), ((2, 3 * 2**16), (1,)),
         ((3000, 40), (0,)), ((3, 20000, 24), (1,)), ((2**18 + 3, 2), (0,)), ((3, 2**21 + 8), (1,))]
INTERPRETER_MAX_ELEMENTS = 20000


def cases(op, layouts):
    out = []
    for c in op.candidates:
        dtype = getattr(c, "dtype", None)
        runs = ([(d, "cpu") for d in DTYPES] if dtype is None else []) + \
               [(d, "cuda") for d in ([dtype] if dtype else DTYPES)]
        for d, device in runs:
            for shape, dims in layouts:
                triton_cpu = device == "cpu" and isinstance(c, TritonRows)
                if triton_cpu and math.prod(shape) > INTERPRETER_MAX_ELEMENTS:
                    continue
                marks = [pytest.mark.gpu] if device == "cuda" else []
                if triton_cpu and triton_on_cpu():
                    marks.append(pytest.mark.skip(reason=triton_on_cpu()))
                out.append(pytest.param(c.name, d, device, shape, dims, marks=marks,
                                        id=f"{c.name}-{str(d).removeprefix('torch.')}-{device}-{shape}-{dims}"))
    return out




def fresh(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, device=device) * scale).to(dtype)


def last(x):
    return (x.dim() - 1,)


def supported_or_skip(c, p):
    """Run only where the candidate takes the layout; test_every_candidate_is_exercised checks that
    each one takes some of the cases, so a skip here cannot hide a candidate entirely."""
    why = c.supports(p)
    if why is not None:
        pytest.skip(f"{c.name}: {why}")


@pytest.mark.parametrize("name, dtype, device, shape, dims", cases(logsumexp_op, CASES + LARGE))
def test_every_candidate_matches_float64(name, dtype, device, shape, dims):
    c = logsumexp_op.candidate(name)
    x = fresh(shape, dtype, device)
    supported_or_skip(c, LogsumexpParams(x, dims))
    for keepdim in (False, True):
        p = LogsumexpParams(x, dims, keepdim)
        out = torch.full(p.new_outputs()["out"].shape, float("nan"), dtype=dtype, device=device)
        p = LogsumexpParams(x, dims, keepdim, out)
        assert c.supports(p) is None, c.supports(p)
        assert c.run(p).data_ptr() == out.data_ptr()
        close(out, torch.logsumexp(x.double(), dims, keepdim), dtype, x)
    close(c.run(LogsumexpParams(x, dims)), torch.logsumexp(x.double(), dims), dtype, x)


def special_rows(rows, cols, dtype, device):
    """Rows of special values: +inf, all -inf, NaN, NaN with +inf, huge magnitudes, -inf mixed in."""
    huge = 6e4 if dtype == torch.float16 else 1e4
    x = fresh((rows, cols), torch.float32, device)
    x[0, 3] = float("inf")                     # +inf wins
    x[1] = -float("inf")                       # a row of -inf
    x[2, 5] = float("nan")                     # NaN propagates
    x[3, 7], x[3, cols - 2] = float("nan"), float("inf")  # NaN beats +inf
    x[4] = torch.linspace(-huge, huge, cols)   # huge magnitudes
    x[5, ::2] = -float("inf")                  # -inf mixed with finite values
    x[6, 0], x[6, cols - 1] = float("inf"), float("inf")
    x[7] = float("nan")                        # a row of NaN
    return x.to(dtype)


@pytest.mark.parametrize("name, dtype, device, shape, dims",
                         cases(logsumexp_op, [((8, 40), (1,)), ((40, 8), (0,)), ((8, 20000), (1,)), ((9000, 8), (0,)),
                                             ((8, 2**21 + 8), (1,))]))
def test_every_candidate_on_special_values(name, dtype, device, shape, dims):
    c = logsumexp_op.candidate(name)
    rows = special_rows(8, shape[1] if dims == (1,) else shape[0], dtype, device)
    x = rows if dims == (1,) else rows.t().contiguous()
    p = LogsumexpParams(x, dims, False, torch.full((8,), float("nan"), dtype=dtype, device=device))
    supported_or_skip(c, p)
    close(c.run(p), torch.logsumexp(x.double(), dims), dtype)


def _merged_candidates():
    """CUDA C candidates whose partials a second pass merges (launched as a dependent launch)."""
    return [c.name for c in logsumexp_op.candidates
            if isinstance(c, CudaColumns) or (isinstance(c, CudaRows) and c.split)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", _merged_candidates())
def test_split_candidates_replay_in_a_cuda_graph_on_new_inputs(name, cuda):
    """The merge pass starts before the first pass ends (programmatic dependent launch) and waits
    for its partials: captured in a CUDA graph and replayed on new inputs, every result is still
    the new inputs' (rows cut into up to 384 chunks: both merge kernels)."""
    c = logsumexp_op.candidate(name)
    shape, dims = ((4, 3 * 2**20), (1,)) if isinstance(c, CudaRows) else ((4096, 520), (0,))
    x = fresh(shape, c.dtype, cuda)
    out = torch.full((shape[1 - dims[0]],), float("nan"), dtype=c.dtype, device=cuda)
    p = LogsumexpParams(x, dims, False, out)
    supported_or_skip(c, p)
    c.run(p)  # loads the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c.run(p)
    for _ in range(3):
        x.copy_(fresh(shape, c.dtype, cuda))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(out, torch.logsumexp(x.double(), dims), c.dtype, x)


@pytest.mark.gpu
def test_merge_passes_are_dependent_launches_on_hopper(cuda):
    from tunekit.backends import cuda as cuda_backend, fast_launch

    if torch.cuda.get_device_capability(cuda) < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90")
    if fast_launch.load() is None:
        pytest.skip(f"launch extension unavailable: {fast_launch.unavailable()}")
    assert cuda_backend._dependent_launch(torch.cuda.current_device()) is not None


def backward_expected(dy, x, lse, dims, keepdim):
    if not keepdim:
        for d in dims:
            dy, lse = dy.unsqueeze(d), lse.unsqueeze(d)
    return dy.double() * torch.exp(x.double() - lse.double())


@pytest.mark.parametrize("name, dtype, device, shape, dims", cases(logsumexp_backward_op, [
    ((5, 31), (1,)), ((2, 4097), (1,)), ((2, 3, 33), (2,)), ((37, 5), (0,)), ((3, 50, 8), (1,)),
    ((2, 3, 4, 8), (1, 2)), ((4, 2**18 + 8), (1,)), ((3000, 40), (0,))]))
def test_every_backward_candidate_matches_float64(name, dtype, device, shape, dims):
    c = logsumexp_backward_op.candidate(name)
    x = fresh(shape, dtype, device)
    for keepdim in (False, True):
        lse = torch.logsumexp(x.float(), dims, keepdim).to(dtype)
        dy = fresh(lse.shape, dtype, device, 1.0)
        out = torch.full_like(x, float("nan"))
        p = LogsumexpBackwardParams(dy, x, lse, dims, keepdim, out)
        supported_or_skip(c, p)
        assert c.run(p).data_ptr() == out.data_ptr()
        close(out, backward_expected(dy, x, lse, dims, keepdim), dtype)


@pytest.mark.parametrize("name, dtype, device, shape, dims",
                         cases(logsumexp_backward_op, [((8, 2048), (1,)), ((2048, 8), (0,))]))
def test_every_backward_candidate_on_special_values(name, dtype, device, shape, dims):
    """+inf, -inf, NaN and huge magnitudes in x give what torch's composite gives (exp(inf - inf) = NaN)."""
    c = logsumexp_backward_op.candidate(name)
    rows = special_rows(8, shape[1] if dims == (1,) else shape[0], dtype, device)
    x = rows if dims == (1,) else rows.t().contiguous()
    lse = torch.logsumexp(x.float(), dims).to(dtype)
    dy = fresh(lse.shape, dtype, device, 1.0)
    p = LogsumexpBackwardParams(dy, x, lse, dims, False, torch.full_like(x, float("nan")))
    supported_or_skip(c, p)
    close(c.run(p), backward_expected(dy, x, lse, dims, False), dtype)


@pytest.mark.gpu
def test_every_candidate_is_exercised(cuda):
    """Each candidate takes at least one of the test layouts (so the skips above hide none)."""
    for op, make in ((logsumexp_op, lambda x, dims: LogsumexpParams(x, dims)),
                     (logsumexp_backward_op, lambda x, dims: LogsumexpBackwardParams(
                         *(lambda lse: (lse, x, lse))(torch.logsumexp(x, dims)), dims))):
        for c in op.candidates:
            dtypes = [c.dtype] if getattr(c, "dtype", None) else DTYPES
            taken = [(shape, dims) for d in dtypes for shape, dims in CASES + LARGE
                     if c.supports(make(fresh(shape, d, cuda), dims)) is None]
            assert taken, f"{c.name} takes none of the test layouts"


def test_layouts_the_kernels_cannot_take_are_declined_with_reasons():
    x = torch.randn(8, 64)
    reasons = {
        "adjacent": LogsumexpParams(torch.randn(3, 4, 5), (0, 2)),
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


@pytest.mark.parametrize("keepdim", [False, True])
def test_the_backward_of_a_0d_input_is_0d(keepdim):
    """logsumexp_backward called directly on a 0-d input (dim 0 or -1) keeps the input's shape, as
    autograd's gradient does (it was 1-d: the reduced dim was unsqueezed back onto a 0-d lse)."""
    x = torch.tensor(1.5, requires_grad=True)
    lse = torch.logsumexp(x, 0, keepdim)
    lse.backward(torch.tensor(0.75))
    for dim in (0, -1):
        got = tunekit.logsumexp_backward(torch.tensor(0.75), x.detach(), lse.detach(), dim, keepdim)
        assert got.shape == x.shape == torch.Size([])
        torch.testing.assert_close(got, x.grad)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_float16_reduction_of_more_than_65504_terms_is_finite(device):
    """torch's composite sums exp(x - max) into a float16 tensor and returns inf past 65504 terms
    (FlagGems' 200 x 40999 x 3 over dims 0 and 1 met it); tunekit's default, the reference its
    candidates are checked against, and every candidate that runs give the float64 result."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = (1 + 0.01 * torch.randn(35000, 2, 3, device=device)).half()
    ref = torch.logsumexp(x.double(), (0, 1))
    assert torch.isinf(torch.logsumexp(x, (0, 1))).all()  # why the default needs its float32 path
    torch.testing.assert_close(tunekit.logsumexp(x, (0, 1)), ref.half(), atol=1e-2, rtol=1e-3)
    p = LogsumexpParams(x, (0, 1), False)
    for c in logsumexp_op.candidates:
        if c.supports(p) is None:
            out = torch.full((3,), float("nan"), dtype=x.dtype, device=device)
            torch.testing.assert_close(c.run(p.replace(out=out)), ref.half(), atol=1e-2, rtol=1e-3, msg=c.name)


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


def _logsumexp_forms():
    """name -> a function making fresh (args, kwargs) of one call of ``torch.logsumexp``."""
    x = lambda: torch.randn(4, 6) * 3  # noqa: E731
    nan = lambda *shape, dtype=torch.float32: torch.full(shape, float("nan"), dtype=dtype)  # noqa: E731
    return {
        "keepdim-int": lambda: ((x(), 1, 1), {}),
        "keepdim-none": lambda: ((x(), 1), {"keepdim": None}),
        "keepdim-str": lambda: ((x(), 1), {"keepdim": "yes"}),
        "dim-missing": lambda: ((x(),), {}),
        "dim-none": lambda: ((x(), None), {}),
        "dim-bool": lambda: ((x(), True), {}),
        "dim-repeated": lambda: ((x(), (1, -1)), {}),
        "dim-out-of-range": lambda: ((x(), 2), {}),
        "dim-empty": lambda: ((x(), ()), {}),
        "dim-empty-keepdim": lambda: ((x(), [], True), {}),
        "keywords": lambda: ((), {"input": x(), "dim": [0, 1], "keepdim": True}),
        "integer": lambda: ((torch.arange(12).view(3, 4), 1), {}),
        "bool": lambda: ((torch.ones(3, 4, dtype=torch.bool), 0), {}),
        "complex": lambda: ((torch.randn(3, 4, dtype=torch.complex64), 1), {}),
        "meta": lambda: ((torch.randn(3, 4, device="meta"), 1), {}),
        "out": lambda: ((x(), 1), {"out": nan(4)}),
        "out-keepdim": lambda: ((x(), (0, 1), True), {"out": nan(1, 1)}),
        "out-strided": lambda: ((x(), 1), {"out": nan(8)[::2]}),
        "out-of-another-shape": lambda: ((x(), 1), {"out": nan(5)}),
        "empty-out": lambda: ((x(), 1), {"out": torch.empty(0)}),
        "out-float64": lambda: ((x(), 1), {"out": nan(4, dtype=torch.float64)}),
        "out-float16": lambda: ((x(), 1), {"out": nan(4, dtype=torch.float16)}),
        "out-integer": lambda: ((x(), 1), {"out": torch.zeros(4, dtype=torch.long)}),
        "integer-into-float-out": lambda: ((torch.arange(12).view(3, 4), 1), {"out": nan(3)}),
        "expanded-out": lambda: ((x(), 1), {"out": torch.empty(1).expand(4)}),
        "out-in-input": lambda: (lambda t: ((t, 1), {"out": t[0, :4]}))(x()),
        "out-with-grad": lambda: ((x().requires_grad_(), 1), {"out": nan(4)}),
        "out-not-a-tensor": lambda: ((x(), 1), {"out": [0.0] * 4}),
    }


@pytest.mark.parametrize("form", list(_logsumexp_forms()))
def test_torch_forms_give_torchs_result_warning_or_exception_type(form):
    """Whatever torch.logsumexp does with a call, tunekit.logsumexp does (tunekit hands the forms it
    does not compute to torch's own function): its value, its resize warning, its exception type."""
    from elementwise_checks import assert_same_outcome, outcome, twice
    (targs, tkwargs), (args, kwargs) = twice(_logsumexp_forms()[form])
    theirs = outcome(torch.logsumexp, *targs, **tkwargs)
    ours = outcome(tunekit.logsumexp, *args, **kwargs)
    assert_same_outcome(ours, theirs, (2e-6, 2e-6), form)
    if "out" in kwargs and ours.error is None:
        assert ours.returned is kwargs["out"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_of_the_result_layout_is_written_by_the_tuned_op(dtype, monkeypatch):
    """An ``out`` of the result's shape, dtype and device is tunekit's to write (the tunable op with
    ``out`` in its params: tuning writes trial copies, the choice writes ``out``)."""
    module = importlib.import_module("tunekit.ops.logsumexp.op")
    seen = []
    monkeypatch.setattr(module, "_logsumexp_call", lambda p: seen.append(p) or logsumexp_op.call(p))
    x = fresh((9, 70), dtype, "cpu")
    for dim, keepdim in ((1, False), (0, True), ((0, 1), False)):
        expected = torch.logsumexp(x.double(), dim, keepdim)
        out = torch.full(expected.shape, float("nan"), dtype=dtype)
        assert tunekit.logsumexp(x, dim, keepdim, out=out) is out
        close(out, expected, dtype, x)
        assert seen[-1].out is out
    assert len(seen) == 3


@pytest.mark.parametrize("keepdim", [False, True])
def test_an_empty_dim_list_is_torchs_own_call(keepdim, recwarn, monkeypatch):
    """dim=() means whatever torch makes of it (torch 2.x: an error without keepdim, all dims with
    it), without tuning: an output shaped for "no reduction" once drew torch's resize warning."""
    module = importlib.import_module("tunekit.ops.logsumexp.op")

    def tuned(p):
        raise AssertionError(f"tuned op called for dims {p.dims}")

    monkeypatch.setattr(module, "_logsumexp_call", tuned)
    x = torch.randn(3, 4)
    try:
        expected = torch.logsumexp(x, (), keepdim)
    except RuntimeError as e:
        with pytest.raises(type(e)):
            tunekit.logsumexp(x, (), keepdim)
    else:
        torch.testing.assert_close(tunekit.logsumexp(x, (), keepdim), expected)
    assert not [w for w in recwarn if "resized" in str(w.message)]
    with pytest.raises(AssertionError, match="tuned op called"):  # the stand-in is live: dim=1 reaches it
        tunekit.logsumexp(x, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
def test_gradients_match_float64_torch(dtype, device):
    x = fresh((37, 1772), dtype, device).requires_grad_()  # above TORCH_NODE_MAX_NUMEL: the tuned gradient
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
