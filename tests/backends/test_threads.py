"""Every launch path works from any thread, on a real GPU: a thread whose first CUDA work is a
tunekit launch has no current context, and the driver refuses that launch until the device's
primary context is bound (issue 24: CUresult 201 in every such thread). Also: kernels loaded on a
worker thread while the main thread launches, and a stress run of 64 threads over four ops with
CUDA C, Triton and torch choices forced on new and cached signatures."""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import cuda as cuda_backend
from tunekit.backends import fast_call, fast_launch, thread_context
from tunekit.backends.cuda import CudaKernel
from tunekit.backends.driver import bindings
from tunekit.tunable import results_store, tuning, validators
from tunekit.tunable.entries import CandidateRecord, Entry
from tunekit.tunable.registry import get_op

pytestmark = pytest.mark.gpu

BLOCK = 256


def current_context() -> int:
    driver, _ = bindings()
    err, context = driver.cuCtxGetCurrent()
    assert int(err) == 0
    return int(context)


def in_fresh_thread(fn, timeout: float = 300.0):
    """``fn()`` on a new thread; its result. Checks the premise: no context was current there."""
    box = {}

    def body():
        try:
            box["before"] = current_context()
            box["value"] = fn()
            torch.cuda.current_stream().synchronize()
            box["after"] = current_context()
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in box:
        raise box["error"]
    assert box["before"] == 0, "premise: a fresh thread has no current CUDA context"
    assert box["after"] != 0
    return box["value"]


@pytest.fixture
def counted_hooks(monkeypatch):
    """The context hooks of both extensions and of the cuda-bindings path, counted."""
    calls = []
    original = thread_context.launch_hook

    def counting():
        calls.append(threading.get_ident())
        return original()

    modules = [m for m in (fast_launch.load(), fast_call.load()) if m is not None]
    for m in modules:
        m.set_context_hook(counting)
    monkeypatch.setattr(thread_context, "launch_hook", counting)
    yield calls
    monkeypatch.undo()
    for m in modules:
        m.set_context_hook(original)


@pytest.fixture
def silu_f32(cuda):
    """The silu_f32 kernel loaded on the current device, an input, its output buffer (allocated
    here: the fresh thread's first CUDA work is the launch), the expected values, the grid."""
    index = torch.cuda.current_device()
    kernel = cuda_backend.kernel("silu.cu", "silu_f32")
    kernel.address(index)
    x = torch.randn(100_003, device=cuda) * 4
    out = torch.full_like(x, float("nan"))
    expected = F.silu(x)
    cuda_backend._dependent_launch(index)  # its device query made here, not on the fresh thread
    torch.cuda.synchronize()
    return kernel, index, x, out, expected, (x.numel() + BLOCK - 1) // BLOCK


@pytest.mark.parametrize("path", ["launch", "launch_dependent", "direct", "bindings"])
def test_a_fresh_thread_launches_cuda_c_first(silu_f32, counted_hooks, path):
    kernel, index, x, out, expected, grid = silu_f32
    n = x.numel()
    if path in ("launch", "launch_dependent", "direct") and fast_launch.load() is None:
        pytest.fail(f"the C launch extension must build on the GPU machine: {fast_launch.unavailable()}")
    launches = {
        "launch": lambda: kernel.launch(index, grid, BLOCK, x, out, n),
        "launch_dependent": lambda: kernel.launch_dependent(index, grid, BLOCK, x, out, n),
        "direct": lambda: cuda_backend.direct_launch()(kernel.address(index), grid, BLOCK,
                                                       cuda_backend.current_stream(index), x, out, n),
        "bindings": lambda: kernel._launch_with_bindings(index, grid, BLOCK, (x, out, n)),
    }
    in_fresh_thread(launches[path])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # refused once, context bound, retried (a fresh thread's current device is 0: for another device
    # the launch's own device switch binds the context first)
    assert len(counted_hooks) == (1 if index == 0 else 0)


def test_a_fresh_thread_runs_the_cpp_launcher_first(silu_f32, counted_hooks):
    kernel, index, x, out, expected, grid = silu_f32
    native = fast_call.load()
    if native is None:
        pytest.fail(f"the C++ fast-call extension must build on the GPU machine: {fast_call.unavailable()}")
    launcher = native.Launcher(fast_launch.driver_entry_point(), kernel.address(index), grid, BLOCK, x.numel(), index,
                               cuda_backend.current_stream)
    torch.empty_like(x)  # a block of this size cached on the stream: the launcher's allocation reuses it
    result = in_fresh_thread(lambda: launcher(x))
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
    assert len(counted_hooks) <= 1


