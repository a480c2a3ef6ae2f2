"""A tuning process's start: the one-GPU visibility a worker gives itself, and prepare()."""

import os

import pytest
import torch

from tunekit import offline
from tunekit.offline import parallel, process_start, recorded, tune_one


@pytest.mark.parametrize("environ, index, expected", [
    ({}, 0, "0"),
    ({}, 3, "3"),
    ({"CUDA_VISIBLE_DEVICES": "4,6"}, 1, "6"),
    ({"CUDA_VISIBLE_DEVICES": " 2 , 7 "}, 0, "2"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f3a,GPU-11c2"}, 1, "GPU-11c2"),
])
def test_a_worker_sees_only_its_own_gpu_as_this_process_numbers_it(environ, index, expected):
    assert process_start.visible_devices(index, environ) == expected


def test_a_gpu_this_process_cannot_see_is_an_error():
    with pytest.raises(ValueError, match="GPU 2 is not among"):
        process_start.visible_devices(2, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_prepare_does_nothing_on_the_cpu(monkeypatch):
    monkeypatch.setattr(process_start, "_triton_cache_key", lambda: pytest.fail("no Triton key on the CPU"))
    process_start.prepare(torch.device("cpu"))


class _Pipe:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)

    def close(self):
        pass


def test_a_gpu_worker_hides_the_other_gpus_before_cuda_starts(monkeypatch, isolated_results):
    """The worker sets CUDA_VISIBLE_DEVICES before anything initialises CUDA, then works on its one
    visible GPU, cuda:0 (driven in this process, CUDA replaced by recorders)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # restored after the test
    calls = []
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(process_start, "prepare", lambda d: calls.append(("prepare", d)))

    def work(store, device, settings, **kwargs):
        calls.append(("work", device))
        return offline.TuneSummary(device="stand-in")
    monkeypatch.setattr(parallel, "work", work)
    seen = []
    pipe = _Pipe()
    settings = parallel._fields(tune_one.offline_settings(None, recorded.as_store(str(isolated_results))))
    parallel._worker(1, str(isolated_results), "cuda:1", "7", settings, None, None, "run", 60.0, 1, pipe,
                     lambda index: seen.append(os.environ["CUDA_VISIBLE_DEVICES"]))
    cuda0 = torch.device("cuda", 0)
    assert seen == ["7"]  # already hidden when the initializer (and anything after it) runs
    assert calls == [("prepare", cuda0), ("set_device", cuda0), ("work", cuda0)]
    assert pipe.sent[-1][0] == "summary"


@pytest.mark.gpu
def test_prepare_creates_the_context_and_hashes_triton_key():
    triton_cache = pytest.importorskip("triton.runtime.cache")
    device = torch.device("cuda", torch.cuda.current_device())
    process_start.prepare(device)
    assert torch.cuda.is_initialized()
    if hasattr(triton_cache.triton_key, "cache_info"):
        assert triton_cache.triton_key.cache_info().currsize == 1
