"""Answers: does the same memory-bound kernel (torch's silu, 1 << 26 float32 in, out=) run at different
speeds depending only on which buffers it reads and writes? (same_kernel_order_probe.py saw one
kernel read 0.185 or 0.211 ms in one process.) Eight output buffers, each timed by CUDA-graph replay in
rotated rounds; prints each buffer's median and its address.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/buffer_placement_probe.py``
"""
import statistics

import torch
import torch.nn.functional as F


def timed(graph, reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    n = 1 << 26
    x = torch.randn(n, device="cuda")
    outs = [torch.empty(n, device="cuda") for _ in range(8)]
    graphs = []
    for out in outs:
        F.silu(x, inplace=False)  # warm
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.ops.aten.silu.out(x, out=out)
        graphs.append(g)
    samples = [[] for _ in outs]
    for r in range(15):
        for i in [(r + k) % len(outs) for k in range(len(outs))]:
            samples[i].append(timed(graphs[i]))
    for i, out in enumerate(outs):
        print(f"out {i}: median {statistics.median(samples[i]):.4f} ms  min {min(samples[i]):.4f}  "
              f"max {max(samples[i]):.4f}  address {out.data_ptr():#x}")


if __name__ == "__main__":
    main()
