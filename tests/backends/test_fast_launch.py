"""The C launch extension: it builds here (CI has a C compiler and Python's headers), and it hands
the driver exactly the launch it was asked for. The driver entry point is replaced by a recording
stand-in with cuLaunchKernel's C signature, so the argument packing is checked without a GPU."""

import os

import pytest
import torch

from extension_checks import built
from launch_recorder import RecordingDriver, RecordingDriverEx
from tunekit.backends import fast_launch, thread_context


@pytest.fixture(scope="module")
def module():
    return built(fast_launch, "launch")


def test_packs_ints_and_tensor_pointers(module):
    x = torch.randn(37)
    y = torch.empty(5, dtype=torch.float16)
    driver = RecordingDriver(n_args=5)
    module.launch(driver.address, 0xDEAD0, 123457, 256, 0x5000, x, y, 1 << 40, -1, 7)
    (call,) = driver.calls
    assert call["function"] == 0xDEAD0
    assert call["grid"] == (123457, 1, 1) and call["block"] == (256, 1, 1)
    assert call["shared"] == 0 and call["stream"] == 0x5000 and call["extra"] is None
    assert call["values"] == [x.data_ptr(), y.data_ptr(), 1 << 40, 2**64 - 1, 7]


def test_stream_zero_and_many_arguments(module):
    values = list(range(3, 3 + module.MAX_KERNEL_ARGS))
    driver = RecordingDriver(n_args=len(values))
    module.launch(driver.address, 1, 1, 1, 0, *values)
    assert driver.calls[0]["stream"] is None  # NULL: the legacy default stream, passed through as given
    assert driver.calls[0]["values"] == values


def test_a_driver_error_raises_with_its_code(module):
    driver = RecordingDriver(n_args=1, result=700)
    with pytest.raises(RuntimeError, match="CUresult 700"):
        module.launch(driver.address, 1, 1, 32, 0, 5)
    assert len(driver.calls) == 1


@pytest.mark.parametrize("args, error", [
    ((1, 1, 1), TypeError),  # too few
    ((1, 1, 1, 32, 0, *range(17)), TypeError),  # more kernel parameters than it packs
    ((1, 1, 0, 32, 0), ValueError),  # empty grid
    ((1, 1, 2**32, 32, 0), ValueError),  # grid over 32 bits
    ((1, 1, 1, -1, 0), OverflowError),
    ((0, 1, 1, 32, 0), ValueError),  # null entry point
    ((1, 1, 1, 32, 0, "not a tensor"), AttributeError),
    ((1, 1, 1, 32, 0, 1.5), AttributeError),
])
def test_bad_calls_raise_before_the_driver_is_called(module, args, error):
    driver = RecordingDriver(n_args=1)
    args = (driver.address if args[0] else 0, *args[1:])
    with pytest.raises(error):
        module.launch(*args)
    assert driver.calls == []


def test_build_is_cached_and_atomic(tmp_path):
    first = fast_launch.build(tmp_path)
    inode = os.stat(first).st_ino
    assert fast_launch.build(tmp_path) == first and os.stat(first).st_ino == inode  # found, not rebuilt
    name = os.path.basename(first)  # the library, its SHA-256 and the build's lock; no temporaries left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, name + ".sha256", ".tunekit_fast_launch.lock"])


class FailingFirst(RecordingDriver):
    """cuLaunchKernel refusing launches (CUDA_ERROR_INVALID_CONTEXT) until a context is "bound"."""

    def __init__(self, n_args):
        super().__init__(n_args, result=201)

    def bind(self):
        self.result = 0
        return True


@pytest.fixture
def hook(module):
    """Installs a stand-in context hook for the test; tunekit's own afterwards."""
    calls = []

    def install(fn):
        def recorded():
            calls.append(1)
            return fn()
        module.set_context_hook(recorded)
        return calls

    yield install
    previous = module.set_context_hook(thread_context.launch_hook)
    assert previous is None or callable(previous)


def test_a_refused_launch_is_retried_once_when_the_hook_binds_a_context(module, hook):
    driver = FailingFirst(n_args=2)
    calls = hook(driver.bind)
    x = torch.randn(4)
    module.launch(driver.address, 0xF1, 3, 64, 0x10, x, 9)
    assert len(calls) == 1 and len(driver.calls) == 2  # refused, hook, retried
    assert driver.calls[0] == driver.calls[1] and driver.calls[1]["values"] == [x.data_ptr(), 9]
    module.launch(driver.address, 0xF1, 3, 64, 0x10, x, 9)  # bound now: no hook on the common path
    assert len(calls) == 1 and len(driver.calls) == 3


@pytest.mark.parametrize("answer", [False, "raise"])
def test_a_hook_that_binds_nothing_or_fails_leaves_the_launch_error(module, hook, answer):
    def no():
        if answer == "raise":
            raise RuntimeError("hook failed")
        return answer

    calls = hook(no)
    driver = RecordingDriver(n_args=1, result=201)
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUresult 201"):
        module.launch(driver.address, 1, 1, 32, 0, 5)
    assert len(calls) == 1 and len(driver.calls) == 1  # not retried


def test_the_dependent_launch_is_retried_the_same_way(module, hook):
    driver = RecordingDriverEx(n_args=1, result=201)

    def bind():
        driver.result = 0
        return True

    calls = hook(bind)
    module.launch_dependent(driver.address, 0xB0, 2, 128, 0, 7)
    assert len(calls) == 1 and len(driver.calls) == 2 and driver.calls[1]["attrs"] == [(6, 1)]


