"""Host time of the ways tunekit could launch an NVRTC-compiled kernel, against torch's own launch
(``F.silu``): which part of the CUDA C path's host time is the driver call, which is Python.

Run on a GPU machine: ``PYTHONPATH=src python benchmarks/suites/launch_overhead.py``. Each row is the
median over repeats of N back-to-back calls / N (the queue never fills: one-block kernels).
"""

from __future__ import annotations

import ctypes
import statistics
import time

import torch
import torch.nn.functional as F

import tunekit  # noqa: F401
from tunekit.backends import driver as driver_module, fast_launch
from tunekit.ops.silu import silu_op


def per_call_us(fn, calls=20000, repeats=7):
    for _ in range(500):
        fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main():
    driver, _ = driver_module.bindings()
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    kernel = silu_op.candidate("silu_f32x4").kernel
    fn = kernel.function(0)
    kernel.launch(0, 1, 256, x, y, x.numel())
    torch.cuda.synchronize()
    holders, array, address = kernel._arg_array(3)
    for h, v in zip(holders, (x.data_ptr(), y.data_ptr(), x.numel())):
        h.value = v
    stream = torch.cuda.current_stream().cuda_stream
    stream_obj = driver.CUstream(stream)
    lib = ctypes.CDLL("libcuda.so.1")
    raw = lib.cuLaunchKernel
    fn_ptr = ctypes.c_void_p(int(fn))
    one, b256, zero = ctypes.c_uint(1), ctypes.c_uint(256), ctypes.c_uint(0)
    s_ptr, a_ptr = ctypes.c_void_p(stream), ctypes.c_void_p(address)
    xp, yp = x.data_ptr(), y.data_ptr()
    fast = fast_launch.load()
    entry = fast_launch.driver_entry_point() if fast is not None else 0
    fn_int = int(fn)
    rows = [
        ("F.silu(x) (torch: allocation + launch)", lambda: F.silu(x)),
        ("torch._C._nn.silu(x, out=y) (torch: launch only)", lambda: torch._C._nn.silu(x, out=y)),
        ("CudaKernel.launch (tunekit today)", lambda: kernel.launch(0, 1, 256, x, y, 1024)),
        ("CudaKernel._launch_with_bindings (cuda-bindings path)",
         lambda: kernel._launch_with_bindings(0, 1, 256, (x, y, 1024))),
        ("driver.cuLaunchKernel, all prebuilt, stream int",
         lambda: driver.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, stream, address, 0)),
        ("driver.cuLaunchKernel, all prebuilt, CUstream object",
         lambda: driver.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, stream_obj, address, 0)),
        ("ctypes cuLaunchKernel, ctypes objects, no argtypes",
         lambda: raw(fn_ptr, one, one, one, b256, one, one, zero, s_ptr, a_ptr, None)),
        ("x.data_ptr() x2 + 3 holder writes", lambda: [setattr(holders[0], "value", x.data_ptr()),
                                                         setattr(holders[1], "value", y.data_ptr()),
                                                         setattr(holders[2], "value", 1024)]),
        ("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("x.new_empty(x.shape)", lambda: x.new_empty(x.shape)),
        ("torch.empty(1024, dtype=, device=)", lambda: torch.empty(1024, dtype=torch.float32, device=x.device)),
    ]
    if fast is not None:
        rows[3:3] = [
            ("C extension launch, tensors passed (what CudaKernel.launch calls)",
             lambda: fast.launch(entry, fn_int, 1, 256, stream, x, y, 1024)),
            ("C extension launch, ints passed", lambda: fast.launch(entry, fn_int, 1, 256, stream, xp, yp, 1024)),
        ]
    else:
        print(f"(C launch extension unavailable: {fast_launch.unavailable()})")
    print(f"# Launch overhead, {torch.cuda.get_device_name()} ({time.strftime('%Y-%m-%d')}, torch {torch.__version__})\n")
    print("| call | host us/call |\n|---|---:|")
    for label, fn_ in rows:
        print(f"| {label} | {per_call_us(fn_):.2f} |")
    torch.cuda.synchronize()
    assert torch.allclose(y, F.silu(x), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    main()
