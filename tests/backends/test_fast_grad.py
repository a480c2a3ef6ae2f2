"""The activations' C++ autograd extension (``backends/fast_grad.cpp``) as a build: off with
``TUNEKIT_FAST_CALL=0`` (the Python Function then runs every differentiable call), and the shared
build-on-a-worker helper (``extension.when_loaded_by``) that installs it. Its calls are tested in
``tests/ops/test_grad_call.py``."""

import importlib
import threading

import torch

import tunekit
from tunekit.backends import extension, fast_grad

silu_module = importlib.import_module("tunekit.ops.silu")


def _loader(result, gate: threading.Event | None = None):
    @extension.once
    def load():
        if gate is not None:
            assert gate.wait(timeout=30)
        return result
    return load


def test_when_loaded_installs_now_once_loaded_on_the_callers_thread():
    load = _loader(("module", None))
    load()
    seen = []
    extension.when_loaded_by(load, "t-now")(lambda m: seen.append((m, threading.current_thread().name)))
    assert seen == [("module", threading.current_thread().name)]


def test_when_loaded_builds_on_its_worker_and_never_makes_the_caller_wait():
    gate, done = threading.Event(), threading.Event()
    seen = []
    when_loaded = extension.when_loaded_by(_loader(("module", None), gate), "tunekit-test-build")

    def install(module):
        seen.append((module, threading.current_thread().name))
        done.set()
    when_loaded(install)  # returns at once: the load waits for the gate on the worker
    assert seen == []
    gate.set()
    assert done.wait(timeout=30)
    assert seen[0][0] == "module" and seen[0][1].startswith("tunekit-test-build")


def test_settle_waits_for_the_installs_asked_for():
    gate = threading.Event()
    when_loaded = extension.when_loaded_by(_loader(("module", None), gate), "tunekit-test-settle")
    seen = []
    when_loaded(seen.append)
    assert seen == []
    threading.Timer(0.2, gate.set).start()
    when_loaded.settle()  # returns once the worker has built and installed
    assert seen == ["module"]
    extension.when_loaded_by(_loader(("module", None)), "t-unused").settle()  # nothing asked for: returns


def test_when_loaded_never_installs_what_could_not_be_built():
    load = _loader((None, "no compiler"))
    when_loaded = extension.when_loaded_by(load, "t-never")
    seen = []
    when_loaded(seen.append)
    load()  # built (or refused) by now
    when_loaded(seen.append)
    assert seen == []


def test_switched_off_the_python_function_runs(monkeypatch):
    for _ in range(2):  # the signature tuned, its forward runner cached
        tunekit.silu(torch.randn(40, requires_grad=True))
    x = torch.randn(40, requires_grad=True)
    monkeypatch.setenv("TUNEKIT_FAST_CALL", "0")
    fast_grad._load.cache_clear()
    try:
        assert fast_grad.load() is None
        assert silu_module.GradCall(lambda t: silu_module.silu_op.fast_call(t), "silu").call(x) is None  # the Function runs the call
    finally:
        monkeypatch.undo()
        fast_grad._load.cache_clear()
    assert fast_grad.load() is not None
    y = silu_module.GradCall(lambda t: silu_module.silu_op.fast_call(t), "silu").call(x)  # the same call, the extension on
    assert y is not None and y.grad_fn.name() == "SiluBackward0"
