"""A ``tuning()`` block around a forward governs its backward too, on every device.

Autograd runs CUDA backwards on its own device thread, which sees none of the caller's
``tuning()`` blocks (a ContextVar is per thread); the autograd Functions capture the forward's
settings and their backward runs under them there. The check: with tuning off and recording on, the
backward's signature lands in the block's own results file, not in the process default."""

import pytest
import torch

import tunekit
from tunekit.ops.gelu import GeluFunction
from tunekit.ops.silu import SiluFunction
from tunekit.tunable import results_store

#: the autograd Functions (tunekit.silu / gelu record torch's own node where the C++ extension builds,
#: ops/_shared/grad_call.py: no tunekit backward, no settings to carry)
CASES = {
    "silu": (lambda x: SiluFunction.apply(x), "silu_backward"),
    "gelu": (lambda x: GeluFunction.apply(x, "tanh"), "gelu_backward"),
    "logsumexp": (lambda x: tunekit.logsumexp(x, 1), "logsumexp_backward"),
}
#: logsumexp's tuned backward runs above TORCH_NODE_MAX_NUMEL elements (below it, torch's node)
SHAPES = {"silu": (37, 19), "gelu": (37, 19), "logsumexp": (3, 21851)}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", list(CASES))
def test_backward_runs_under_the_forward_tuning_block(case, device, tmp_path, isolated_results):
    fn, backward_op = CASES[case]
    x = torch.randn(SHAPES[case], device=device, requires_grad=True)
    scoped = tmp_path / "scoped.sqlite"
    with tunekit.tuning(results=str(scoped), tuning=False, record_untuned=True):
        y = fn(x)
    y.sum().backward()  # outside the block: the forward's settings still apply
    assert [u.op for u in results_store(str(scoped)).untuned(backward_op)] == [backward_op]
    assert not results_store(str(isolated_results)).entries(backward_op)  # the default file: nothing tuned
    expected = x.detach().clone().requires_grad_()
    ref = {"silu": torch.nn.functional.silu, "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
           "logsumexp": lambda t: torch.logsumexp(t, 1)}[case](expected)
    ref.sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


def test_a_block_around_the_backward_itself_wins(tmp_path):
    x = torch.randn(64, requires_grad=True)
    y = SiluFunction.apply(x)  # forward under the defaults
    scoped = tmp_path / "scoped.sqlite"
    with tunekit.tuning(results=str(scoped), tuning=False, record_untuned=True):
        y.sum().backward()  # CPU: the backward runs on this thread, inside the block
    assert [u.op for u in results_store(str(scoped)).untuned("silu_backward")] == ["silu_backward"]
