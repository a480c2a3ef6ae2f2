"""Answers: does tuning's graph timer read the same device time through the driver's capture (driver_graph) as
through torch.cuda.CUDAGraph, whose replay launches two fill_ kernels (the generator's seed and offset) ahead of
the graph? Per kernel: the median of 15 measurements of each timer, alternating, reps chosen as tuning chooses
them (about 0.05 ms of work per replay, at least one run). Usage: python graph_timer_driver_vs_torch.py"""

import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from tunekit.tunable import driver_graph, timing  # noqa: E402


def cases(device):
    for n in (1 << 16, 1 << 20, 1 << 24):
        x = torch.randn(n, device=device, dtype=torch.bfloat16)
        yield f"silu bf16 n={n}", lambda x=x: torch.nn.functional.silu(x)
    for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096)):
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        yield f"mm bf16 {m}x{n}x{k}", lambda a=a, b=b: torch.mm(a, b.t())


def main():
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print("| kernel | reps | driver graph us/run | torch graph us/run | torch / driver |")
    print("|---|---:|---:|---:|---:|")
    for name, fn in cases(device):
        fn()
        torch.cuda.synchronize()
        probe = timing.CudaQueuedTimer(device).measure(fn, 3)
        reps = max(1, min(1000, math.ceil(timing.CudaQueuedTimer.target_ms / max(probe, 1e-6))))
        timers = {}
        for kind in ("driver", "torch"):
            timer = timing.CudaGraphTimer(device)
            side = timing.isolation.stream_for_thread(device)
            graph = driver_graph.capture(fn, reps, side, device) if kind == "driver" else timing._torch_graph(fn, reps, side)
            torch.cuda.current_stream(device).wait_stream(side)
            sizer = timer.new_sizer()
            timers[kind] = (timer, graph, sizer)
        samples = {kind: [] for kind in timers}
        for _ in range(15):
            for kind, (timer, graph, sizer) in timers.items():
                samples[kind].append(timer._measure(graph.replay, 1, sizer, learn=False) / reps * 1e3)
        d, t = statistics.median(samples["driver"]), statistics.median(samples["torch"])
        print(f"| {name} | {reps} | {d:.2f} | {t:.2f} | {t / d:.3f} |", flush=True)


if __name__ == "__main__":
    main()
