"""backends/fast_plan.cpp: a KernelPlan allocates the result and its temporaries and hands the driver
each recorded launch with its slots filled in (a recording stand-in with cuLaunchKernel's C signature
replaces the driver, so no GPU is needed)."""

import pytest
import torch

from extension_checks import built
from launch_recorder import RecordingDriver
from tunekit.backends import fast_plan
from tunekit.backends.fast_plan import SLOT_CONSTANT, SLOT_OPERAND, SLOT_RESULT, SLOT_SCRATCH, SLOT_TEMPORARY


@pytest.fixture(scope="module")
def module():
    return built(fast_plan, "fast-plan")


def plan(module, driver, launches, *, operands=3, sizes=(4, 6), strides=(6, 1), temporaries=(64,), streams=None):
    def stream(index):
        if streams is not None:
            streams.append(index)
        return 0x5000
    return module.KernelPlan(driver.address, operands, 2, stream, sizes, strides, temporaries, launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_plan_allocates_its_result_and_fills_every_kind_of_slot(module, dtype):
    driver, streams = RecordingDriver(n_args=6), []
    first = (0xF00D, 7, 3, 2, 256, 1024, 0, ((SLOT_OPERAND, 0), (SLOT_OPERAND, 1), (SLOT_OPERAND, 2),
                                             (SLOT_TEMPORARY, 0), (SLOT_CONSTANT, -3), (SLOT_CONSTANT, 0x3F800000)))
    second = (0xBEEF, 5, 1, 1, 128, 0, 4096, ((SLOT_TEMPORARY, 0), (SLOT_RESULT, 0), (SLOT_SCRATCH, 0),
                                             (SLOT_CONSTANT, 6), (SLOT_CONSTANT, 0), (SLOT_OPERAND, 1)))
    p = plan(module, driver, (first, second), sizes=(2, 3, 5), strides=(15, 5, 1), streams=streams)
    a, b = torch.randn(2, 3, 7, dtype=dtype), torch.randn(7, 5, dtype=dtype).t()
    out = p(a, b, None)
    assert out.shape == (2, 3, 5) and out.stride() == (15, 5, 1) and out.dtype == dtype and out.device == a.device
    one, two = driver.calls
    assert one["function"] == 0xF00D and one["grid"] == (7, 3, 2) and one["block"] == (256, 1, 1)
    assert one["shared"] == 1024 and one["stream"] == 0x5000 and one["extra"] is None
    workspace = one["values"][3]
    assert one["values"] == [a.data_ptr(), b.data_ptr(), 0, workspace, (1 << 64) - 3, 0x3F800000]
    assert two["function"] == 0xBEEF and two["grid"] == (5, 1, 1) and two["block"] == (128, 1, 1) and two["shared"] == 0
    scratch = two["values"][2]
    assert two["values"] == [workspace, out.data_ptr(), scratch, 6, 0, b.data_ptr()]
    live = {a.data_ptr(), b.data_ptr(), out.data_ptr()}
    assert workspace not in live and scratch not in live and workspace != 0 and scratch != 0 and scratch != workspace
    assert streams == [2]  # once per call, for the device index bound


def test_a_plan_without_scratch_passes_null_and_a_plan_without_launches_only_allocates(module):
    driver = RecordingDriver(n_args=1)
    p = plan(module, driver, ((1, 1, 1, 1, 32, 0, 0, ((SLOT_SCRATCH, 0),)),), operands=1, temporaries=())
    x = torch.randn(3)
    p(x)
    assert driver.calls[0]["values"] == [0]
    empty = plan(module, driver, (), operands=2, sizes=(0, 5), strides=(5, 1), temporaries=())(x, x)
    assert empty.shape == (0, 5) and len(driver.calls) == 1


def test_plan_errors_are_clear(module):
    driver = RecordingDriver(n_args=1, result=719)
    launch = (1, 1, 1, 1, 32, 0, 0, ((SLOT_OPERAND, 0),))
    p = plan(module, driver, (launch,), operands=2, temporaries=())
    with pytest.raises(RuntimeError, match="CUresult 719"):
        p(torch.randn(4), torch.randn(4))
    with pytest.raises(TypeError, match="takes 2 operands"):
        p(torch.randn(4))
    with pytest.raises(TypeError, match="takes 2 operands"):
        p(None, torch.randn(4))
    with pytest.raises(TypeError, match="tensors or None"):
        p(torch.randn(4), [1.0])
    bad_launches = [
        (0, 1, 1, 1, 32, 0, 0, ()),  # null function
        (1, 0, 1, 1, 32, 0, 0, ()),  # empty grid
        (1, 1, 1, 1, 0, 0, 0, ()),  # empty block
        (1, 1, 1, 1, 32, 0, -1, ()),  # negative scratch
        (1, 1, 1, 1, 32, 0, 0, ((SLOT_OPERAND, 2),)),  # no operand 2
        (1, 1, 1, 1, 32, 0, 0, ((SLOT_TEMPORARY, 0),)),  # no temporary
        (1, 1, 1, 1, 32, 0, 0, ((9, 0),)),  # no such kind
    ]
    for bad in bad_launches:
        with pytest.raises(ValueError):
            plan(module, driver, (bad,), operands=2, temporaries=())
    with pytest.raises(ValueError, match="differ in length"):
        plan(module, driver, (), sizes=(2, 3), strides=(1,))
    with pytest.raises(ValueError):
        module.KernelPlan(0, 1, 0, lambda i: 0, (1,), (1,), (), ())
    with pytest.raises(TypeError):
        plan(module, driver, [launch], operands=2)  # launches: a tuple


def test_a_broken_stream_function_raises_before_any_launch(module):
    driver = RecordingDriver(n_args=0)

    def broken(index):
        raise RuntimeError("no stream")
    p = module.KernelPlan(driver.address, 1, 0, broken, (2,), (1,), (), ((1, 1, 1, 1, 32, 0, 0, ()),))
    with pytest.raises(RuntimeError, match="no stream"):
        p(torch.randn(2))
    assert driver.calls == []
