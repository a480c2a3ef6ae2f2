"""The padded-copy candidates with a copy kernel of their own (``ops/gemm/triton_padded_rows.py``): the copy
(``kernels/triton/pad_rows.py``) against torch's for every layout it takes (row- and column-major, batches, a batch
broadcast, misaligned bases, padded leading dimensions, sliced views left to torch, empty), each configuration once
against a float64 reference, the epilogue forms, in place, NaN / inf, where mm lists them (before the padded kind,
so online tuning compiles them first) and their hashes apart from the padded kind's. Without a GPU the kernels run
in Triton's interpreter: small sizes."""

import pytest
import torch

from gemm_checks import DTYPES, check, matrix, nans, randn, run_checked, triton_on_cpu
from tunekit.ops.gemm import AddmmParams, GemmParams, TritonGemm, addmm_op, mm_op, triton_launch
from tunekit.ops.gemm.torch_candidates import torch_mm
from tunekit.ops.gemm.triton_padded_rows import TritonPaddedRows, padded_rows_candidates, padded_rows_copy
from tunekit.tunable.config import Config

pytestmark = [pytest.mark.skipif(triton_on_cpu() is not None and not torch.cuda.is_available(),
                                 reason=str(triton_on_cpu())),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy overflow in the interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = TritonPaddedRows(Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=1, num_warps=4, num_stages=2))


