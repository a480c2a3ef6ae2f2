"""tunekit.mm / addmm / addmm_ / bmm / baddbmm / matmul / linear / linear_act: torch's semantics.

- tuning off: the default runs, which is torch's kernel: results equal torch's bit for bit, in every
  dtype, layout (transposed, strided, misaligned views), odd sizes, empty results, K = 0, NaN / inf,
  batch broadcasting, ``out=``;
- a Triton candidate forced in: the same calls within the GEMM bound of a float64 reference (the
  public functions' folding, views and out= handling around a kernel that is not torch's);
- bad input: torch's exception type and message (the call goes to torch itself);
- tuning on: a first call tunes (interpreter candidates on the CPU) and every call is right.
"""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from gemm_checks import ACTS, DTYPES, check, matrix, nans, randn, triton_on_cpu
from tunekit.ops.gemm import TritonGemm, addmm_op, mm_op
from tunekit.tunable.config import Config
from tunekit.tunable.tunable_op import Resolution

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
needs_triton = pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(),
                                  reason=str(triton_on_cpu()))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(7, 33, 65), (1, 1, 1), (33, 7, 17), (16, 64, 32)]
LAYOUTS = ["row", "col", "sliced", "misaligned"]


@pytest.fixture
def untuned():
    with tunekit.tuning(tuning=False):
        yield


@pytest.fixture
def forced(monkeypatch):
    """Every GEMM call runs a small Triton configuration (where it can run), whatever its speed."""
    candidate = TritonGemm("matmul", Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=1,
                                            num_warps=4, num_stages=2))
    ran = []

    def resolve(op):
        def fixed(params, s=None, **kw):
            chosen = candidate if candidate.cannot_run(params) is None else op.default
            ran.append(chosen is candidate)
            return Resolution(chosen, "forced by the test", params.signature(), DEVICE)
        return fixed

    for op in (mm_op, addmm_op):
        monkeypatch.setattr(op, "resolve", resolve(op))
        op.forget()
    yield ran
    for op in (mm_op, addmm_op):
        op.forget()


def same(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.nan_to_num(1.5, 2.5, -2.5), expected.nan_to_num(1.5, 2.5, -2.5))


