"""A Triton compile worker: a separate process that compiles Triton kernels into Triton's disk cache.

Run as a script (``python triton_compile_worker.py``) by :mod:`tunekit.backends.triton_compile`,
never imported by tunekit: it needs only the standard library and Triton, so it starts without
importing torch or tunekit (a kernel module is executed under its own name, its parent packages
stubbed). Why a process: Triton's compiler holds the GIL for much of a compile, so a compile on a
thread of the user's process slows every call the user's own thread makes meanwhile.

Protocol: one JSON object per line on stdin, one reply per line on the stdout it started with.
A request names the ``@triton.jit`` function (``module``, ``qualname``, ``file``), the compile
target and ``specialization`` (the JSON Triton's ``jit_cache_hook`` hands over, the same that
``JITFunction.preload`` reads). The reply: ``{"ok": true, "hash": <cache entry>, "seconds": s}``
or ``{"ok": false, "error": "..."}``, each with the request's ``id``. The worker ends when stdin closes,
or after :data:`IDLE_EXIT_S` without a request.
"""

import importlib.util
import json
import os
import select
import sys
import time
import traceback
import types


#: seconds without a request after which a worker ends (TUNEKIT_TRITON_WORKER_IDLE_S)
IDLE_EXIT_S = float(os.environ.get("TUNEKIT_TRITON_WORKER_IDLE_S") or 120.0)


def _own_folder_off_path() -> None:
    """A script's folder is put first on sys.path; this one holds tunekit's ``triton.py``, which
    must not shadow the real Triton."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def load_function(module: str, qualname: str, file: str):
    """The object ``qualname`` of ``module``, executing ``file`` under that name; the parent
    packages are stubs over their folders, so no package ``__init__`` (tunekit's imports torch) runs
    and relative imports of sibling kernel modules still resolve."""
    found = sys.modules.get(module)
    if found is None:
        parts = module.split(".")
        folder = os.path.dirname(os.path.abspath(file))
        for depth in range(len(parts) - 1, 0, -1):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                stub = types.ModuleType(name)
                stub.__path__ = [folder]
                sys.modules[name] = stub
            folder = os.path.dirname(folder)
        spec = importlib.util.spec_from_file_location(module, file)
        found = importlib.util.module_from_spec(spec)
        sys.modules[module] = found
        try:
            spec.loader.exec_module(found)
        except BaseException:
            sys.modules.pop(module, None)
            raise
    obj = found
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def _constant(value):
    """A constexpr value as ``serialize_specialization_data`` wrote it (``JITFunction.preload``'s
    decoding)."""
    import triton.language as tl
    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_as_tuple(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        module, qualname = value["jit_function"].split(":")
        return load_function(module, qualname, sys.modules[module].__file__)
    return _as_tuple(value)


def options_of(data: dict) -> dict:
    """The compile options of a specialization, as ``JITFunction.preload`` reads them (the caller's
    cache probe reads them the same way)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}


def compile_request(request: dict) -> dict:
    """Compile one request into Triton's cache; the reply."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _other_triton:
        raise RuntimeError(_other_triton)
    fn = load_function(request["module"], request["qualname"], request["file"])
    data = json.loads(request["specialization"])
    constexprs = {tuple(k): _constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])}
    attrs = dict(zip(map(tuple, data["attrs_keys"]), data["attrs_vals"]))
    signature = {k: _as_tuple(v) for k, v in data["signature"].items()}
    options = options_of(data)
    target = GPUTarget(**request["target"])
    started = time.perf_counter()
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
    return {"ok": True, "hash": compiled.hash, "seconds": time.perf_counter() - started, "id": request.get("id")}


def _lines(requests, idle_s: float):
    """The request lines, until the input ends or none came for ``idle_s`` seconds (an idle worker
    ends: the caller starts another when it next compiles)."""
    while True:
        ready, _, _ = select.select([requests], [], [], idle_s)
        line = requests.readline() if ready else ""
        if not line:
            return
        yield line


def serve(requests, replies, idle_s: float = IDLE_EXIT_S) -> None:
    for line in _lines(requests, idle_s):
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            reply = compile_request(request)
        except Exception as error:  # the caller compiles in its own process and meets it there
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc(limit=4),
                     "id": request.get("id") if isinstance(request, dict) else None}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_other_triton: str | None = None  # why this worker refuses every request, if it does


def _start() -> None:
    """What every compile needs, done before the first request (while the caller is still busy):
    Triton's import, and its own key, a hash of its 400 MB library (a quarter second), taken from
    the caller (``TUNEKIT_TRITON_KEY``) when this Triton is the caller's (``TUNEKIT_TRITON_FILE``):
    another installation's builds under the caller's key would be loaded as the caller's."""
    global _other_triton
    try:
        import triton
        from triton.compiler import ASTSource  # noqa: F401
        from triton.runtime import cache
        theirs, mine = os.environ.get("TUNEKIT_TRITON_FILE"), os.path.realpath(triton.__file__)
        if theirs and theirs != mine:
            _other_triton = f"the worker's Triton is {mine}, the caller's {theirs}"
            return
        key = os.environ.get("TUNEKIT_TRITON_KEY")
        if key:  # the caller's, of the same installation (Triton's own warm-up pool does the same)
            cache.triton_key = lambda: key
        cache.triton_key()
    except Exception:  # a request meets it again, and reports it
        pass


def main() -> None:
    _own_folder_off_path()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything Triton prints (its import included) goes where stderr goes, never into the replies
    _start()
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
