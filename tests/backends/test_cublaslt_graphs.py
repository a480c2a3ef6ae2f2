"""backends/cublaslt_graphs.py: the cuBLASLt workspace kept for the current stream is dropped after a call in
Inductor's CUDA graph warm-up, and only then (the warm-up and the streams faked; the compiled run is
``test_a_cublaslt_choice_runs_under_reduce_overhead`` in tests/ops/test_gemm_cublaslt.py)."""

import pytest
import torch

from tunekit.backends import cublaslt, cublaslt_graphs
from tunekit.tunable import graph_making

CUDA1 = torch.device("cuda", 1)


@pytest.fixture
def workspaces(monkeypatch):
    """Fake workspaces on cuda:1 for the current stream (11) and another (12); the current stream faked."""
    kept = {(1, 11): "current stream's", (1, 12): "another stream's"}
    monkeypatch.setattr(cublaslt, "_workspaces", kept)
    monkeypatch.setattr(cublaslt_graphs, "raw_stream", lambda index: {1: 11}[index])
    return kept


def _making(monkeypatch, why):
    asked = []
    monkeypatch.setattr(graph_making, "why", lambda device: asked.append(device) or why)
    return asked


def test_a_call_in_the_warm_up_drops_its_streams_workspace_only(workspaces, monkeypatch):
    asked = _making(monkeypatch, graph_making.WARMING_UP)
    cublaslt_graphs.release_after_warm_up(CUDA1)
    assert workspaces == {(1, 12): "another stream's"} and asked == [CUDA1]
    cublaslt_graphs.release_after_warm_up(CUDA1)  # nothing kept for this stream now: nothing asked
    assert workspaces == {(1, 12): "another stream's"} and asked == [CUDA1]


@pytest.mark.parametrize("why", [None, graph_making.CAPTURING])
def test_outside_the_warm_up_every_workspace_stays(workspaces, monkeypatch, why):
    _making(monkeypatch, why)  # a capture's workspaces are never kept (cublaslt._workspace makes one per call)
    cublaslt_graphs.release_after_warm_up(CUDA1)
    assert set(workspaces) == {(1, 11), (1, 12)}


def test_no_workspace_or_a_cpu_tensor_asks_nothing(monkeypatch):
    asked = _making(monkeypatch, graph_making.WARMING_UP)
    monkeypatch.setattr(cublaslt, "_workspaces", {})
    cublaslt_graphs.release_after_warm_up(CUDA1)
    monkeypatch.setattr(cublaslt, "_workspaces", {(0, 11): "kept"})
    cublaslt_graphs.release_after_warm_up(torch.device("cpu"))
    assert asked == [] and cublaslt._workspaces == {(0, 11): "kept"}


def test_the_gemm_custom_ops_release_after_their_call(monkeypatch):
    from tunekit.ops.gemm import custom_ops
    released = []
    monkeypatch.setattr(custom_ops, "release_after_warm_up", released.append)
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    torch.testing.assert_close(torch.ops.tunekit.mm(a, b, "none"), a @ b)
    torch.testing.assert_close(torch.ops.tunekit.addmm(c, a, b, 1.0, 1.0, "none"), torch.addmm(c, a, b))
    assert released == [a.device, a.device]


def test_a_call_that_raises_releases_too(monkeypatch):
    """An op raising inside the warm-up must not leave its workspace for the pool check to report after the
    real error."""
    from tunekit.ops.gemm import custom_ops
    released = []
    monkeypatch.setattr(custom_ops, "release_after_warm_up", released.append)

    def fails(params):
        raise RuntimeError("the candidate failed")

    monkeypatch.setattr(custom_ops, "_mm_call", fails)
    monkeypatch.setattr(custom_ops, "_addmm_call", fails)
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    with pytest.raises(RuntimeError, match="the candidate failed"):
        torch.ops.tunekit.mm(a, b, "none")
    with pytest.raises(RuntimeError, match="the candidate failed"):
        torch.ops.tunekit.addmm(c, a, b, 1.0, 1.0, "none")
    assert released == [a.device, a.device]
