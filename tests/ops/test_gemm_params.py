"""GemmParams / AddmmParams: the signature names what changes the choice (dtype, sizes, layouts and
alignment, C and how it broadcasts, alpha = 0, activation, TF32, deterministic mode), the cache key
separates at least as much, the in-place form aliases C, and a recorded signature is rebuilt offline
(``spec()``) with the very layout and arguments it was met with, then tuned by ``tunekit tune``."""

import pytest
import torch

import tunekit
from gemm_checks import matrix, randn
from tunekit import offline
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, make_addmm_example, make_example, mm_op
from tunekit.ops.gemm.params import layout
from tunekit.offline.rebuild import rebuild_params
from tunekit.tunable import results_store
from tunekit.tunable.params import make_trial

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_layout_strings():
    assert layout(torch.empty(4, 6)) == "row@0"
    assert layout(torch.empty(6, 4).t()) == "col@0"
    assert layout(torch.empty(4, 10)[:, ::2]) == "s10,2@0"
    assert layout(torch.empty(4, 10)[:, :6]) == "s10,1@0"
    assert layout(torch.empty(25)[1:].view(4, 6)) == "row@4"
    assert layout(torch.empty(1, 4, 6).expand(3, 4, 6)) == "row/b0@0"
    assert layout(torch.empty(3, 4, 6)) == "row@0"


def test_signature_names_what_changes_the_choice():
    a, b = matrix(5, 8, torch.bfloat16), matrix(8, 3, torch.bfloat16, layout="col")
    assert GemmParams(a, b).signature() == "mm bf16 M=5 N=3 K=8 a=row@0 b=col@0 out=new act=none tf32=0 det=0 cpu"
    out = torch.empty(5, 3, dtype=torch.bfloat16)
    assert "out=row@0" in GemmParams(a, b, out, "gelu").signature() and "act=gelu" in GemmParams(a, b, out, "gelu").signature()
    a3 = matrix(5, 8, torch.float32, batch=2)
    b3 = matrix(8, 3, torch.float32, layout="bcast", batch=2)
    assert GemmParams(a3, b3, tf32=True).signature() == \
        "mm f32 M=5 N=3 K=8 batch=2 a=row@0 b=row/b0@0 out=new act=none tf32=1 det=0 cpu"
    c = randn(3, torch.bfloat16)
    sig = AddmmParams(c, a, b, alpha=2, beta=0.5).signature()
    assert sig == "addmm bf16 M=5 N=3 K=8 a=row@0 b=col@0 c=s0,1@0 out=new act=none tf32=0 det=0 cpu"
    assert "c=beta=0" in AddmmParams(c, a, b, beta=0).signature()
    assert " alpha=0 " in AddmmParams(c, a, b, alpha=0).signature()
    cc = randn((5, 3), torch.bfloat16)
    assert "out=inplace" in AddmmParams(cc, a, b, out=cc).signature()
    assert "b=f16:" in GemmParams(a, b.half()).signature()


def test_cache_key_separates_at_least_what_the_signature_does():
    a, b = matrix(5, 8), matrix(8, 3)
    c = randn((5, 3))
    variants = [GemmParams(a, b), GemmParams(a, b, tf32=True), GemmParams(a, b, deterministic=True),
                GemmParams(a, b, activation="relu"), GemmParams(a, b.t().contiguous().t()),
                GemmParams(a, b, torch.empty(5, 3)), AddmmParams(c, a, b), AddmmParams(c, a, b, beta=0),
                AddmmParams(c, a, b, alpha=0), AddmmParams(c, a, b, out=c)]
    assert len({p.signature() for p in variants}) == len(variants)
    assert len({p.cache_key() for p in variants}) == len(variants)
    # alpha and beta values do not change the choice: one key, one signature
    assert AddmmParams(c, a, b, alpha=2, beta=3).cache_key() == AddmmParams(c, a, b, alpha=5, beta=-1).cache_key()


def test_tf32_and_deterministic_are_read_from_torch():
    a, b = matrix(4, 4), matrix(4, 4)
    saved = torch._C._get_cublas_allow_tf32()
    try:
        torch._C._set_cublas_allow_tf32(True)
        assert GemmParams(a, b).tf32 and not GemmParams(a.half(), b.half()).tf32
        torch._C._set_cublas_allow_tf32(False)
        assert not GemmParams(a, b).tf32
    finally:
        torch._C._set_cublas_allow_tf32(saved)


