"""Scenarios of tests/backends/test_triton_compile.py, each run in a fresh process: Triton must be
imported without ``TRITON_INTERPRET`` (the tests' own process interprets every kernel).

``python triton_compile_scenarios.py <scenario>`` prints one JSON line: the module's counters, the
rms_norm forward builds in Triton's cache folder ($TRITON_CACHE_DIR), what the scenario adds."""

from __future__ import annotations

import glob
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import CompiledKernel
from triton.runtime import driver

from tunekit.backends import triton as triton_backend
from tunekit.backends import triton_compile, triton_workers


class StandInDriver:
    """The questions Triton's warm-up asks the active driver, answered for an sm_90 GPU."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cuda", 0)


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def rms_norm_warmup(dtype=torch.float16, n=1000):
    """What the rms_norm candidate's prepare runs: a warm-up through tunekit's launch; the
    ``@triton.jit`` function."""
    ref = triton_backend.kernel("rms_norm", "rms_norm_forward_kernel")
    fn = ref.resolve()
    x = torch.empty(4, n, dtype=dtype)
    with triton_backend.warming():
        triton_backend.launch(ref, (4,), x, torch.empty(n, dtype=dtype), torch.empty_like(x), 4, n, 1e-6,
                              BLOCK=1024, ROWS=1, num_warps=4)
    return fn


def scenario(name: str) -> dict:
    extra = {}
    if name == "one":
        fn = rms_norm_warmup()
        extra["left_in_process"] = id(fn) in triton_compile._in_process
    elif name == "three":  # float16 twice (the second in the function's own cache), then bfloat16
        for dtype in (torch.float16, torch.float16, torch.bfloat16):
            rms_norm_warmup(dtype)
    elif name == "no_worker":  # a worker that exits at once
        triton_workers._WORKER_FILE = os.devnull
        rms_norm_warmup()
    elif name == "other_build":  # a worker whose build the warm-up does not find
        triton_workers.ask = lambda request: {"ok": True, "hash": "not-this-build"}
        fn = rms_norm_warmup()
        extra["left_in_process"] = id(fn) in triton_compile._in_process
        rms_norm_warmup(torch.bfloat16)
    elif name == "users_hook":  # a user's jit_cache_hook, installed first, still sees the compiles here
        from triton import knobs
        seen = []
        knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw["repr"])
        triton_compile._install_hook()
        triton_workers.ask = lambda request: None
        rms_norm_warmup()
        extra["seen"] = seen
    elif name == "gemm":  # the GEMM pointer kernel at odd sizes (None pointers, relative imports)
        from tunekit.ops.gemm import GemmParams
        from tunekit.ops.gemm.triton_candidates import TritonGemm, _config
        a, b = torch.empty(4097, 4096, dtype=torch.bfloat16), torch.empty(4096, 4095, dtype=torch.bfloat16)
        with triton_backend.warming():
            TritonGemm("matmul", _config(128, 128, 32, 4, 4)).run(GemmParams(a, b))
        extra["rebuilt"] = triton_compile.rebuilt
    elif name == "json_unsafe":  # a user's kernel with a constexpr JSON cannot hold, after the hook is in
        triton_compile._install_hook()
        extra["compiled"] = copy_kernel.warmup(torch.float32, torch.float32, 16, SCALE=1j, BLOCK=16,
                                               grid=(1,)) is not None
        with triton_backend.warming():  # and through tunekit's launch: compiled here, no worker asked
            triton_backend.launch(copy_kernel, (1,), torch.empty(16), torch.empty(16), 16, SCALE=2j, BLOCK=16)
    elif name == "warm":  # run after "one" on the same cache: the build is there, no worker asked
        fn = rms_norm_warmup()
        extra["workers"] = len(triton_workers._all)
    else:
        rms_norm_warmup()
    return extra


def main() -> None:
    driver.set_active(StandInDriver())
    CompiledKernel._init_handles = lambda self: None  # loading onto a device: no device here
    extra = scenario(sys.argv[1])
    builds = glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "*", "*_kernel.cubin"))
    print(json.dumps({"stats": triton_compile.stats, "builds": len(builds), **extra}))


if __name__ == "__main__":
    main()
