"""Builds quack kernels in a process of their own: ``python quack_build.py ROOT`` reads build specs
(JSON, one list on stdin) and leaves, per spec, ``ROOT/<key>/`` holding ``kernel.so`` (quack's
TVM-FFI object for that plan, linked by the C compiler), ``recipe.json`` (the arguments the plan's
launch passes, as call tensors and literals) and ``libs.json`` (the runtime libraries it needs).
One JSON line per spec on stdout: ``{"key": ..., "error": null | "..."}``.

Why a process: importing quack (the CuTe DSL's MLIR, torch._dynamo) took 13-16 s and froze every
other thread of the importing process for all of it; a compile held the interpreter 2-2.7 s at once
(``benchmarks/results/quack_gil_probe-*``). Built here, the caller loads ``kernel.so`` through
``tvm_ffi`` in milliseconds and never imports quack (``backends/quack.py``).

Standalone on purpose: it imports torch and quack, never tunekit (whose import would cost the
build a second).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

# run as a script, this file's folder leads sys.path, and tunekit's backends/quack.py would be ``import quack``
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

#: the problems whose launches are recorded (M, N, K): quack's kernels take the sizes at run time, so their
#: recipes must agree (a size or a pointer recorded as a constant would not)
SIZES = ((1024, 1024, 1024), (2048, 1536, 512))


def _matrix(torch, rows, cols, major, dtype):
    t = torch.randn(rows, cols, device="cuda", dtype=dtype) if major == "row" else \
        torch.randn(cols, rows, device="cuda", dtype=dtype).t()
    return t


def _describe(value, named):
    """A recipe leaf: a call tensor by name (``mT``: its transpose), a literal, or a tuple of leaves."""
    import torch

    if isinstance(value, torch.Tensor):
        for name, t in named.items():
            if t is None or value.data_ptr() != t.data_ptr():
                continue
            if tuple(value.shape) == tuple(t.shape) and value.stride() == t.stride():
                return {"t": name}
            if t.dim() == 2 and tuple(value.shape) == tuple(t.mT.shape) and value.stride() == t.mT.stride():
                return {"t": name, "mT": True}
        raise ValueError(f"the launch passes a tensor the call does not give: {tuple(value.shape)}")
    if value is None or isinstance(value, (bool, int, float)):
        return {"v": value}
    if isinstance(value, tuple):
        return {"tuple": [_describe(v, named) for v in value]}
    casts = (float, int) if "float" in type(value).__name__.lower() else (int, float)
    for cast in casts:  # the DSL's numeric wrappers (Int32, Float32)
        try:
            return {"v": cast(value)}
        except (TypeError, ValueError):
            pass
    raise ValueError(f"the launch passes a {type(value).__name__} (neither a tensor nor a literal)")


def _plan_and_recipe(spec, torch):
    """quack's plan for ``spec`` (compiled into quack's cache, not launched) and the launch's arguments."""
    from quack.epilogue.library import linear_act_mod
    from quack.gemm_config import GemmConfig
    import quack.gemm_runtime.host as host

    dtype = getattr(torch, spec["dtype"])
    tile_m, tile_n, pingpong, cluster_m, cluster_n = spec["config"]
    config = GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m, cluster_n=cluster_n,
                        swap_ab=False, device_capacity=9, is_dynamic_persistent=False, use_tma_gather=False)
    epilogue = linear_act_mod(spec["quack_activation"], gated=False, has_c=False, has_rowvec=spec["bias"],
                              has_colvec=False, sr=False, has_alpha=False)
    plan, recipes = None, []
    for m, n, k in SIZES:  # one plan serves both: what differs between their recipes is not a constant
        a = _matrix(torch, m, k, spec["a_major"], dtype)
        b = _matrix(torch, k, n, spec["b_major"], dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if spec["bias"] else None
        operands = {} if bias is None else {"mRowVecBroadcast": bias}
        if plan is None:
            plan = epilogue.plan(a, b, None, out={"mAuxOut": out}, config=config, **operands)
        recorded, launch = [], host.launch_gemm
        host.launch_gemm = lambda _plan, *args: recorded.append(args)  # record, never launch
        try:
            plan.run(a, b, None, out={"mAuxOut": out}, **operands)
        finally:
            host.launch_gemm = launch
        named = {"a": a, "b": b, "bias": bias, "out": out}
        recipes.append([_describe(v, named) for v in recorded[0]])
    if any(r != recipes[0] for r in recipes):
        raise ValueError(f"the launch's arguments depend on the problem, not only on its class: {recipes}")
    return recipes[0]


def _link(obj: str, so: str, libs: list[str]) -> None:
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("gcc") or shutil.which("cc") or "cc"]
    cmd = [*cc, "-shared", "-o", so, obj]
    for lib in libs:
        cmd += [lib, f"-Wl,-rpath,{os.path.dirname(lib)}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"linking quack's kernel failed ({' '.join(cmd)}): {r.stderr[-800:]}")


def private(folder: str) -> None:
    """The folder's files readable and writable by this user only, whatever the umask (tunekit's cache
    refuses to load what others could write: ``backends/cache.py``)."""
    os.chmod(folder, 0o700)
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o600)


def build(spec, root: str, torch) -> None:
    """``root/<spec["key"]>/``, made in a private temporary folder and renamed into place."""
    import quack.cache
    from cutlass.runtime import find_runtime_libraries

    final = os.path.join(root, spec["key"])
    if os.path.exists(os.path.join(final, "kernel.so")):
        return
    work = tempfile.mkdtemp(prefix=f"{spec['key'][:16]}.", dir=root)
    try:
        quack.cache.CACHE_ENABLED = True  # its disk cache is how the object comes out
        quack.cache.CACHE_DIR = os.path.join(work, "qc")  # empty: this plan's object is the one there
        torch.cuda.set_device(spec["device"])
        recipe = _plan_and_recipe(spec, torch)
        objs = glob.glob(os.path.join(work, "qc", "*", "*.o"))
        if len(objs) != 1:
            raise RuntimeError(f"expected quack to leave one kernel object, found {len(objs)}")
        libs = find_runtime_libraries(enable_tvm_ffi=True)
        _link(objs[0], os.path.join(work, "kernel.so"), libs)
        shutil.rmtree(os.path.join(work, "qc"))
        for name, value in (("recipe.json", recipe), ("libs.json", libs)):
            with open(os.path.join(work, name), "w") as f:
                json.dump(value, f)
        private(work)
        try:
            os.rename(work, final)
        except OSError:  # another process built it meanwhile
            if not os.path.exists(os.path.join(final, "kernel.so")):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    root = sys.argv[1]
    specs = json.loads(sys.stdin.read())
    import torch

    failed = 0
    for spec in specs:
        try:
            build(spec, root, torch)
            error = None
        except Exception as exc:  # noqa: BLE001 - reported per spec, the others still built
            error, failed = f"{type(exc).__name__}: {exc}"[:2000], failed + 1
        print(json.dumps({"key": spec["key"], "error": error}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
