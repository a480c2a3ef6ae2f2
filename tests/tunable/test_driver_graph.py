"""Tuning's graphs through the driver's stream capture (tunable/driver_graph.py), against a fake driver on the
CPU: the calls in order, THREAD_LOCAL mode, the runs' allocations in a private pool released once, with the graph
or the failed capture; the capture ended and the graph freed whatever fails. On a GPU:
tests/backends/test_capture_safety.py and the timer tests."""

import contextlib
import ctypes
import gc
from types import SimpleNamespace

import pytest
import torch

from tunekit.tunable import driver_graph, isolation

GRAPH, EXEC, STREAM, CURRENT = 0x6A, 0xE0, 0x5EA, 0xC5


class FakeDriver:
    """The driver calls of a capture, recorded; ``fail`` names one that returns an error."""

    def __init__(self, fail: str | None = None):
        self.calls, self.fail = [], fail

    def _result(self, name, *args):
        self.calls.append((name, *args))
        return {"end": 901}.get(name, 1) if name == self.fail else 0

    def cuStreamBeginCapture_v2(self, stream, mode):
        return self._result("begin", stream.value, mode)

    def cuStreamEndCapture(self, stream, graph):
        if self.fail != "end":
            ctypes.cast(graph, ctypes.POINTER(ctypes.c_void_p))[0] = GRAPH
        return self._result("end", stream.value)

    def cuGraphInstantiateWithFlags(self, graph_exec, graph, flags):
        if self.fail != "instantiate":
            ctypes.cast(graph_exec, ctypes.POINTER(ctypes.c_void_p))[0] = EXEC
        return self._result("instantiate", graph.value, flags.value)

    def cuGraphLaunch(self, graph_exec, stream):
        return self._result("launch", graph_exec.value, stream.value)

    def cuGraphExecDestroy(self, graph_exec):
        return self._result("exec destroyed", graph_exec.value)

    def cuGraphDestroy(self, graph):
        return self._result("graph destroyed", graph.value)


@pytest.fixture
def fake_torch(monkeypatch):
    """torch's allocator pool calls, stream context and current stream, recorded (no GPU here)."""
    seen = SimpleNamespace(pool_calls=[], streams=[], routing=False, fail_route=False)
    ids = iter(range(1, 100))
    monkeypatch.setattr(torch._C, "_graph_pool_handle", lambda: (0, next(ids)), raising=False)

    def call(what):
        def record(index, pool):
            if what == "route" and seen.fail_route:
                raise RuntimeError("cannot route")
            seen.pool_calls.append((what, pool))
            seen.routing = {"route": True, "unroute": False}.get(what, seen.routing)
        return record

    for name, what in (("_cuda_beginAllocateCurrentThreadToPool", "route"), ("_cuda_endAllocateToPool", "unroute"),
                       ("_cuda_releasePool", "release")):
        monkeypatch.setattr(torch._C, name, call(what), raising=False)

    @contextlib.contextmanager
    def stream(s):
        seen.streams.append(s)
        yield

    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=CURRENT))
    return seen


def runs(driver, log, seen):
    """A run that records whether the driver was capturing and the allocations routed to the pool when it ran."""
    def run():
        capturing = any(c[0] == "begin" for c in driver.calls) and not any(c[0] == "end" for c in driver.calls)
        log.append((capturing, seen.routing))
    return run


def releases(seen) -> int:
    return sum(what == "release" for what, _ in seen.pool_calls)


def test_a_capture_runs_once_outside_then_reps_times_inside_thread_local_and_instantiates(fake_torch):
    driver, log = FakeDriver(), []
    graph = driver_graph.capture(runs(driver, log, fake_torch), 3, SimpleNamespace(cuda_stream=STREAM),
                                 torch.device("cuda", 0), driver)
    # the warm-up outside the capture and the pool (a workspace it keeps stays in the main pool), then three runs
    assert log == [(False, False)] + [(True, True)] * 3
    assert driver.calls == [("begin", STREAM, isolation.CAPTURE_MODE_THREAD_LOCAL), ("end", STREAM),
                            ("instantiate", GRAPH, 0)]
    assert fake_torch.pool_calls == [("route", graph.pool.id), ("unroute", graph.pool.id)]  # released with the graph
    graph.replay()
    assert driver.calls[-1] == ("launch", EXEC, CURRENT)  # on the current stream, where the timer's events are