@pytest.mark.parametrize("layout", ["row", "col", "misaligned", "ld", "sliced"])
@pytest.mark.parametrize("batch", [None, 1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_copy_equals_torchs(layout, batch, dtype):
    """Every element copied bit for bit (NaN and inf too), into rows TMA reads, in the same major order; a sliced
    view (no unit stride) copied by torch."""
    t = matrix(37, 300, dtype, DEVICE, layout, seed=3, batch=batch)
    t[..., 5, 7], t[..., 36, 299], t[..., 0, 0] = float("nan"), float("inf"), -float("inf")
    got = padded_rows_copy(t)
    assert triton_launch.tma_readable(got) and got.shape == t.shape
    assert (got.stride(-1) == 1) == (t.stride(-1) == 1 or layout == "sliced")
    assert torch.equal(_bits(got), _bits(t))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def test_a_broadcast_batch_is_materialized_and_empty_copies_nothing():
    t = matrix(21, 45, torch.bfloat16, DEVICE, "bcast", seed=4, batch=3)
    got = padded_rows_copy(t)
    assert got.stride(0) != 0 and torch.equal(got, t)
    for shape in ((0, 45), (21, 0), (0, 21, 45)):
        empty = torch.empty(shape, dtype=torch.bfloat16, device=DEVICE)
        assert padded_rows_copy(empty).shape == empty.shape


@pytest.mark.parametrize("index", range(len(padded_rows_candidates())),
                         ids=[c.name for c in padded_rows_candidates()])
def test_every_configuration(index):
    """Each configuration once: unaligned rows in a (K odd) or b (N odd, row- or column-major), NaN-filled out."""
    candidate = padded_rows_candidates()[index]
    dtype = DTYPES[index % 3]
    M, N, K = (21, 37, 70) if index % 2 else (19, 40, 71)

    def params(dtype):
        a = matrix(M, K, dtype, DEVICE, seed=index)
        b = matrix(K, N, dtype, DEVICE, layout="col" if index % 2 else "row", seed=index + 1)
        return GemmParams(a, b, nans((M, N), dtype, DEVICE))
    p = params(dtype)
    why = candidate.cannot_run(p)
    if why is not None and "shared memory" in why:  # a GPU: float32 doubles the tiles' shared memory
        p = params(torch.bfloat16)
    check(run_checked(candidate, p), p.a, p.b)


@pytest.mark.parametrize("a_layout", ["row", "col", "sliced", "misaligned", "ld"])
@pytest.mark.parametrize("b_layout", ["row", "col", "sliced", "misaligned"])
def test_strided_and_misaligned_views(a_layout, b_layout):
    M, N, K = 17, 23, 41
    a, b = matrix(M, K, torch.float16, DEVICE, a_layout), matrix(K, N, torch.float16, DEVICE, b_layout, seed=1)
    check(run_checked(SMALL, GemmParams(a, b, nans((M, N), torch.float16, DEVICE))), a, b)


def test_epilogues_batches_and_in_place():
    """C, alpha / beta and an activation; a batch with B broadcast; addmm_ (out is C, read then written once)."""
    batch, M, N, K = 3, 11, 15, 23
    a = matrix(M, K, torch.float32, DEVICE, batch=batch)
    b = matrix(K, N, torch.float32, DEVICE, "bcast", seed=1, batch=batch)
    c = randn((batch, M, N), torch.float32, DEVICE, seed=2)
    p = AddmmParams(c, a, b, alpha=0.5, beta=2, out=nans((batch, M, N), torch.float32, DEVICE), activation="silu")
    check(run_checked(SMALL, p), a, b, c, 0.5, 2.0, "silu")
    a2, b2 = matrix(M, K, torch.float32, DEVICE, seed=3), matrix(K, N, torch.float32, DEVICE, seed=4)
    c2 = randn((M, N), torch.float32, DEVICE, seed=5)
    before = c2.clone()
    assert run_checked(SMALL, AddmmParams(c2, a2, b2, alpha=2, beta=0.5, out=c2)) is c2
    check(c2, a2, b2, before, 2.0, 0.5)


def test_nan_and_inf_land_where_torchs_do():
    M, N, K = 9, 21, 33
    a, b = matrix(M, K, torch.bfloat16, DEVICE), matrix(K, N, torch.bfloat16, DEVICE, seed=1)
    a[2, 3], b[4, 5], b[6, 7] = float("nan"), float("inf"), -float("inf")
    p = GemmParams(a, b, nans((M, N), torch.bfloat16, DEVICE))
    got, expected = run_checked(SMALL, p), torch_mm(p.replace(out=None))
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    assert torch.equal(got[got.isinf()], expected[expected.isinf()])


def test_what_it_runs_is_the_padded_kinds_and_its_hash_its_own():
    """Refused or skipped where the padded kind is (every operand TMA-readable: the tma kind runs it), listed before
    it in mm and addmm, hashed apart from it (shipped entries naming the padded kind stay valid)."""
    a, b = matrix(256, 64, torch.bfloat16, DEVICE), matrix(64, 256, torch.bfloat16, DEVICE, seed=1)
    assert "TMA-readable already" in padded_rows_candidates()[0].not_worth(GemmParams(a, b))
    for op in (mm_op, addmm_op):
        names = [c.name for c in op.candidates]
        ours = [names.index(c.name) for c in padded_rows_candidates()]
        padded = [i for i, c in enumerate(op.candidates) if type(c) is TritonGemm and c.kind == "padded"]
        assert len(ours) == len(padded) == 4 and max(ours) < min(padded)
    old = next(c for c in mm_op.candidates if type(c) is TritonGemm and c.kind == "padded")
    new = mm_op.candidate(old.name.replace("triton_padded", "triton_padrows"))
    assert new.config == old.config and new.source_hash() != old.source_hash()


def test_the_kernel_copies_and_writes_zeros_past_the_source(monkeypatch):
    """Every layout with a unit stride goes through ``pad_rows_kernel`` (torch copies only a sliced view), and the
    padded columns hold zeros (the stores cover the whole padded row)."""
    import tunekit.ops.gemm.triton_padded_rows as padded_rows
    launched, real = [], triton_launch._launch
    monkeypatch.setattr(triton_launch, "_launch", lambda fn, *a, **k: launched.append(fn) or real(fn, *a, **k))
    for layout, batch in (("row", None), ("col", None), ("misaligned", 3), ("bcast", 3), ("sliced", None)):
        launched.clear()
        t = matrix(19, 45, torch.bfloat16, DEVICE, layout, seed=5, batch=batch)
        got = padded_rows_copy(t)
        assert torch.equal(got, t) and len(launched) == (0 if layout == "sliced" else 1)
        if layout != "sliced":
            assert launched[0] is padded_rows._kernel
        rows_major = got.mT if layout == "col" else got
        whole = rows_major.as_strided((*rows_major.shape[:-1], rows_major.stride(-2)), rows_major.stride())
        assert torch.equal(whole[..., 45:], torch.zeros_like(whole[..., 45:])) or layout == "sliced"



def test_a_preparation_copies_nothing(monkeypatch):
    """``run(p, copy=False)`` (what ``prepare`` runs inside ``warming``, where launches only compile): the buffers
    are made, torch copies nothing, even for sliced views that torch would copy."""
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k: copies.append(self.shape) or real(self, *a, **k))
    launched = []
    monkeypatch.setattr(triton_launch, "_launch", lambda fn, *a, **k: launched.append(fn))
    M, N, K = 17, 23, 41
    a, b = matrix(M, K, torch.float16, DEVICE, "sliced"), matrix(K, N, torch.float16, DEVICE, "sliced", seed=1)
    SMALL.run(GemmParams(a, b), copy=False)
    assert copies == [] and launched  # the TMA kernel's launch (compile-only inside warming)
    SMALL.run(GemmParams(a, b))
    assert len(copies) == 2  # a real call: both sliced operands copied by torch
