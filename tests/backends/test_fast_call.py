"""The C++ fast-call extension: it builds here (CI has a C++ compiler and torch's headers), its
Launcher allocates like torch.empty_like and hands the driver exactly the launch it was given (a
recording stand-in with cuLaunchKernel's C signature replaces the driver, so no GPU is needed), and
its FastCall leaves every tensor it cannot key to the general path. FastCall's lookup itself is
tested against its Python twin in tests/tunable/test_fast_runners.py."""

import threading
import time

import pytest
import torch

from extension_checks import built
from launch_recorder import RecordingDriver
from tunekit.backends import extension, fast_call, thread_context
from tunekit.tunable import context


@pytest.fixture(scope="module")
def module():
    return built(fast_call, "fast-call")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_launcher_allocates_like_empty_like_and_launches_what_it_was_given(module, dtype):
    driver = RecordingDriver(n_args=3)
    streams = []
    launcher = module.Launcher(driver.address, 0xF00D, 37, 256, 1234, 3, lambda index: streams.append(index) or 0x5000)
    x = torch.randn(3, 7, 11, dtype=dtype)
    out = launcher(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device and out.is_contiguous()
    assert out.data_ptr() != x.data_ptr()
    (call,) = driver.calls
    assert call["function"] == 0xF00D and call["grid"] == (37, 1, 1) and call["block"] == (256, 1, 1)
    assert call["shared"] == 0 and call["stream"] == 0x5000 and call["extra"] is None
    assert call["values"] == [x.data_ptr(), out.data_ptr(), 1234]
    assert streams == [3]  # the stream is asked for on every call, for the device index bound


def test_launcher_errors_are_clear(module):
    driver = RecordingDriver(n_args=3, result=719)
    launcher = module.Launcher(driver.address, 1, 1, 32, 8, 0, lambda index: 0)
    with pytest.raises(RuntimeError, match="CUresult 719"):
        launcher(torch.randn(8))
    with pytest.raises(TypeError, match="one tensor"):
        launcher([1.0])
    with pytest.raises(TypeError, match="one tensor"):
        launcher(torch.randn(8), torch.randn(8))

    def broken_stream(index):
        raise RuntimeError("no stream")

    with pytest.raises(RuntimeError, match="no stream"):
        module.Launcher(driver.address, 1, 1, 32, 8, 0, broken_stream)(torch.randn(8))
    for bad in [dict(entry=0), dict(function=0), dict(grid=0), dict(block=0), dict(n=-1)]:
        args = dict(entry=driver.address, function=1, grid=1, block=32, n=8, device_index=0, stream_fn=lambda i: 0)
        args.update(bad)
        with pytest.raises(ValueError):
            module.Launcher(**args)


def test_the_launcher_retries_a_refused_launch_once_the_hook_binds_a_context(module):
    """A thread whose first CUDA work is this launch has no context: the driver refuses it
    (CUDA_ERROR_INVALID_CONTEXT), the hook binds the device's primary context, the launch is retried.
    A hook that binds nothing leaves the error as it was."""
    driver = RecordingDriver(n_args=3, result=201)
    calls = []

    def bind():
        calls.append(1)
        driver.result = 0
        return True

    previous = module.set_context_hook(bind)
    try:
        assert previous is thread_context.launch_hook  # installed by fast_call.load()
        x = torch.randn(8)
        out = module.Launcher(driver.address, 0xF00D, 1, 32, 8, 0, lambda index: 0)(x)
        assert len(calls) == 1 and len(driver.calls) == 2 and driver.calls[1]["values"][1] == out.data_ptr()
        module.set_context_hook(lambda: False)
        driver.result = 201
        with pytest.raises(RuntimeError, match="CUresult 201"):
            module.Launcher(driver.address, 0xF00D, 1, 32, 8, 0, lambda index: 0)(x)
        assert len(driver.calls) == 3
        with pytest.raises(TypeError, match="callable"):
            module.set_context_hook("not callable")
    finally:
        module.set_context_hook(previous)


def test_fast_call_leaves_what_it_cannot_key_to_the_general_path(module):
    x = torch.randn(16)
    key = (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
    runners = {context.current().cache_id: {key: lambda t: "ran"}}
    fc = module.FastCall(runners, context._current, context, torch.Tensor)
    assert fc(x) == "ran"
    sparse = torch.randn(4, 4).to_sparse()
    meta = torch.empty(16, device="meta")
    for odd in (sparse, meta, x.expand(2, 16), torch.randn(16, requires_grad=True), x.t() if x.dim() > 1 else x[::2]):
        assert fc(odd) is None
    with pytest.raises(TypeError):
        fc(x, "a", "b")
    with pytest.raises(TypeError):
        module.FastCall(runners, context._current, context, int)
    with pytest.raises(TypeError):  # the differentiable runners: a frozenset
        module.FastCall(runners, context._current, context, torch.Tensor, [lambda t: "ran"])


def test_build_flags_name_the_directories_cpp_extension_would():
    """fast_call computes torch's include and library directories itself (importing cpp_extension
    cost 0.17 s per process); they must stay the ones torch's own helper names."""
    from torch.utils import cpp_extension

    flags = fast_call._flags()
    includes = [f[2:] for f in flags if f.startswith("-I")]
    assert includes == cpp_extension.include_paths()
    assert f"-L{cpp_extension.library_paths()[0]}" in flags


def test_the_op_gets_the_python_fast_call_until_the_extension_is_built_on_a_worker(monkeypatch):
    """The build takes seconds the first time on a machine: the call that caches an op's first
    runner installs the Python fast call and goes on; the C++ one replaces it once loaded."""
    release, builder = threading.Event(), []

    class Module:
        class FastCall:
            def __init__(self, runners, *rest):
                self.runners = runners

    def slow_load():
        builder.append(threading.current_thread().name)
        release.wait(30)
        return Module

    class NotLoaded:
        @staticmethod
        def done():
            return False
    monkeypatch.setattr(fast_call, "_load", NotLoaded)
    monkeypatch.setattr(fast_call, "load", slow_load)
    monkeypatch.setattr(fast_call, "_loading", None)
    monkeypatch.delenv("TUNEKIT_FAST_CALL", raising=False)
    installed, runners = [], {}
    fast_call.make_fast_call(runners, installed.append)
    assert len(installed) == 1 and installed[0].__name__ == "fast_call"  # the Python one, at once
    release.set()
    assert fast_call._load_in_background().result(timeout=30) is Module
    deadline = time.monotonic() + 30
    while len(installed) < 2 and time.monotonic() < deadline:  # the callback runs on the worker
        release.wait(0.01)
    assert isinstance(installed[1], Module.FastCall) and installed[1].runners is runners
    assert builder and builder[0] != threading.current_thread().name


def test_loaded_never_waits_for_a_build_and_start_loading_builds_once(monkeypatch):
    """A runner made while the extension builds uses the C launch (loaded() is None); the build runs
    on its own worker, started once, and loaded() gives the module when it is done."""
    gate, builds = threading.Event(), []

    def slow_build():
        builds.append(1)
        gate.wait(10)
        return "module", None

    monkeypatch.setattr(fast_call, "_load", extension.once(slow_build))
    monkeypatch.setattr(fast_call, "_loading", None)
    assert fast_call.loaded() is None and not builds  # nothing built, nothing started
    fast_call.start_loading()
    fast_call.start_loading()
    assert fast_call.loaded() is None  # building: not waited for
    gate.set()
    assert fast_call._load_in_background().result(timeout=10) == "module"
    assert fast_call.loaded() == "module" and builds == [1]