def _is_kind(op, c, kind: str) -> bool:
    """Whether candidate ``c`` of ``op`` is torch's kernel (the default), CUDA C or Triton."""
    if kind == "torch":
        return c is op.default
    if kind == "cuda":
        return isinstance(getattr(c, "kernel", None), CudaKernel)
    return "triton" in c.name


def _candidate(op, kind: str, params):
    """The first candidate of ``kind`` that supports ``params``."""
    for c in op.candidates:
        if _is_kind(op, c, kind) and c.supports(params) is None:
            return c
    pytest.fail(f"{op.name}: no {kind} candidate supports {params.signature()}")


@pytest.mark.parametrize("kind", ["triton", "torch"])
def test_a_fresh_thread_runs_triton_and_torch_candidates_first(cuda, kind):
    op = get_op("silu")
    x = torch.randn(65_536, device=cuda, dtype=torch.float16)
    out = torch.empty_like(x)
    params = op.make_params(x, out=out)
    candidate = _candidate(op, kind, params)
    candidate.run(params)  # compiled (Triton's JIT) on this thread
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    in_fresh_thread(lambda: candidate.run(params))
    assert op.numerics(params)((out,), (F.silu(x),)) is None


def test_a_worker_thread_loads_kernels_while_the_main_thread_launches(silu_f32, tmp_path, monkeypatch):
    """What a background compile does: kernels compiled and loaded on a worker thread (its first
    CUDA work), while this thread keeps launching; then launched here."""
    kernel, index, x, out, expected, grid = silu_f32
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))  # these one-off cubins stay out of the user's cache
    options = (f"-DTUNEKIT_WORKER_TEST={time.time_ns()}",)  # new modules: compiled and loaded there
    names = ["gelu_f32", "gelu_f32x4", "gelu_f32x4_x2", "gelu_tanh_f32x4"]
    loaded = [CudaKernel("gelu.cu", name, options) for name in names]
    done = threading.Event()

    def load_all():
        try:
            return [(k.address(index), k.resident_blocks(index, BLOCK)) for k in loaded]
        finally:
            done.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        worker = pool.submit(in_fresh_thread, load_all)
        launches = 0
        while not done.is_set() or launches == 0:
            kernel.launch(index, grid, BLOCK, x, out, x.numel())
            launches += 1
        results = worker.result(timeout=300)
    assert all(address and blocks >= 1 for address, blocks in results)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for k, name in zip(loaded, names):
        y = torch.full_like(x, float("nan"))
        k.launch(index, grid, BLOCK, x, y, x.numel())
        expected_gelu = F.gelu(x, approximate="tanh" if "tanh" in name else "none")
        torch.testing.assert_close(y, expected_gelu, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("path", ["launch", "launcher"])
def test_a_fresh_thread_launches_on_a_second_gpu(cuda, path):
    """Device 0 is a fresh thread's current device: a launch on cuda:1 switches to it first."""
    kernel = cuda_backend.kernel("silu.cu", "silu_f32")
    x = torch.randn(4099, device="cuda:1")
    out = torch.empty_like(x)
    grid = (x.numel() + BLOCK - 1) // BLOCK
    address = kernel.address(1)
    torch.cuda.synchronize(1)
    if path == "launch":
        in_fresh_thread(lambda: kernel.launch(1, grid, BLOCK, x, out, x.numel()))
    else:
        native = fast_call.load()
        assert native is not None, fast_call.unavailable()
        launcher = native.Launcher(fast_launch.driver_entry_point(), address, grid, BLOCK, x.numel(), 1,
                                   cuda_backend.current_stream)
        out = in_fresh_thread(lambda: launcher(x))
    torch.testing.assert_close(out, F.silu(x), rtol=1e-5, atol=1e-5)


# -- stress: 64 threads, four ops, forced choices of every backend, new and cached signatures ------

THREADS = 64
COLS = 2048  # logsumexp's rows; new signatures differ in their number of rows (Triton compiles nothing new)

#: (case, public call, the op's make_params arguments after x)
OPS = [
    ("silu", lambda x: tunekit.silu(x), ()),
    ("gelu", lambda x: tunekit.gelu(x), ("none",)),
    ("gelu_tanh", lambda x: tunekit.gelu(x, approximate="tanh"), ("tanh",)),
    ("logsumexp", lambda x: tunekit.logsumexp(x, -1), (-1,)),
]
KINDS = ["cuda", "triton", "torch"]


def _shape(case: str, k: int, t: int) -> tuple[int, ...]:
    """The input shape of kind ``k``'s signature for thread ``t`` (t = -1: the cached one). Sizes
    keep multiples of 16 (one Triton specialization for all) and never meet across kinds."""
    if case == "logsumexp":
        return (16 * (1 + 80 * k + (t + 1)), COLS)
    return (65_536 * (k + 1) + 256 * (t + 1),)


class Signature:
    def __init__(self, op, shape, extra, device):
        self.x = torch.randn(shape, device=device, dtype=torch.float16) * 3
        self.params = op.make_params(self.x, *extra)
        self.expected = op.default.run(self.params)
        self.shape = shape


def _pick(op, kind: str, signatures, besides=()):
    """A candidate of ``kind`` supporting every signature, not one of ``besides`` if another does."""
    found = [c for c in op.candidates
             if _is_kind(op, c, kind) and all(c.supports(s.params) is None for s in signatures)]
    if not found:
        pytest.fail(f"{op.name}: no {kind} candidate supports {signatures[0].params.signature()} and the rest")
    fresh = [c for c in found if getattr(c, "kernel", None) not in [getattr(b, "kernel", None) for b in besides]]
    return (fresh or found)[0]


def _force(store, op, signatures, choice) -> None:
    device = signatures[0].x.device
    checks = validators.validators_for(device, op.candidates)
    for s in signatures:
        store.put(Entry(op=op.name, signature=s.params.signature(), device=validators.device_name(device),
                        choice=choice.name, complete=True, validators=checks,
                        candidates={choice.name: CandidateRecord("chosen", 0.01)}, tuned_at=time.time(),
                        tuning_ms=1.0))


def _cases(device):
    """Every (op, kind): a cached signature and its choice, a new signature per thread and its choice
    (for CUDA C another kernel than the cached one's: threads race to compile and load it)."""
    store = results_store()
    cases = []
    for case, call, extra in OPS:
        op = get_op("gelu" if case.startswith("gelu") else case)
        for k, kind in enumerate(KINDS):
            cached = Signature(op, _shape(case, k, -1), extra, device)
            new = [Signature(op, _shape(case, k, t), extra, device) for t in range(THREADS)]
            cached_choice = _pick(op, kind, [cached, *new])
            new_choice = _pick(op, kind, [cached, *new], besides=[cached_choice] if kind == "cuda" else [])
            _force(store, op, [cached], cached_choice)
            _force(store, op, new, new_choice)
            cases.append(dict(name=f"{case}/{kind}", op=op, call=call, cached=cached, new=new,
                              choices=(cached_choice.name, new_choice.name)))
    return cases


def _check(case, signature, out) -> str | None:
    if out.shape != signature.expected.shape or out.dtype != signature.expected.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype}"
    return case["op"].numerics(signature.params)((out,), (signature.expected,))


