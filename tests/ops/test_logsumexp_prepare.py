"""A CUDA C logsumexp candidate's ``prepare`` loads exactly the kernels its ``run`` launches: its own and,
where the launch is split, the one merge pass (a shipped choice's first call waits for prepare)."""

import pytest
import torch

from tunekit.ops.logsumexp import logsumexp_backward_op, logsumexp_op
from tunekit.ops.logsumexp.cuda_common import CudaReduction

#: the suite's layouts and a few that split: long rows (merge), few long rows (wide merge), short columns
SHAPES = [((32768, 64), -1), ((64, 1048576), -1), ((4, 16777216), -1), ((2, 4096), -1), ((4096, 4096), 0),
          ((32, 4096, 128), 1), ((3, 65536, 8), 1)]


def _cuda_forms(op):
    """Every CudaReduction the op runs: its candidates and the default gradient's kernels."""
    for c in op.candidates:
        if isinstance(c, CudaReduction):
            yield c
        for k in getattr(c, "kernels", ()):
            if isinstance(k, CudaReduction):
                yield k


def _launched(form, p, monkeypatch) -> set[str]:
    """Names of the kernels ``form.run(p)`` launches (each launch goes through as usual)."""
    names = set()
    for kernel in {form.kernel, form.combine, form.combine_wide}:
        for method in ("launch", "launch_dependent"):
            real = getattr(kernel, method)

            def spy(*args, _real=real, _name=kernel.name):
                names.add(_name)
                return _real(*args)
            monkeypatch.setattr(kernel, method, spy)
    form.run(p)
    torch.cuda.synchronize()
    monkeypatch.undo()
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("op", [logsumexp_op, logsumexp_backward_op], ids=["forward", "gradient"])
def test_prepare_loads_what_run_launches(cuda, op, monkeypatch):
    checked, merged = 0, set()
    for shape, dim in SHAPES:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            p = op.make_example(shape, dtype=dtype, device=cuda, dim=dim)
            for form in _cuda_forms(op):
                if form.supports(p) is not None:
                    continue
                expected = {form.kernel.name, *(k.name for k in form.merges(p))}
                assert _launched(form, p, monkeypatch) == expected, (form.name, shape, dim, dtype)
                checked += 1
                merged |= expected - {form.kernel.name}
    assert checked > 20
    if op is logsumexp_op:  # both merge passes are met, so the check above covers them
        assert any("combine_wide" in n for n in merged) and any("combine_wide" not in n for n in merged)