def test_set_context_hook_takes_a_callable_or_none(module):
    with pytest.raises(TypeError, match="callable"):
        module.set_context_hook(42)
    previous = module.set_context_hook(None)
    driver = RecordingDriver(n_args=1, result=201)
    with pytest.raises(RuntimeError, match="CUresult 201"):
        module.launch(driver.address, 1, 1, 32, 0, 5)  # no hook: the error as it is
    assert module.set_context_hook(previous) is None


def test_tunekit_installs_its_context_hook(module):
    previous = module.set_context_hook(None)
    module.set_context_hook(previous)
    assert previous is thread_context.launch_hook


def test_a_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises((RuntimeError, OSError)):
        fast_launch.build(tmp_path)


def test_launch_dependent_allows_programmatic_serialization(module):
    """cuLaunchKernelEx gets the same launch plus one attribute: programmatic stream serialization
    (id 6 in cuda.h) allowed."""
    x = torch.randn(11)
    driver = RecordingDriverEx(n_args=4)
    module.launch_dependent(driver.address, 0xBEEF0, 77, 256, 0x7000, x, 5, -2, 1 << 33)
    (call,) = driver.calls
    assert call["function"] == 0xBEEF0 and call["grid"] == (77, 1, 1) and call["block"] == (256, 1, 1)
    assert call["shared"] == 0 and call["stream"] == 0x7000 and call["extra"] is None
    assert call["attrs"] == [(6, 1)]
    assert call["values"] == [x.data_ptr(), 5, 2**64 - 2, 1 << 33]
    failing = RecordingDriverEx(n_args=1, result=801)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed: CUresult 801"):
        module.launch_dependent(failing.address, 1, 1, 32, 0, 5)
    with pytest.raises(ValueError):
        module.launch_dependent(driver.address, 1, 0, 32, 0)  # empty grid, before the driver is called
    assert len(driver.calls) == 1


def test_the_launch_config_matches_cuda_h(tmp_path):
    """fast_launch.c declares cuLaunchKernelEx's structs itself (no CUDA header at build time);
    compiled with TUNEKIT_CHECK_CUDA_H against the real cuda.h, static asserts compare every field
    it uses."""
    from tunekit.backends import extension, nvrtc

    found = [d for d in nvrtc.include_dirs() if os.path.exists(os.path.join(d, "cuda.h"))]
    if not found:
        if os.environ.get("CI"):
            pytest.fail("CI has the CUDA headers; cuda.h was not found")
        pytest.skip("no cuda.h on this machine")
    extension.build("fast_launch.c", "tunekit_fast_launch", flags=("-Wall", "-Werror", "-DTUNEKIT_CHECK_CUDA_H",
                                                                    f"-I{found[0]}"), directory=tmp_path)


def test_launch_grid_packs_a_triton_launch(module):
    """A 3-D grid, dynamic shared memory, and Triton's parameter kinds: None as a null pointer, a
    float as float32 bits in the slot's low half, ints as 64 bits, tensors as their addresses."""
    import struct

    x = torch.randn(8)
    driver = RecordingDriver(n_args=5)
    module.launch_grid(driver.address, 0xBEEF, 3, 2, 5, 128, 98304, 0x7000, x, None, 1.5, -3, 1 << 40)
    (call,) = driver.calls
    assert call["function"] == 0xBEEF and call["grid"] == (3, 2, 5) and call["block"] == (128, 1, 1)
    assert call["shared"] == 98304 and call["stream"] == 0x7000
    assert call["values"] == [x.data_ptr(), 0, struct.unpack("<I", struct.pack("<f", 1.5))[0], 2**64 - 3, 1 << 40]


def test_launch_grid_takes_as_many_parameters_as_a_gemm_kernel_and_refuses_more(module):
    values = list(range(module.MAX_GRID_ARGS))
    driver = RecordingDriver(n_args=len(values))
    module.launch_grid(driver.address, 1, 1, 1, 1, 32, 0, 0, *values)
    assert driver.calls[0]["values"] == values and module.MAX_GRID_ARGS >= 32
    with pytest.raises(TypeError):
        module.launch_grid(driver.address, 1, 1, 1, 1, 32, 0, 0, *values, 0)
    for args, error in (((0, 1, 1, 32, 0, 0), ValueError),  # empty grid
                        ((1, 1, 1, 32, 2**32, 0), ValueError),  # shared over 32 bits
                        ((1, 1, 1, 0, 0, 0), ValueError),  # no threads
                        ((1, 1, 1, 32, 0, 0, "not a tensor"), AttributeError)):
        with pytest.raises(error):
            module.launch_grid(driver.address, 1, *args)
    assert len(driver.calls) == 1


def test_launch_grid_retries_once_after_the_hook_binds_a_context(module, hook):
    driver = FailingFirst(n_args=1)
    calls = hook(driver.bind)
    module.launch_grid(driver.address, 0xF1, 2, 2, 1, 64, 1024, 0x10, 9)
    assert len(calls) == 1 and len(driver.calls) == 2 and driver.calls[0] == driver.calls[1]
    assert driver.calls[1]["grid"] == (2, 2, 1) and driver.calls[1]["shared"] == 1024
