"""Loading CUDA C kernels (tunekit.backends.cuda) without a GPU: the driver is a stand-in, the
compiles are real NVRTC. A kernel loads once per device however many threads ask at once, from its
own translation unit unless whole files are asked for (or one is loaded already), and a cached
cubin that will not load is compiled again."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import threading
import time

import pytest
import torch

from tunekit.backends import cuda, kernel_units, nvrtc

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")


def test_once_makes_each_value_once_whatever_the_threads():
    made = []
    gate = threading.Barrier(8)

    def make(key):
        made.append(key)
        time.sleep(0.05)  # every other thread arrives while this one is still making it
        return f"value of {key}"

    once = cuda._Once(make)

    def ask(_):
        gate.wait()
        return once("k")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        values = list(pool.map(ask, range(8)))
    assert values == ["value of k"] * 8 and made == ["k"]
    assert once.get("k") == "value of k" and once.get("other") is None


def test_once_does_not_make_one_key_wait_for_another():
    started, release = threading.Event(), threading.Event()

    def make(key):
        if key == "slow":
            started.set()
            assert release.wait(10)
        return key

    once = cuda._Once(make)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(once, "slow")
        assert started.wait(10)
        assert once("fast") == "fast"  # while "slow" is still being made
        release.set()
        assert slow.result() == "slow"


def test_once_keeps_no_failure():
    attempts = []

    def make(key):
        attempts.append(key)
        if len(attempts) == 1:
            raise RuntimeError("compile failed")
        return "ok"

    once = cuda._Once(make)
    with pytest.raises(RuntimeError):
        once("k")
    assert once("k") == "ok" and len(attempts) == 2


class StandInDriver:
    """cuModuleLoadData / cuModuleGetFunction as cuda-bindings returns them (error code first)."""

    def __init__(self, refuse=lambda image: False):
        self.loads, self.lookups, self.refuse = [], [], refuse
        self.lock = threading.Lock()

    def cuModuleLoadData(self, image):
        with self.lock:
            self.loads.append(bytes(image))
            return (200 if self.refuse(image) else 0), 1000 + len(self.loads)  # 200: CUDA_ERROR_INVALID_IMAGE

    def cuModuleGetFunction(self, module, name):
        with self.lock:
            self.lookups.append((module, name))
            return 0, 0xF000 + module


@pytest.fixture
def stand_in(monkeypatch):
    """cuda's driver replaced, module loads made afresh, and loading's device steps a no-op."""
    driver = StandInDriver()
    monkeypatch.setattr(cuda, "libcuda", lambda: driver)
    monkeypatch.setattr(cuda, "_modules", cuda._Once(cuda._load_module))
    monkeypatch.setattr(cuda, "_prepare", lambda index: "sm_90")
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    previous = cuda.compile_whole_files(False)
    yield driver
    cuda.compile_whole_files(previous)


@needs_nvrtc
def test_threads_loading_one_kernel_compile_and_load_it_once(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    compiles = []
    real = nvrtc._nvrtc_compile
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda code, name, opts: compiles.append(name) or real(code, name, opts))
    kernel = cuda.CudaKernel("silu.cu", "silu_f16x8_pack")
    gate = threading.Barrier(8)

    def address(_):
        gate.wait()
        return kernel.address(0)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        addresses = set(pool.map(address, range(8)))
    assert compiles == ["silu.cu:silu_f16x8_pack"] and len(stand_in.loads) == 1 and len(stand_in.lookups) == 1
    assert addresses == {0xF000 + 1001}
    assert kernel_units.kernel_names("silu.cu")  # the unit compiled was the kernel's own:
    assert stand_in.loads[0] == nvrtc.compile_cubin(kernel_units.kernel_source("silu.cu", "silu_f16x8_pack"),
                                                    "silu.cu:silu_f16x8_pack", "sm_90")


def _modules_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(cuda, "_modules", cuda._Once(lambda *key: asked.append(key) or len(asked)))
    return asked


def test_a_kernel_loads_its_own_unit_unless_its_file_is_loaded_or_asked_for(monkeypatch):
    asked = _modules_asked(monkeypatch)
    previous = cuda.compile_whole_files(False)
    try:
        cuda._module("gelu.cu", (), 0, "gelu_f16x8")
        assert asked[-1] == ("gelu.cu", (), 0, "gelu_f16x8")
        cuda._modules._values[("gelu.cu", (), 0, None)] = "whole"  # the file is loaded on device 0: it serves
        assert cuda._module("gelu.cu", (), 0, "gelu_bf16x8") == "whole"
        cuda._module("gelu.cu", (), 1, "gelu_bf16x8")  # not on device 1
        assert asked[1:] == [("gelu.cu", (), 1, "gelu_bf16x8")]
        assert cuda.compile_whole_files(True) is False
        cuda._module("silu.cu", (), 0, "silu_f32")
        assert asked[-1] == ("silu.cu", (), 0, None)
    finally:
        cuda.compile_whole_files(previous)


@needs_nvrtc
def test_a_kernel_its_file_does_not_define_alone_loads_the_whole_file(stand_in, tmp_path, monkeypatch):
    """Its unit cannot be made: the whole file's module is loaded (and its function lookup names
    the missing kernel); a unit found in the cache never needs the 60 ms of preprocessing."""
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    assert cuda._modules("gelu.cu", (), 0, "gelu_no_such_kernel") == cuda._modules.get("gelu.cu", (), 0, None)
    assert stand_in.loads[0] == nvrtc.compile_cubin(nvrtc.source("gelu.cu"), "gelu.cu", "sm_90")
    cuda._modules("gelu.cu", (), 0, "gelu_f16x8")  # compiled and cached
    monkeypatch.setattr(cuda, "_modules", cuda._Once(cuda._load_module))
    monkeypatch.setattr(kernel_units, "kernel_source", lambda *a: pytest.fail("preprocessed a cached unit"))
    cuda._modules("gelu.cu", (), 0, "gelu_f16x8")
    assert stand_in.loads[-1] == stand_in.loads[-2]


@needs_nvrtc
def test_a_cached_cubin_that_will_not_load_is_compiled_again(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    code = kernel_units.kernel_source("silu.cu", "silu_f32")
    good = nvrtc.compile_cubin(code, "silu.cu:silu_f32", "sm_90", identity=kernel_units.unit_identity("silu.cu", "silu_f32"))
    (cached,) = (tmp_path / "cubin").iterdir()
    cached.write_bytes(b"\x7fELF and then garbage")  # passes the cheap check, fails to load
    stand_in.refuse = lambda image: bytes(image) != good
    module = cuda._modules("silu.cu", (), 0, "silu_f32")
    assert module == 1002 and len(stand_in.loads) == 2 and stand_in.loads[1] == good
    assert cached.read_bytes() == good  # the cache holds the good one again


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a usable CUDA driver")
def test_the_launch_hook_never_raises():
    """What the launchers call after a refused launch: with no usable driver it cannot bind a
    context, and says so (False: the launch's own error is reported), never raising."""
    from tunekit.backends import thread_context

    assert thread_context.launch_hook() is False


@pytest.mark.gpu
def test_the_ctypes_driver_answers_as_cuda_bindings_does(cuda):
    """libcuda() (loading without importing cuda-bindings) against cuda-bindings itself."""
    from tunekit.backends.driver import bindings, libcuda

    torch.ones(1, device=cuda).add_(1)  # the primary context current in this thread
    driver, ours = bindings()[0], libcuda()
    assert ours.cuDriverGetVersion() == (0, driver.cuDriverGetVersion()[1])
    assert ours.cuCtxGetCurrent()[1] == int(driver.cuCtxGetCurrent()[1]) != 0
    err, version = ours.cuDriverGetVersion()
    legacy = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    assert ours.cuGetProcAddress(b"cuLaunchKernel", version, ours.LEGACY_STREAM)[1] == int(
        driver.cuGetProcAddress(b"cuLaunchKernel", version, legacy)[1]) != 0
    image = nvrtc.compile_cubin('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "k",
                                nvrtc.arch_of(torch.device(cuda)))
    err, module = ours.cuModuleLoadData(image)
    assert err == 0 and module
    err, fn = ours.cuModuleGetFunction(module, b"k")
    assert err == 0 and fn and ours.cuModuleGetFunction(module, b"missing")[0] != 0
    x = torch.zeros(1, device=cuda)
    holder = ctypes.c_uint64(x.data_ptr())
    params = (ctypes.c_void_p * 1)(ctypes.addressof(holder))
    (err,) = driver.cuLaunchKernel(driver.CUfunction(fn), 1, 1, 1, 1, 1, 1, 0, torch.cuda.current_stream().cuda_stream,
                                   ctypes.addressof(params), 0)
    assert int(err) == 0 and x.item() == 1.0


class _StandInLibcuda:
    """libcuda's C functions as Python callables: each writes its out-argument and returns 0."""

    def __init__(self, with_proc_address=True):
        self.calls = []
        if not with_proc_address:
            self.cuGetProcAddress_v2 = None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            out = next((a for a in args if hasattr(a, "_obj")), None)  # byref(out): what the driver writes
            if out is not None:
                out._obj.value = {"cuDriverGetVersion": 13000, "cuDeviceGet": 2}.get(name, 0xC0DE)
            return 0
        setattr(self, name, call)
        return call


def test_the_ctypes_driver_answers_in_cuda_bindings_convention():
    from tunekit.backends.driver import _LibCuda

    lib = _StandInLibcuda()
    driver = _LibCuda(lib)
    assert driver.cuDriverGetVersion() == (0, 13000)
    assert driver.cuModuleLoadData(b"\x7fELF") == (0, 0xC0DE)
    assert driver.cuModuleGetFunction(0xC0DE, b"k") == (0, 0xC0DE)
    assert driver.cuDeviceGet(2) == (0, 2) and driver.cuCtxSetCurrent(0xC0DE) == (0,)
    assert driver.cuGetProcAddress(b"cuLaunchKernel", 13000, driver.LEGACY_STREAM)[:2] == (0, 0xC0DE)
    assert [c[0] for c in lib.calls][-1] == "cuGetProcAddress_v2"
    old = _LibCuda(_StandInLibcuda(with_proc_address=False))  # a driver before CUDA 12
    assert old.cuGetProcAddress(b"cuLaunchKernel", 11080, old.LEGACY_STREAM)[0] != 0
