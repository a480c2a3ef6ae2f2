"""The runtime on a real GPU: graph capture, CUDA timers, L2 rotation, a cached path with no sync."""

import time

import pytest
import torch

import tunekit
from tunekit.ops.silu import SiluParams, silu_op, torch_silu
from tunekit.tunable import context, find_fastest, results_store, tuning
from tunekit.tunable.host_time import HOST_TIE
from tunekit.tunable.screen import input_sets
from tunekit.tunable.tunable_op import TunableOp
from tunekit.tunable.params import make_trial

pytestmark = pytest.mark.gpu


def test_no_tuning_while_a_graph_is_captured_and_tuning_after(cuda):
    x = torch.randn(3001, device=cuda, dtype=torch.float16)
    static_out = torch.empty_like(x)
    tunekit.silu(torch.randn(8, device=cuda))  # initialise CUDA state outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with tuning(record_untuned=True):
        with torch.cuda.graph(graph):
            tunekit.silu(x, out=static_out)
    assert not any("n=3001" in e.signature for e in results_store().entries("silu"))  # nothing tuned
    assert [u.signature for u in results_store().untuned("silu")] == [SiluParams(x, static_out).signature()]
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, torch.nn.functional.silu(x))
    tunekit.silu(x, out=static_out)  # eager now: tunes
    assert any("n=3001" in e.signature for e in results_store().entries("silu"))


@pytest.mark.parametrize("graph", [False, True])
def test_find_fastest_times_on_the_device(cuda, graph):
    params = SiluParams(torch.randn(1 << 20, device=cuda, dtype=torch.float16))
    for c in silu_op.candidates:  # compile first (NVRTC, Triton JIT): this test is about the timing
        if c.supports(params) is None:
            c.run(params)
    with tuning(cuda_graph=graph, max_tuning_ms=500) as s:
        report = find_fastest(silu_op, params, s)
    assert report.complete
    times = {n: r.time_ms for n, r in report.candidates.items() if r.status != "unsupported"}
    assert {"torch_silu", "silu_f16x8_pack"} <= set(times)
    assert all(t is not None and 0 < t < 10 for t in times.values()), times
    # the composite moves 3x the bytes of a fused kernel: it must not win
    assert report.choice != "torch_x_sigmoid"
    assert report.candidates["silu_f32"].status == "unsupported"  # a float16 input
    # the fastest; or the default, kept within the margin; or a candidate tied with one of those
    # on device time (within HOST_TIE) that costs less host time per call
    assert (times[report.choice] <= min(times.values()) * 1.0001
            or times[report.choice] <= times["torch_silu"] * (1 + HOST_TIE)), (report.choice, times)


def slow_host(p):
    """torch's kernel after 40 us of host work: the same device time, far more host time"""
    end = time.perf_counter() + 40e-6
    while time.perf_counter() < end:
        pass
    return torch_silu(p)


def test_a_device_time_tie_goes_to_the_candidate_with_less_host_time(cuda):
    op = TunableOp("silu_host_tie", SiluParams)
    op.add(slow_host, default=True)
    op.add(torch_silu)
    params = SiluParams(torch.randn(1 << 16, device=cuda))
    with tuning(max_tuning_ms=2000) as s:
        report = find_fastest(op, params, s)
    assert report.choice == "torch_silu", report.candidates
    assert "host time" in report.candidates["torch_silu"].reason
    assert report.candidates["slow_host"].status == "slower"


def test_host_time_breaks_no_tie_when_the_device_is_the_bottleneck(cuda):
    # 40 us of host work against a kernel of ~150 us (1 << 26 floats in and out)
    op = TunableOp("silu_device_bound_tie", SiluParams)
    op.add(slow_host, default=True)
    op.add(torch_silu)
    params = SiluParams(torch.randn(1 << 26, device=cuda))
    with tuning(max_tuning_ms=5000, margin=0.03) as s:
        report = find_fastest(op, params, s)
    assert report.choice == "slow_host", report.candidates  # the same kernel: the default keeps its place
    assert "host time" not in report.candidates["slow_host"].reason


def test_small_inputs_are_rotated_to_stay_cold_in_l2(cuda):
    params = SiluParams(torch.randn(1 << 16, device=cuda))
    sets = input_sets(params, make_trial(params))
    l2 = torch.cuda.get_device_properties(cuda).L2_cache_size
    assert len(sets) > 1
    assert len(sets) * params.bytes_moved() >= min(2 * l2, 16 * params.bytes_moved())
    assert len({s.x.data_ptr() for s in sets}) == len(sets)


def test_cached_call_does_not_synchronise_or_allocate_extra(cuda):
    x = torch.randn(1 << 20, device=cuda)
    tunekit.silu(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats(cuda)["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = tunekit.silu(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    after = torch.cuda.memory_stats(cuda)["allocation.all.allocated"]
    assert after - before == 1  # the output, nothing else
    torch.testing.assert_close(y, torch.nn.functional.silu(x))


def test_the_first_call_of_a_new_elementwise_signature_stays_well_under_100_ms(cuda):
    """With the default step (tests otherwise tune in one call), a new signature's first call does one
    step of its tuning session and runs the incumbent: a bound the user sees, not a benchmark."""
    tunekit.silu(torch.randn(1000, device=cuda))  # CUDA context, events, first allocations
    torch.cuda.synchronize()
    with tunekit.tuning(tuning_step_ms=context.TuningSettings().tuning_step_ms):
        for n in (1 << 16, 1 << 22, 1 << 24):
            x = torch.randn(n, device=cuda, dtype=torch.float16)
            t0 = time.perf_counter()
            tunekit.silu(x)
            torch.cuda.synchronize()
            elapsed = (time.perf_counter() - t0) * 1e3
            assert elapsed < 100, f"n={n}: first call took {elapsed:.1f} ms"
