"""A user's CUDA graph capture survives tunekit's background work, on a real GPU.

tunekit's worker threads compile and load kernels whenever a tuning session asks, whether or not the
user's thread is capturing a graph at that moment. In the default (global) capture mode the driver
refuses a module load or a ``cudaMalloc`` from any thread while a capture runs, and the capture is
invalidated (``benchmarks/experiments/capture_module_load.py`` measured it). tunekit makes those
calls in the thread's RELAXED mode (``backends/thread_context.capture_relaxed``). Each test: the
capture ends without error, its replay computes what the same ops compute eagerly, and the kernel
loaded meanwhile runs correctly afterwards. On the H100 (driver of 2026-11) module loads were never
refused, in any thread; an allocation from a worker invalidated the capture without the guard.
"""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F

from tunekit.backends import triton as triton_backend
from tunekit.backends.cuda import CudaKernel
from tunekit.tunable import driver_graph
from tunekit.tunable.preparations import preparer

pytestmark = pytest.mark.gpu

BLOCK = 256


def fresh_silu_kernel() -> CudaKernel:
    """silu's float32 kernel under an option no other load used: its module is not loaded yet."""
    return CudaKernel("silu.cu", "silu_f32", (f"-DTUNEKIT_CAPTURE_PROBE={uuid.uuid4().int % 10**9}",))