# -- tuning off: torch's results exactly ----------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mm_and_addmm_equal_torch(shape, dtype, untuned):
    M, N, K = shape
    for la in LAYOUTS:
        for lb in LAYOUTS:
            a, b = matrix(M, K, dtype, layout=la), matrix(K, N, dtype, layout=lb, seed=1)
            same(tunekit.mm(a, b), torch.mm(a, b))
            c = randn((M, N), dtype, seed=2)
            same(tunekit.addmm(c, a, b, beta=0.5, alpha=-2), torch.addmm(c, a, b, beta=0.5, alpha=-2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batched_and_broadcast_forms_equal_torch(dtype, untuned):
    a, b = matrix(5, 12, dtype, batch=3), matrix(12, 7, dtype, seed=1, batch=3)
    same(tunekit.bmm(a, b), torch.bmm(a, b))
    for c in (randn((3, 5, 7), dtype, seed=2), randn(7, dtype, seed=3), randn((5, 1), dtype, seed=4)):
        same(tunekit.baddbmm(c, a, b, alpha=0.5), torch.baddbmm(c, a, b, alpha=0.5))
    for c in (randn(7, dtype, seed=3), randn((1, 7), dtype, seed=4), randn((5, 1), dtype), randn((), dtype)):
        same(tunekit.addmm(c, a[0], b[0]), torch.addmm(c, a[0], b[0]))
    same(tunekit.matmul(a, b), torch.matmul(a, b))
    same(tunekit.matmul(a, b[:1]), torch.matmul(a, b[:1].expand(3, 12, 7)))  # batch broadcast
    x4 = matrix(5, 12, dtype, batch=6).view(2, 3, 5, 12)
    same(tunekit.matmul(x4, b[0]), torch.matmul(x4, b[0]))  # N-D @ 2-D, folded
    same(tunekit.matmul(x4.transpose(0, 1), b[0]), torch.matmul(x4.transpose(0, 1), b[0]))
    same(tunekit.matmul(x4, x4.mT), torch.matmul(x4, x4.mT))  # 4-D @ 4-D: torch's
    v = randn(12, dtype)
    same(tunekit.matmul(a[0], v), torch.matmul(a[0], v))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_equals_torch(dtype, untuned):
    w, bias = matrix(9, 24, dtype), randn(9, dtype, seed=5)
    for x in (matrix(7, 24, dtype, seed=1), matrix(7, 24, dtype, layout="col", seed=1), matrix(35, 24, dtype).view(5, 7, 24),
              matrix(7, 24, dtype, batch=10).view(2, 5, 7, 24), matrix(7, 24, dtype, batch=5).transpose(0, 1),
              randn(24, dtype)):
        same(tunekit.linear(x, w), F.linear(x, w))
        same(tunekit.linear(x, w, bias), F.linear(x, w, bias) if x.dim() != 3 or x.is_contiguous()
             else torch.addmm(bias, x.reshape(-1, 24), w.t()).view(*x.shape[:-1], 9))
    for act in ACTS:
        x = matrix(7, 24, dtype, seed=1)
        same(tunekit.linear_act(x, w, bias, act), ACTS[act](F.linear(x, w, bias)))


def test_edge_sizes_and_values_equal_torch(untuned):
    for M, N, K in ((0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0)):
        a, b, c = randn((M, K)), randn((K, N), seed=1), randn((M, N), seed=2)
        same(tunekit.mm(a, b), torch.mm(a, b))
        same(tunekit.addmm(c, a, b, beta=3), torch.addmm(c, a, b, beta=3))
    a, b = randn((4, 8)), randn((8, 6), seed=1)
    a[0, 0], b[3, 2] = float("nan"), float("inf")
    same(tunekit.mm(a, b), torch.mm(a, b))
    c = nans((4, 6), torch.float32)
    same(tunekit.addmm(c, a, b, beta=0), torch.addmm(c, a, b, beta=0))
    same(tunekit.addmm(randn((4, 6)), a, b, alpha=0), torch.addmm(randn((4, 6)), a, b, alpha=0))


def test_out_forms(untuned):
    a, b, c = randn((6, 8)), randn((8, 5), seed=1), randn((6, 5), seed=2)
    layouts = (lambda: nans((6, 5), torch.float32), lambda: nans((5, 6), torch.float32).t(),
               lambda: nans((6, 10), torch.float32)[:, ::2])
    for make in layouts:  # torch's result into an out of the same layout (its own kernel choice there)
        out, theirs = make(), make()
        assert tunekit.mm(a, b, out=out) is out
        same(out, torch.mm(a, b, out=theirs))
        assert tunekit.addmm(c, a, b, out=out, beta=2) is out
        same(out, torch.addmm(c, a, b, beta=2, out=theirs))
    out = torch.empty(0)
    with pytest.warns(UserWarning):  # torch resizes a non-empty out of another shape, with a warning
        tunekit.mm(a, b, out=torch.empty(3))
    assert tunekit.mm(a, b, out=out) is out and same(out, torch.mm(a, b)) is None
    a3, b3 = randn((2, 6, 8)), randn((2, 8, 5), seed=1)
    out = nans((2, 6, 5), torch.float32)
    assert tunekit.bmm(a3, b3, out=out) is out and same(out, torch.bmm(a3, b3)) is None
    assert tunekit.baddbmm(out.clone(), a3, b3, out=out) is out


def test_addmm_in_place(untuned):
    a, b = randn((6, 8)), randn((8, 5), seed=1)
    c = randn((6, 5), seed=2)
    expected = c.clone().addmm_(a, b, beta=0.5, alpha=2)
    assert tunekit.addmm_(c, a, b, beta=0.5, alpha=2) is c
    same(c, expected)
    # an expanded input (stride 0) cannot take one update per element: torch's own behaviour, whatever it is
    ours, theirs = randn(5).expand(6, 5), randn(5).expand(6, 5)
    assert raised(lambda: tunekit.addmm_(ours, a, b)) == raised(lambda: theirs.addmm_(a, b))
    same(ours, theirs)


# -- errors: torch's own ----------------------------------------------------------------------------
def raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the point is to compare whatever is raised
        return type(exc), str(exc)
    return None


BAD = [
    ("mm shapes", lambda m: m.mm(randn((3, 4)), randn((5, 6)))),
    ("mm dtypes", lambda m: m.mm(randn((3, 4)), randn((4, 6)).half())),
    ("mm dims", lambda m: m.mm(randn((2, 3, 4)), randn((4, 6)))),
    ("mm ints", lambda m: m.mm(torch.ones(3, 4, dtype=torch.int64), torch.ones(4, 2, dtype=torch.int64))),
    ("addmm input", lambda m: m.addmm(randn((2, 5)), randn((3, 4)), randn((4, 5)))),
    ("addmm dtype", lambda m: m.addmm(randn(5).double(), randn((3, 4)), randn((4, 5)))),
    ("bmm batch", lambda m: m.bmm(randn((2, 3, 4)), randn((3, 4, 5)))),
    ("bmm shapes", lambda m: m.bmm(randn((2, 3, 4)), randn((2, 5, 5)))),
    ("baddbmm input", lambda m: m.baddbmm(randn((3, 3, 5)), randn((2, 3, 4)), randn((2, 4, 5)))),
    ("matmul shapes", lambda m: m.matmul(randn((2, 3, 4)), randn((5, 6)))),
    ("linear shapes", lambda m: m.linear(randn((3, 4)), randn((6, 5)))),
    ("linear bias", lambda m: m.linear(randn((3, 4)), randn((6, 4)), randn(5))),
    ("linear dtype", lambda m: m.linear(randn((3, 4)).half(), randn((6, 4)))),
    ("out dtype", lambda m: m.mm(randn((3, 4)), randn((4, 2)), out=torch.empty(3, 2, dtype=torch.float16))),
    ("out grad", lambda m: m.mm(randn((3, 4)), randn((4, 2)), out=torch.empty(3, 2, requires_grad=True))),
    ("addmm_ leaf", lambda m: m.addmm_(randn((3, 2)).requires_grad_(), randn((3, 4)), randn((4, 2)))
     if m is tunekit else randn((3, 2)).requires_grad_().addmm_(randn((3, 4)), randn((4, 2)))),
]


class _Torch:
    mm, addmm, bmm, baddbmm, matmul = torch.mm, torch.addmm, torch.bmm, torch.baddbmm, torch.matmul
    linear = staticmethod(F.linear)


@pytest.mark.parametrize("name, call", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_torchs_error(name, call):
    expected = raised(lambda: call(_Torch))
    got = raised(lambda: call(tunekit))
    if name == "mm ints":  # torch computes integer mm on the CPU; tunekit hands it over: same result
        assert expected is None and got is None
        return
    assert expected is not None and got == expected
    if name == "mm shapes":
        assert "mat1 and mat2 shapes cannot be multiplied" in got[1]


def test_linear_act_rejects_unknown_activations():
    with pytest.raises(ValueError, match="activation must be one of"):
        tunekit.linear_act(randn((3, 4)), randn((5, 4)), activation="tanh")


# -- a Triton candidate in the public functions -----------------------------------------------------
@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_functions_with_a_triton_candidate(dtype, forced):
    M, N, K = 9, 20, 33
    a, b = matrix(M, K, dtype, DEVICE), matrix(K, N, dtype, DEVICE, "col", seed=1)
    c, bias = randn((M, N), dtype, DEVICE, seed=2), randn(N, dtype, DEVICE, seed=3)
    check(tunekit.mm(a, b), a, b)
    check(tunekit.addmm(c, a, b, beta=0.5, alpha=2), a, b, c, 2.0, 0.5)
    a3, b3 = matrix(M, K, dtype, DEVICE, batch=2), matrix(K, N, dtype, DEVICE, "sliced", seed=4, batch=2)
    check(tunekit.bmm(a3, b3), a3, b3)
    check(tunekit.baddbmm(bias, a3, b3, beta=-1), a3, b3, bias, 1.0, -1.0)
    check(tunekit.matmul(a3, b3[:1]), a3, b3[:1].expand(2, K, N))
    x = matrix(M * 2, K, dtype, DEVICE, seed=5).view(2, M, K)
    w = matrix(N, K, dtype, DEVICE, seed=6)
    check(tunekit.linear(x, w, bias), x, w.t(), bias)
    check(tunekit.linear(x.transpose(0, 1), w), x.transpose(0, 1), w.t())
    for act in ACTS:
        check(tunekit.linear_act(x, w, bias, act), x, w.t(), bias, act=act)
    out = nans((M, N), dtype, DEVICE)
    assert tunekit.mm(a, b, out=out) is out
    check(out, a, b)
    cc = c.clone()
    assert tunekit.addmm_(cc, a, b, alpha=0.5) is cc
    check(cc, a, b, c, 0.5)
    assert all(forced)


# -- tuning on -------------------------------------------------------------------------------------
@needs_triton
def test_tuning_on_gives_right_results_and_one_in_place_update():
    """First calls tune (the session runs candidates on copies); every call's result is right and an
    in-place addmm_ updates its input exactly once per call."""
    M, N, K = 20, 32, 48
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, seed=1)
    c0 = randn((M, N), torch.bfloat16, DEVICE, seed=2)
    with tunekit.tuning(results=":memory:", max_tuning_ms=3000, tuning_step_ms=float("inf")):
        for _ in range(2):
            check(tunekit.mm(a, b), a, b)
            c = c0.clone()
            assert tunekit.addmm_(c, a, b, beta=1, alpha=1) is c
            check(c, a, b, c0)
        r = addmm_op.decision(tunekit.ops.gemm.AddmmParams(c, a, b, out=c))
    assert r is not None and r.entry is not None and r.entry.complete


@needs_triton
def test_writes_bump_the_version_counter_as_torch_does(forced):
    """A tensor autograd saved and a Triton kernel then overwrote (out=, addmm_) is caught at backward,
    as torch's own in-place writes are."""
    w = randn((6, 5), seed=3).requires_grad_()
    for write in (lambda c, a, b: tunekit.addmm_(c, a, b), lambda c, a, b: tunekit.mm(a, b, out=c)):
        a, b, c = randn((6, 8)), randn((8, 5), seed=1), randn((6, 5), seed=2)
        y = (w * c).sum()  # saves c for the backward
        before = c._version
        write(c, a, b)
        assert c._version > before
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
    assert forced and all(forced)