def test_sixty_four_threads_run_every_backend_on_new_and_cached_signatures(cuda):
    cases = _cases(cuda)
    with tuning(tuning=False) as settings:
        for case in cases:  # cached: decided, runners made, kernels loaded (Triton's compiled) here
            out = case["call"](case["cached"].x)
            assert _check(case, case["cached"], out) is None, case["name"]
    torch.cuda.synchronize()
    errors, finished = [], []
    barrier = threading.Barrier(THREADS)

    def worker(t):
        try:
            barrier.wait(timeout=120)
            with tuning(tuning=False):
                order = list(cases)
                random.Random(t).shuffle(order)
                for case in order:
                    for signature in (case["cached"], case["new"][t]):
                        try:
                            problem = _check(case, signature, case["call"](signature.x))
                        except Exception as exc:
                            problem = f"{type(exc).__name__}: {exc}"
                        if problem:
                            errors.append(f"thread {t} {case['name']} {signature.shape}: {problem}")
        except Exception as exc:
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")
        finished.append(t)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 600
    for thread in threads:
        thread.join(max(1.0, deadline - time.monotonic()))
    assert len(finished) == THREADS, f"{THREADS - len(finished)} threads did not finish"
    assert not errors, f"{len(errors)} errors, first: " + "\n".join(errors[:10])
    for case in cases:  # the forced choices are what ran
        for signature, choice in ((case["cached"], case["choices"][0]), (case["new"][0], case["choices"][1]),
                                  (case["new"][-1], case["choices"][1])):
            assert case["op"].resolve(signature.params, settings).candidate.name == choice, case["name"]
