"""tunekit's own CUDA streams and the thread's capture modes (tunable/isolation.py), against a fake driver on
the CPU: the calls in order, the context popped and the mode restored whatever fails; tuning runs THREAD_LOCAL.
On a GPU: tests/backends/test_capture_safety.py."""

import ctypes
import gc
import threading

import pytest
import torch

from tunekit.tunable import isolation, tuning
from tunekit.tunable.find_fastest import find_fastest

from fakes import FakeClock, ScaleParams, make_op


class FakeDriver:
    """The driver calls isolation makes, recorded; ``fail`` names one that returns an error (CUresult 1)."""

    def __init__(self, fail: str | None = None, previous_mode: int = 0):
        self.calls, self.fail, self.mode = [], fail, previous_mode

    def _result(self, name, *args):
        self.calls.append((name, *args))
        return 1 if name == self.fail else 0

    def cuDeviceGet(self, device, index):
        ctypes.cast(device, ctypes.POINTER(ctypes.c_int))[0] = 10 + index
        return self._result("cuDeviceGet", index)

    def cuDevicePrimaryCtxRetain(self, context, device):
        ctypes.cast(context, ctypes.POINTER(ctypes.c_void_p))[0] = 0xC0
        return self._result("cuDevicePrimaryCtxRetain", device.value)

    def cuCtxPushCurrent_v2(self, context):
        return self._result("push", context.value)

    def cuCtxPopCurrent_v2(self, out):
        return self._result("pop")

    def cuStreamCreate(self, stream, flags):
        ctypes.cast(stream, ctypes.POINTER(ctypes.c_void_p))[0] = 0x5EA
        return self._result("cuStreamCreate", flags)

    def cuThreadExchangeStreamCaptureMode(self, mode):
        value = ctypes.cast(mode, ctypes.POINTER(ctypes.c_int))
        self.calls.append(("exchange", value[0]))
        value[0], self.mode = self.mode, value[0]
        return 1 if self.fail == "exchange" else 0


def test_a_stream_is_made_non_blocking_in_the_devices_primary_context_pushed_for_the_call():
    driver = FakeDriver()
    assert isolation.create_handle(1, driver) == 0x5EA
    assert driver.calls == [("cuDeviceGet", 1), ("cuDevicePrimaryCtxRetain", 11), ("push", 0xC0),
                            ("cuStreamCreate", isolation.STREAM_NON_BLOCKING), ("pop",)]


def test_the_context_is_popped_when_the_stream_cannot_be_made():
    driver = FakeDriver(fail="cuStreamCreate")
    with pytest.raises(RuntimeError, match="cuStreamCreate"):
        isolation.create_handle(0, driver)
    assert driver.calls[-1] == ("pop",)


@pytest.mark.parametrize("fail", ["cuDeviceGet", "cuDevicePrimaryCtxRetain", "push"])
def test_nothing_is_popped_that_was_not_pushed(fail):
    driver = FakeDriver(fail=fail)
    with pytest.raises(RuntimeError):
        isolation.create_handle(0, driver)
    assert ("pop",) not in driver.calls and ("cuStreamCreate", 1) not in [c[:2] for c in driver.calls]


MODES = [(isolation.relaxed, isolation.CAPTURE_MODE_RELAXED), (isolation.apart, isolation.CAPTURE_MODE_THREAD_LOCAL)]


@pytest.mark.parametrize("block, mode", MODES, ids=["relaxed", "apart"])
def test_a_mode_is_set_and_the_one_before_restored_even_when_the_block_raises(block, mode):
    driver = FakeDriver(previous_mode=0)  # the thread was GLOBAL, the default
    with block(driver):
        assert driver.mode == mode
    assert driver.mode == 0 and driver.calls == [("exchange", mode), ("exchange", 0)]
    with pytest.raises(ValueError), block(driver):
        raise ValueError("the block's own error")
    assert driver.mode == 0


def test_modes_nest_each_restoring_the_one_it_found():
    """resolve runs apart (THREAD_LOCAL); a backend's load inside it runs relaxed, then apart again."""
    driver = FakeDriver(previous_mode=0)
    with isolation.apart(driver):
        with isolation.relaxed(driver):
            assert driver.mode == isolation.CAPTURE_MODE_RELAXED
        assert driver.mode == isolation.CAPTURE_MODE_THREAD_LOCAL
    assert driver.mode == 0


@pytest.mark.parametrize("block", [m[0] for m in MODES], ids=["relaxed", "apart"])
def test_a_driver_that_refuses_the_mode_is_reported_and_no_block_runs(block):
    with pytest.raises(RuntimeError, match="cuThreadExchangeStreamCaptureMode"), block(FakeDriver(fail="exchange")):
        pytest.fail("the block ran")


@pytest.mark.parametrize("block", [m[0] for m in MODES], ids=["relaxed", "apart"])
def test_before_cuda_is_initialised_no_driver_is_touched(block, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(isolation, "driver_library", lambda: pytest.fail("the driver was loaded"))
    with block():
        pass


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_each_live_thread_has_its_own_stream_and_an_ended_threads_stream_passes_on(monkeypatch):
    made = []
    monkeypatch.setattr(isolation, "new_stream", lambda device: made.append(device) or object())
    monkeypatch.setattr(isolation, "_free", {})
    device = torch.device("cuda", 0)
    mine = isolation.stream_for_thread(device)
    assert isolation.stream_for_thread(device) is mine and len(made) == 1  # made once per thread
    hold, release, theirs = threading.Event(), threading.Event(), []

    def holder():  # a second live thread: a stream of its own
        theirs.append(isolation.stream_for_thread(device))
        hold.set()
        release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert hold.wait(10) and theirs[0] is not mine and len(made) == 2
    release.set()
    t.join()
    gc.collect()  # the ended thread's local storage, and with it its token, is gone: its stream is free
    assert in_thread(lambda: isolation.stream_for_thread(device)) is theirs[0] and len(made) == 2
    assert in_thread(lambda: isolation.stream_for_thread(torch.device("cuda", 1))) is not mine and len(made) == 3


class Recording:
    """isolation.apart's stand-in: how deep in it the calling code is."""
    depth = 0

    def __enter__(self):
        type(self).depth += 1

    def __exit__(self, *exc):
        type(self).depth -= 1


def test_tuning_online_and_offline_runs_apart_from_other_threads_captures(monkeypatch):
    """A signature's tuning (resolve: the session made, its work, the decision; find_fastest alike) runs inside
    isolation.apart (THREAD_LOCAL): another thread's capture does not refuse its allocations and synchronizations,
    while its own graph captures still fail on a candidate that cannot be captured. What the op's candidates ran
    under, and whether the mode was left after."""
    monkeypatch.setattr(isolation, "apart", Recording)
    clock = FakeClock()
    op = make_op(clock, {"ref": 2.0, "fast": 1.0})
    op.clock = clock  # the online sessions' clock
    depths = []
    for c in op.candidates:
        run = c.run
        c.run = lambda p, run=run: depths.append(Recording.depth) or run(p)
    x = torch.randn(64)
    with tuning(max_tuning_ms=1e6) as s:
        report = find_fastest(op, ScaleParams(x), s, clock=clock)
        assert report.choice == "fast" and depths and set(depths) == {1}
        depths.clear()
        r = op.resolve(ScaleParams(torch.randn(65)), s, finish=True)
        assert r.candidate.name == "fast", r.why
    assert depths and set(depths) == {1} and Recording.depth == 0