def test_the_graph_is_freed_with_its_last_reference(fake_torch):
    driver = FakeDriver()
    graph = driver_graph.capture(lambda: None, 1, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    pool = graph.pool.id
    del graph
    gc.collect()
    assert driver.calls[-2:] == [("exec destroyed", EXEC), ("graph destroyed", GRAPH)]
    assert fake_torch.pool_calls[-1] == ("release", pool) and releases(fake_torch) == 1  # freeable once gone


def test_a_run_that_raises_ends_the_capture_and_its_error_is_the_one_raised(fake_torch):
    driver, calls = FakeDriver(), []

    def run():
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("the candidate's own error")

    with pytest.raises(ValueError, match="own error"):
        driver_graph.capture(run, 4, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    assert [c[0] for c in driver.calls] == ["begin", "end", "graph destroyed"]
    assert [c[0] for c in fake_torch.pool_calls] == ["route", "unroute", "release"]  # released once


def test_an_invalidated_capture_raises_and_instantiates_nothing(fake_torch):
    driver = FakeDriver(fail="end")
    with pytest.raises(RuntimeError, match="cuStreamEndCapture.*901"):
        driver_graph.capture(lambda: None, 2, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    assert [c[0] for c in driver.calls] == ["begin", "end"]
    assert [c[0] for c in fake_torch.pool_calls] == ["route", "unroute", "release"]  # released once


def test_a_graph_that_cannot_be_instantiated_is_freed(fake_torch):
    driver = FakeDriver(fail="instantiate")
    with pytest.raises(RuntimeError, match="cuGraphInstantiateWithFlags"):
        driver_graph.capture(lambda: None, 2, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    assert driver.calls[-1] == ("graph destroyed", GRAPH) and fake_torch.pool_calls[-1][0] == "release"


def test_no_capture_begins_when_the_warm_up_fails(fake_torch):
    driver = FakeDriver()

    def run():
        raise RuntimeError("cannot run")

    with pytest.raises(RuntimeError, match="cannot run"):
        driver_graph.capture(run, 2, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    assert driver.calls == [] and fake_torch.pool_calls == []  # no pool made, none released


def test_a_run_that_raises_in_a_capture_the_driver_invalidated_still_raises_its_own_error(fake_torch):
    driver = FakeDriver(fail="end")

    def run():
        if any(c[0] == "begin" for c in driver.calls):
            raise ValueError("the candidate's own error")

    with pytest.raises(ValueError, match="own error"):
        driver_graph.capture(run, 2, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0), driver)
    assert [c[0] for c in driver.calls] == ["begin", "end"] and releases(fake_torch) == 1


def test_a_pool_that_could_not_be_routed_to_is_never_released(fake_torch):
    """Releasing a pool the allocator never made fails its assertion, hiding the real error."""
    fake_torch.fail_route = True
    with pytest.raises(RuntimeError, match="cannot route"):
        driver_graph.capture(lambda: None, 2, SimpleNamespace(cuda_stream=STREAM), torch.device("cuda", 0),
                             FakeDriver())
    assert releases(fake_torch) == 0


@pytest.mark.parametrize("driver_graphs", [True, False])
def test_the_graph_timer_captures_through_the_driver_where_torch_has_the_pool_calls(monkeypatch, fake_torch,
                                                                                   driver_graphs):
    """torch 2.8 and later: the driver's capture; before: ``torch.cuda.CUDAGraph`` (thread_local mode). Either way on
    this thread's own stream, which waits for the current stream first and is waited for after."""
    from tunekit.tunable import timing

    class Stream(SimpleNamespace):
        def wait_stream(self, other):
            waits.append((self.name, other.name))

    waits, made = [], []
    own, current = Stream(name="own", cuda_stream=STREAM), Stream(name="current", cuda_stream=CURRENT)
    monkeypatch.setattr(timing.isolation, "stream_for_thread", lambda device: own)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(driver_graph, "available", lambda: driver_graphs)
    monkeypatch.setattr(driver_graph, "capture",
                        lambda fn, reps, stream, device: made.append(("driver", stream)) or "g")

    class TorchGraph:
        def capture_begin(self, capture_error_mode):
            made.append(("torch", capture_error_mode))

        def capture_end(self):
            made.append(("end",))

    monkeypatch.setattr(torch.cuda, "CUDAGraph", TorchGraph)
    timer = timing.CudaGraphTimer.__new__(timing.CudaGraphTimer)
    timer.device = torch.device("cuda", 0)
    runs = []
    graph = timer._capture(lambda: runs.append(1), 2)
    assert waits == [("own", "current"), ("current", "own")]
    if driver_graphs:
        assert graph == "g" and made == [("driver", own)]
    else:
        assert isinstance(graph, TorchGraph) and made == [("torch", "thread_local"), ("end",)] and len(runs) == 3
