"""Answers: can a process run a quack kernel without importing quack or the CuTe DSL (their import
froze a caller's thread for 13-16 s, ``quack_gil_probe-*``)? One process with quack makes the plan
(its kernel lands in quack's disk cache as a TVM-FFI ``.o``) and records the arguments its launch
passes; gcc links the ``.o`` into a shared library; a second process that has only ``tvm_ffi`` on its
path loads that library and calls it with the recorded arguments: its import and load time, host
time per call, results against torch, a side stream and a CUDA graph.

GPU only. ``python benchmarks/experiments/quack_tvm_ffi_probe.py --export DIR`` (quack on the path),
then ``--load DIR`` (tvm_ffi only on the path).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

M, N, K = 4096, 14336, 4096
CONFIG = (128, 208, True, 2, 1)


def _tensors(torch):
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    return {"A": x, "B": w.t(), "bias": b, "D": out}


def _describe(value, named):
    """A JSON recipe leaf: a call tensor (by name, maybe transposed), a literal, or a nested tuple."""
    import torch

    if isinstance(value, torch.Tensor):
        for name, t in named.items():
            if value.data_ptr() == t.data_ptr() and tuple(value.shape) == tuple(t.shape) and value.stride() == t.stride():
                return {"t": name}
            if t.dim() == 2 and value.data_ptr() == t.data_ptr() and tuple(value.shape) == tuple(t.mT.shape) \
                    and value.stride() == t.mT.stride():
                return {"t": name, "mT": True}
        return {"other_tensor": [list(value.shape), list(value.stride()), str(value.dtype)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if isinstance(value, tuple):
        return {"tuple": [_describe(v, named) for v in value], "type": type(value).__name__}
    for cast in (int, float):
        try:
            return {"v": cast(value), "was": type(value).__name__}
        except Exception:  # noqa: BLE001
            pass
    return {"other": f"{type(value).__module__}.{type(value).__name__}: {value!r}"[:200]}


def export(folder: str) -> None:
    import torch

    os.environ["QUACK_CACHE_DIR"] = os.path.join(folder, "qc")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
    from tunekit.backends import quack as tq
    import quack.gemm_runtime.host as host

    ts = _tensors(torch)
    recorded = []
    original = host.launch_gemm

    def spy(plan, *args):
        recorded.append(args)
        return original(plan, *args)

    host.launch_gemm = spy
    t0 = time.perf_counter()
    plan = tq.plan_for(ts["A"], ts["B"], ts["bias"], ts["D"], "gelu_tanh", CONFIG)
    print(f"plan {time.perf_counter() - t0:.2f} s")
    tq.matmul(plan, ts["A"], ts["B"], ts["bias"], ts["D"])
    torch.cuda.synchronize()
    host.launch_gemm = original
    recipe = [_describe(v, ts) for v in recorded[0]]
    print("recipe:", json.dumps(recipe)[:3000])
    json.dump(recipe, open(os.path.join(folder, "recipe.json"), "w"))
    # host time of quack's own run, for comparison
    for _ in range(50):
        tq.matmul(plan, ts["A"], ts["B"], ts["bias"], ts["D"])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        tq.matmul(plan, ts["A"], ts["B"], ts["bias"], ts["D"])
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"quack EpiPlan.run host per call (queued, GPU-bound so an upper bound): {host_us:.1f} us")
    objs = glob.glob(os.path.join(folder, "qc", "*", "*.o"))
    print("objects:", objs)
    from cutlass.runtime import find_runtime_libraries

    libs = find_runtime_libraries(enable_tvm_ffi=True)
    print("runtime libraries:", libs)
    json.dump(libs, open(os.path.join(folder, "libs.json"), "w"))
    obj = max(objs, key=os.path.getmtime)
    undefined = subprocess.run(["nm", "-u", obj], capture_output=True, text=True).stdout.split()
    print("undefined symbols:", [s for s in undefined if s != "U"][:80])
    so = os.path.join(folder, "kernel.so")
    cmd = ["gcc", "-shared", "-o", so, obj]
    for lib in libs:
        cmd += [lib, f"-Wl,-rpath,{os.path.dirname(lib)}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print("link:", " ".join(cmd), "rc", r.returncode, r.stderr[-1500:])


def _build(leaf, ts):
    if "t" in leaf:
        t = ts[leaf["t"]]
        return t.mT if leaf.get("mT") else t
    if "v" in leaf:
        return leaf["v"]
    if "tuple" in leaf:
        return tuple(_build(v, ts) for v in leaf["tuple"])
    raise ValueError(f"cannot rebuild {leaf}")


def load(folder: str) -> None:
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter() - t0
    torch.cuda.init()
    ts = _tensors(torch)
    torch.cuda.synchronize()
    import ctypes

    t0 = time.perf_counter()
    import tvm_ffi

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    for lib in json.load(open(os.path.join(folder, "libs.json"))):
        if os.path.basename(lib) != "libtvm_ffi.so":  # tvm_ffi's import loaded its own: a second copy aborts
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    mod = tvm_ffi.load_module(os.path.join(folder, "kernel.so"))
    fn = mod["func"]
    t_load = time.perf_counter() - t0
    print(f"import torch {t_torch:.2f} s, import tvm_ffi {t_import * 1e3:.1f} ms, load libs + module {t_load * 1e3:.1f} ms")
    recipe = json.load(open(os.path.join(folder, "recipe.json")))
    args = [_build(leaf, ts) for leaf in recipe]
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    print(f"first call {(time.perf_counter() - t0) * 1e3:.1f} ms")
    ref = torch.nn.functional.gelu(ts["A"].float() @ ts["B"].float() + ts["bias"].float(), approximate="tanh")
    err = (ts["D"].float() - ref).abs().max().item()
    print(f"max abs err vs float32 torch: {err:.4f} (ref max {ref.abs().max().item():.2f}); NaN left: {ts['D'].isnan().any().item()}")
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn(*[_build(leaf, ts) for leaf in recipe])
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"host per call incl. rebuilding args (queued): {host_us:.1f} us")
    side = torch.cuda.Stream()
    ts["D"].fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        fn(*args)
    side.synchronize()
    err2 = (ts["D"].float() - ref).abs().max().item()
    print(f"side stream (behind a 50M-cycle sleep): max abs err {err2:.4f}, NaN left {ts['D'].isnan().any().item()}")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(*args)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn(*args)
    ts["D"].fill_(float("nan"))
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 10 * 1e3)
    err3 = (ts["D"].float() - ref).abs().max().item()
    print(f"CUDA graph of 10 calls: {sorted(times)[2]:.1f} us per call (L2-warm), max abs err {err3:.4f}")
    lin = lambda: torch.nn.functional.linear(ts["A"], ts["B"].t())  # noqa: E731
    for _ in range(5):
        lin()
    torch.cuda.synchronize()
    e0.record()
    for _ in range(20):
        lin()
    e1.record()
    e1.synchronize()
    print(f"F.linear (no bias, no gelu) for scale: {e0.elapsed_time(e1) / 20 * 1e3:.1f} us")
    print("quack or cutlass imported:", [m for m in sys.modules if m.split(".")[0] in ("quack", "cutlass")][:5])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--export")
    ap.add_argument("--load")
    a = ap.parse_args()
    if a.export:
        os.makedirs(a.export, exist_ok=True)
        export(a.export)
    if a.load:
        load(a.load)


if __name__ == "__main__":
    main()