def captured(work):
    """Capture ``x * 2 + 1`` around ``work()`` on the capturing thread (global mode, torch's default);
    returns (input, graph output, work's value) after one replay."""
    x = torch.randn(1 << 16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (x * 2 + 1).sum()  # warm-up outside the capture: torch's own kernels loaded
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
        value = work()
        y = y + 1
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    return x, y, value


def check_kernel(kernel: CudaKernel) -> None:
    x = torch.randn(10_001, device="cuda")
    out = torch.full_like(x, float("nan"))
    kernel.launch(0, (x.numel() + BLOCK - 1) // BLOCK, BLOCK, x, out, x.numel())
    torch.cuda.synchronize()
    torch.testing.assert_close(out, F.silu(x.double()).float(), rtol=1e-5, atol=1e-6)


def test_a_worker_loads_a_module_while_the_user_captures():
    kernel = fresh_silu_kernel()
    x, y, address = captured(lambda: preparer().submit(kernel.address, 0).result(timeout=300))
    torch.testing.assert_close(y, x * 2 + 1)
    assert address == kernel.address(0) != 0
    check_kernel(kernel)


def test_the_capturing_thread_loads_a_module_and_launches_it_in_the_graph():
    kernel = fresh_silu_kernel()
    box = {}

    def work():
        box["x"] = torch.randn(4097, device="cuda")
        box["out"] = torch.empty_like(box["x"])
        kernel.launch(0, (4097 + BLOCK - 1) // BLOCK, BLOCK, box["x"], box["out"], 4097)

    x, y, _ = captured(work)
    torch.testing.assert_close(y, x * 2 + 1)
    torch.testing.assert_close(box["out"], F.silu(box["x"].double()).float(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(triton_backend.kernel("activations", "silu_forward_kernel") is None, reason="needs Triton")
def test_a_worker_compiles_and_loads_a_triton_kernel_while_the_user_captures():
    fn = triton_backend.kernel("activations", "silu_forward_kernel")
    block = 2 ** (5 + uuid.uuid4().int % 5)  # 32-512: no candidate's block (1024-4096), not compiled yet
    n = 12_345 + uuid.uuid4().int % 1000
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))

    def prepare():  # what a Triton candidate's prepare does: compile and load, no launch
        with triton_backend.warming(x.device):
            triton_backend.launch(fn, ((n + block - 1) // block,), x, out, n, BLOCK=block)

    graph_in, graph_out, _ = captured(lambda: preparer().submit(prepare).result(timeout=600))
    torch.testing.assert_close(graph_out, graph_in * 2 + 1)
    assert out.isnan().all()  # the warm-up launched nothing
    triton_backend.launch(fn, ((n + block - 1) // block,), x, out, n, BLOCK=block)
    torch.testing.assert_close(out, F.silu(x.double()).float(), rtol=1e-5, atol=1e-6)


def test_a_worker_allocates_in_a_preparation_while_the_user_captures():
    """A preparation may allocate (a GEMM candidate's warm-up allocates its output): a size no cached
    block fits makes the caching allocator call cudaMalloc on the worker thread."""
    size = int(3.3e8) + uuid.uuid4().int % 4096

    def prepare():
        with triton_backend.warming(torch.device("cuda", 0)):
            return torch.empty(size, dtype=torch.uint8, device="cuda").numel()

    torch.cuda.empty_cache()  # no cached block of that size from earlier tests
    x, y, allocated = captured(lambda: preparer().submit(prepare).result(timeout=60))
    torch.testing.assert_close(y, x * 2 + 1)
    assert allocated == size


@pytest.mark.parametrize("family", ["gemm", "elementwise"])
def test_the_checks_warm_up_and_the_screen_run_on_a_worker_while_the_user_captures(monkeypatch, family):
    """An online session runs the op's support screen and warm_numerics through its off_thread
    (thread_context.off_thread: imports, cuBLASLt plans, kernel loads, allocations, launches, syncs) on a
    preparation worker, a user's capture running or not. Run plainly on a worker, the warm-up's launches and syncs
    broke the capture (H100, f3a9e6c)."""
    from tunekit.ops.gemm import numerics as gemm_numerics
    from tunekit.ops.gemm import GemmParams, mm_op
    from tunekit.ops.silu import SiluParams, silu_op
    from tunekit.tunable import numerics
    from tunekit.tunable.screen import supports

    x = torch.randn(257, 129, device="cuda", dtype=torch.bfloat16)
    if family == "gemm":
        monkeypatch.setattr(gemm_numerics, "_warmed", set())  # a fresh process: the check's kernels not run yet
        op, params, warmed = mm_op, GemmParams(x, x.t()), gemm_numerics._warmed
    else:
        monkeypatch.setattr(numerics, "_warmed", set())
        op, params, warmed = silu_op, SiluParams(x), numerics._warmed
    warm = op.off_thread(op.warm_numerics)
    screen = op.off_thread(lambda p: [supports(c, p) for c in op.candidates])
    assert warm.worth(params) and screen.worth(params)

    def both():
        reasons = preparer().submit(screen, params).result(timeout=120)
        preparer().submit(warm, params).result(timeout=120)
        return reasons

    graph_in, graph_out, reasons = captured(both)
    torch.testing.assert_close(graph_out, graph_in * 2 + 1)
    assert len(warmed) == 1 and len(reasons) == len(op.candidates) and reasons.count(None) >= 2


def test_a_workers_job_never_runs_on_the_users_capture_stream():
    """``torch.cuda.Stream()`` hands out torch's pooled streams in turn, and ``torch.cuda.graph`` captures on one of
    them: a job that took the next pooled stream got the capture stream itself, and its launch broke the capture
    (H100, 31 requests after the graph's). The worker's stream is tunekit's own."""
    from tunekit.backends.thread_context import off_thread
    from tunekit.ops.silu import SiluParams

    torch.cuda.graph(torch.cuda.CUDAGraph())  # makes the class's default capture stream (from torch's pool)
    capture_stream = torch.cuda.graph.default_capture_stream
    for _ in range(64):  # find the capture stream in the pool's turn ...
        if torch.cuda.Stream() == capture_stream:
            break
    for _ in range(30):  # ... so that the request after captured()'s own one would be the capture stream again
        torch.cuda.Stream()
    x = torch.randn(4097, device="cuda")
    job = off_thread(lambda p: float((p.x * 3).sum()))
    graph_in, graph_out, value = captured(lambda: preparer().submit(job, SiluParams(x)).result(timeout=60))
    torch.testing.assert_close(graph_out, graph_in * 2 + 1)
    assert value == pytest.approx(float(x.double().sum() * 3), rel=1e-4)


def test_tuning_captures_on_the_threads_own_stream_never_a_pooled_one():
    """The graph timer's warm-up and capture run on this thread's own stream (``tunable/isolation.py``), not one
    of torch's pooled streams (which hands the user's capture stream out again every 32 requests) nor
    torch.cuda.graph's process-wide default capture stream."""
    from tunekit.tunable import isolation
    from tunekit.tunable.timing import CudaGraphTimer

    device = torch.device("cuda", torch.cuda.current_device())
    own = isolation.stream_for_thread(device)
    pooled = {torch.cuda.Stream(device, priority=p).cuda_stream for p in (0, -1) for _ in range(80)}
    assert own.cuda_stream not in pooled and own.cuda_stream != torch.cuda.current_stream(device).cuda_stream
    x = torch.randn(4096, device=device)
    seen = []

    def fn():
        seen.append(torch.cuda.current_stream(device).cuda_stream)
        x.mul_(1.0)

    measure = CudaGraphTimer(device).prepare(fn, 3)
    assert seen == [own.cuda_stream] * 4 and measure() > 0  # the warm-up, then the three captured runs


@pytest.mark.skipif(not driver_graph.available(),
                    reason="torch before 2.8: tuning's graphs are torch's, which share the generator's capture state")
def test_a_whole_tuning_on_another_thread_leaves_the_users_capture_whole():
    """The user's thread holds a capture open (thread_local mode, a random draw in it) while this thread tunes a
    new signature with graph timing. Tuning's synchronizations wait on streams, never on the device (a device-wide
    synchronize meanwhile failed and invalidated the user's capture), and its graphs are the driver's, not
    ``torch.cuda.CUDAGraph`` (whose capture_end took the shared generator out of capture mode, so the user's draw
    after it raised): H100, ``benchmarks/experiments/concurrent_capture_probe.py``. Every candidate is timed in a
    graph of tuning's own, none eagerly for want of one. No eager draw here while the user captures: torch
    forbids one in any thread then. Not in global mode: that mode refuses any other thread's ``cudaMalloc``, the
    caller's own allocations included, whatever tunekit does."""
    import threading
    import warnings

    import tunekit
    from tunekit.tunable import results_store, tuning

    x = torch.randn(1 << 16, device="cuda")
    z = torch.randn(40_000 + uuid.uuid4().int % 997, device="cuda")  # a signature no test has tuned
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    began, tuned, failures, out = threading.Event(), threading.Event(), [], []
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (x * 2 + 1).sum()  # warm-up outside the capture
    torch.cuda.synchronize()

    def user():
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                y = x * 2
                began.set()
                tuned.wait(120)
                out.append(y + 1 + 0.0 * torch.randn_like(y))
                graph.capture_end()
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            began.set()

    thread = threading.Thread(target=user)
    thread.start()
    began.wait(60)
    try:
        with tuning(cuda_graph=True, max_tuning_ms=300), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = tunekit.silu(z)
            assert any(f"n={z.numel()}" in e.signature for e in results_store().entries("silu"))
    finally:
        tuned.set()
        thread.join(120)
    assert not failures, failures
    assert not [w for w in caught if "could not be timed in a CUDA graph" in str(w.message)]
    x.copy_(torch.randn_like(x))
    stream.wait_stream(torch.cuda.current_stream())  # the replay reads x after its copy (it raced under load)
    with torch.cuda.stream(stream):
        graph.replay()
    stream.synchronize()
    torch.testing.assert_close(out[0], x * 2 + 1)
    torch.testing.assert_close(got, torch.nn.functional.silu(z))
