"""The logsumexp probes' timer (benchmarks/probe_logsumexp_*.py): microseconds per call from CUDA
events around the replay of a CUDA graph of n calls, call i on buffer i % 8 of the caller's
rotation (8 buffers of 64-128 MiB: L2-cold), median of the replays after the first."""
import statistics

import torch


def timed(fn, n=40, reps=7) -> float:
    """us per call: CUDA-graph replay of n calls of ``fn(i)``, median of reps - 1."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / n)
    return statistics.median(times[1:])
