"""The GEMM routes' C++ extension (``backends/fast_gemm.cpp``): built and loaded like fast_call's, off
with ``TUNEKIT_FAST_CALL=0``, its constructor's checks, and keys that tell the forms apart."""

import pytest
import torch

from tunekit.backends import fast_gemm
from tunekit.tunable import context

module = fast_gemm.load()
pytestmark = pytest.mark.skipif(module is None, reason=f"fast_gemm not built here: {fast_gemm.unavailable()}")
TYPES = (torch.Tensor, torch.nn.Parameter)


def route(form: int, routes: dict | None = None):
    return module.GemmRoute(form, {} if routes is None else routes, context._current, context, TYPES)


def test_switched_off_by_the_fast_call_variable(monkeypatch):
    monkeypatch.setenv("TUNEKIT_FAST_CALL", "0")
    fast_gemm._load.cache_clear()
    try:
        assert fast_gemm.load() is None and "TUNEKIT_FAST_CALL" in fast_gemm.unavailable()
        installed = []
        fast_gemm.when_loaded(installed.append)
        assert installed == []  # nothing to install, and no build started
    finally:
        monkeypatch.undo()
        fast_gemm._load.cache_clear()
        assert fast_gemm.load() is not None


@pytest.mark.parametrize("args", [
    (7, {}, context._current, context, TYPES),  # no such form (6 is rms_norm's)
    (0, {}, "not a ContextVar", context, TYPES),
    (0, {}, context._current, context, (int,)),  # not a tensor type
    (0, {}, context._current, context, ()),
])
def test_the_constructor_refuses_what_it_cannot_use(args):
    with pytest.raises(TypeError):
        module.GemmRoute(*args)


def test_keys_are_stable_and_tell_forms_apart():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    mm, matmul = route(1), route(5)
    assert mm.key(a, b) == mm.key(a, b) and mm.key(a, b) != matmul.key(a, b)
    assert mm.key(a, b) != mm.key(a, torch.randn(7, 4)) and mm.key(a, b, a) is None


def test_a_route_calls_torch_only_for_keys_routed_under_the_current_settings():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    routes = {}
    mm = route(1, routes)
    assert mm(a, b) is None
    routes[context.current().cache_id] = {mm.key(a, b): False}
    assert mm(a, b) is None
    routes[context.current().cache_id] = {mm.key(a, b): True}
    assert torch.equal(mm(a, b), torch.mm(a, b))
    assert mm(a, b=b) is None  # keywords are never routed
    assert mm(b.t(), a.t()) is None  # another key
