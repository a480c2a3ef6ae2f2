"""graph_making.why on the CPU: Inductor's cudagraph trees faked (their per-thread containers, a manager and
its stream), CUDA's capture query and current stream patched. The real trees: tests/test_gpu_integration.py."""

import sys
import threading
import types

import pytest
import torch

from tunekit.tunable import graph_making

CUDA = torch.device("cuda", 0)


class Stream:
    pass


def _trees(containers=None, stream=None):
    manager = None if stream is None else types.SimpleNamespace(stream=stream)
    local = threading.local()
    if containers is None:
        local.tree_manager_containers = {0: types.SimpleNamespace(tree_manager=manager)}
    elif containers != "absent":
        local.tree_manager_containers = containers
    return types.SimpleNamespace(local=local)


@pytest.fixture
def cuda_now(monkeypatch):
    """``set(stream=..., capturing=...)``: what torch.cuda answers."""
    state = {"stream": Stream(), "capturing": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: state["stream"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return state


def test_a_cpu_device_makes_no_graph():
    assert graph_making.why(torch.device("cpu")) is None


def test_a_capture_is_recognised_first(cuda_now):
    cuda_now["capturing"] = True
    assert graph_making.why(CUDA) == graph_making.CAPTURING


def test_without_inductors_trees_nothing_warms_up(cuda_now, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert graph_making.why(CUDA) is None


def test_the_trees_stream_current_is_their_warm_up(cuda_now, monkeypatch):
    tree_stream = Stream()
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", _trees(stream=tree_stream))
    assert graph_making.why(CUDA) is None  # another stream is current: the user's own code
    cuda_now["stream"] = tree_stream
    assert graph_making.why(CUDA) == graph_making.WARMING_UP
    assert graph_making.why(torch.device("cuda")) == graph_making.WARMING_UP  # no index: the current device


@pytest.mark.parametrize("containers", [{}, {0: types.SimpleNamespace(tree_manager=None)}, {1: None}])
def test_no_manager_for_the_device_is_no_warm_up(cuda_now, monkeypatch, containers):
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", _trees(containers))
    assert graph_making.why(CUDA) is None


def test_a_thread_the_trees_state_passed_to_reads_it_from_torchs_tls(cuda_now, monkeypatch):
    """Autograd's thread runs compiled backwards: the trees hand it their containers through torch's TLS."""
    tree_stream = Stream()
    cuda_now["stream"] = tree_stream
    containers = {0: types.SimpleNamespace(tree_manager=types.SimpleNamespace(stream=tree_stream))}
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", _trees("absent"))
    monkeypatch.setattr(torch._C, "_is_key_in_tls", lambda key: key == "tree_manager_containers")
    monkeypatch.setattr(torch._C, "_get_obj_in_tls", lambda key: containers)
    assert graph_making.why(CUDA) == graph_making.WARMING_UP
    monkeypatch.setattr(torch._C, "_is_key_in_tls", lambda key: False)
    assert graph_making.why(CUDA) is None
