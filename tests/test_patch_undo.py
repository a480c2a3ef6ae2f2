"""tunekit.patch's undo: it restores the exact original objects, whatever the nesting, order, exceptions or
threads (tests/test_patch.py: what a patched call does)."""

import functools
import itertools
import random
import threading

import pytest
import torch
import torch.nn.functional as F

import tunekit

from patch_checks import (TENSOR_LOGSUMEXP, TORCH_GELU, TORCH_LINEAR, TORCH_LOGSUMEXP, TORCH_SILU,  # noqa: F401
                          assert_torch_untouched, patch_module, patched_ops, rand, runs, torch_as_it_was)


# -- reversibility ----------------------------------------------------------------------------
def test_undo_restores_the_exact_original_objects():
    handle = tunekit.patch(patch_module.PATCHABLE_OPS)  # every op, gemm included
    assert handle.active and patched_ops() == {"silu", "gelu", "logsumexp", "rms_norm", "gemm"}
    assert "logsumexp" in vars(torch.Tensor) and torch.Tensor.logsumexp is not TENSOR_LOGSUMEXP
    assert "active" in repr(handle)
    handle.undo()
    assert not handle.active and "undone" in repr(handle)
    assert_torch_untouched()
    assert F.silu is TORCH_SILU and F.gelu is TORCH_GELU and torch.logsumexp is TORCH_LOGSUMEXP
    assert torch.Tensor.logsumexp is TENSOR_LOGSUMEXP
    handle.undo()  # twice: nothing
    handle.restore()
    assert_torch_untouched()
    with pytest.raises(RuntimeError, match="was undone"):
        with handle:
            pass


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_nested_patches_undone_in_any_order(order):
    selections = [None, ["silu"], ["gelu", "logsumexp"]]
    handles = [tunekit.patch(ops) for ops in selections]
    live = set(range(3))
    for i in order:
        handles[i].undo()
        live.discard(i)
        expected = {op for j in live for op in handles[j].ops}
        assert patched_ops() == expected
    assert_torch_untouched()


def test_the_default_patch_leaves_gemm_out_and_takes_it_when_named():
    with tunekit.patch():
        assert patched_ops() == set(patch_module.DEFAULT_PATCH_OPS) == {"silu", "gelu", "logsumexp", "rms_norm"}
        assert F.linear is TORCH_LINEAR
        with tunekit.patch(["gemm"]):
            assert F.linear is not TORCH_LINEAR and "gemm" in patched_ops()
        assert F.linear is TORCH_LINEAR


def test_exceptions_inside_the_context_manager_undo_the_patch():
    with pytest.raises(KeyError):
        with tunekit.patch(["silu"]):
            with pytest.raises(ZeroDivisionError):
                with tunekit.patch():
                    assert patched_ops() == {"silu", "gelu", "logsumexp", "rms_norm"}  # gemm: only when named
                    1 / 0
            assert patched_ops() == {"silu"}
            raise KeyError("out")
    assert_torch_untouched()


def test_a_reference_taken_while_patched_falls_back_to_torch_after_undo(runs):
    x = rand((12, 5), torch.float32)
    with tunekit.tuning(tuning=False):
        with tunekit.patch():
            silu_ref, gelu_ref = F.silu, functools.partial(F.gelu, approximate="tanh")
            silu_ref(x)
        assert runs.count("silu") == 1
        assert torch.equal(silu_ref(x), TORCH_SILU(x)) and torch.equal(gelu_ref(x), TORCH_GELU(x, approximate="tanh"))
        assert runs.total() == 1  # after undo: torch
        with tunekit.patch():
            assert F.silu is silu_ref  # the same replacement object each time
            gelu_ref(x)
        assert runs.count("gelu") == 1


def test_undo_leaves_someone_elses_replacement_in_place(monkeypatch):
    def theirs(input, inplace=False):
        return TORCH_SILU(input, inplace)

    handle = tunekit.patch(["silu"])
    monkeypatch.setattr(F, "silu", theirs)
    with pytest.warns(tunekit.TunekitWarning, match="replaced by someone else"):
        handle.undo()
    assert F.silu is theirs
    monkeypatch.undo()  # they put back what they found: the (inactive) replacement, which calls torch
    x = rand((3, 4), torch.float32)
    assert F.silu is not TORCH_SILU and torch.equal(F.silu(x), TORCH_SILU(x))
    with tunekit.patch(["silu"]):  # the next patch and undo put torch's own function back
        pass


def test_patch_and_undo_from_many_threads_leave_torch_as_it_was():
    x = rand((16, 16), torch.float32)
    want = TORCH_SILU(x)
    errors = []
    start = threading.Barrier(8)

    def work(seed):
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(50):
                ops = rng.sample(["silu", "gelu", "logsumexp"], rng.randint(1, 3))
                with tunekit.patch(ops):
                    if not torch.equal(F.silu(x), want):
                        errors.append("wrong silu")
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(a.users == 0 for op in patch_module.PATCHABLE_OPS for a in patch_module.attributes_of(op))
    assert_torch_untouched()


def test_user_module_subclasses_keep_their_own_forward(runs):
    class Doubled(torch.nn.SiLU):
        def forward(self, input):
            return 2 * super().forward(input)

    x = rand((4, 6), torch.float32)
    with tunekit.tuning(tuning=False), tunekit.patch(["silu"]):
        y = Doubled()(x)  # its forward is its own; super().forward is the patched one
    assert runs.count("silu") == 1
    torch.testing.assert_close(y, 2 * TORCH_SILU(x))