def test_in_place_trial_copies_c_and_outputs_are_nan():
    a, b = matrix(5, 8), matrix(8, 3)
    c = randn((5, 3))
    p = AddmmParams(c, a, b, out=c)
    assert p.mutated() == ("c",)
    trial = make_trial(p)
    assert trial.out is trial.c and trial.c is not c and torch.equal(trial.c, c)
    fresh = make_trial(GemmParams(a, b))
    assert fresh.out.shape == (5, 3) and fresh.out.isnan().all()


def test_examples():
    p = make_example((7, 5, 3), torch.float16)
    assert p.mnk == (7, 5, 3) and p.batch == 1 and p.a.dtype == torch.float16
    assert make_example((4,)).mnk == (4, 4, 4)
    p = make_example((2, 7, 5, 3), layout="nt")
    assert p.batch == 2 and p.b.stride(-2) == 1
    p = make_addmm_example((7, 5, 3), bias=True)
    assert p.c.shape == (5,) and p.new_outputs()["out"].shape == (7, 5)
    with pytest.raises(ValueError):
        make_example((1, 2, 3, 4, 5))


@pytest.mark.parametrize("make", [
    lambda: GemmParams(matrix(5, 8, torch.bfloat16, layout="misaligned"), matrix(8, 3, torch.bfloat16, layout="col"),
                       activation="silu", tf32=False, deterministic=True),
    lambda: GemmParams(matrix(5, 8, torch.float32, batch=2), matrix(8, 3, torch.float32, layout="bcast", batch=2),
                       tf32=True),
    lambda: AddmmParams(randn(3), matrix(5, 8), matrix(8, 3, layout="sliced"), alpha=0.5, beta=2, activation="gelu"),
    lambda: (lambda c: AddmmParams(c, matrix(5, 8), matrix(8, 3), out=c))(randn((5, 3))),
], ids=["mm", "bmm", "addmm", "addmm_"])
def test_offline_rebuild_gives_the_same_signature(make):
    p = make()
    op = addmm_op if isinstance(p, AddmmParams) else mm_op
    rebuilt = rebuild_params(op, p.spec(), "cpu")
    assert rebuilt.signature() == p.signature()
    assert type(rebuilt) is type(p) and rebuilt.cache_key()[-2:] == p.cache_key()[-2:]
    if p.out is not None:
        assert rebuilt.out is rebuilt.c


def test_record_then_tune_offline(isolated_results):
    """An untuned GEMM signature met with tuning off is recorded, tuned by ``tunekit tune``'s loop on
    rebuilt inputs, and its stored entry runs afterwards."""
    a, b = matrix(12, 16, torch.bfloat16), matrix(16, 8, torch.bfloat16, layout="col")
    with tunekit.tuning(tuning=False, record_untuned=True):
        tunekit.mm(a, b)
        tunekit.addmm(randn(8, torch.bfloat16), a, b)
    store = results_store()
    assert sorted(r.op for r in store.untuned()) == ["addmm", "mm"]
    with tunekit.tuning(max_tuning_ms=500):
        summary = offline.tune_recorded(store)
    assert (summary.tuned, summary.failed) == (2, [])
    mm_op.forget()
    with tunekit.tuning(tuning=False):
        assert tunekit.explain("mm", a, b).why == "stored result"


def test_the_fastest_possible_time_is_a_roofline_bound_on_a_gpu_and_none_on_the_cpu():
    assert GemmParams(torch.randn(64, 32), torch.randn(32, 48)).fastest_possible_ms() == 0.0
    if not torch.cuda.is_available():
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bound = GemmParams(a, a).fastest_possible_ms()
    major = torch.cuda.get_device_capability()[0]
    if major == 9:  # H100 / H200: 989 TFLOP/s dense bf16, 1.11 ms for this GEMM at the peak
        assert 0.5 < bound <= 2 * 8192 ** 3 / 989e12 * 1e3
    else:
        assert bound == 0.0 if major not in (8, 10) else bound > 0
