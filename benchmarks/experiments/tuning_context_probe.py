"""Answers: which kernel run just before a tuning measurement makes the flat logsumexp gradient at 16384x512 float16
read 14.0 us (the suite's head-to-head) instead of 13.1 (tuning's rounds)? Tuning's own graph timer
(``CudaGraphTimer``: a capture of the candidate over tuning's input sets, its replays queued behind a spin), with one
"context" enqueued between the spin and the start event of every measurement; the flat and static kernels measured in
alternation, 12 rounds, medians. ``PYTHONPATH=src python benchmarks/experiments/tuning_context_probe.py``"""
import statistics
import sys

import torch

sys.path.insert(0, "src")
from tunekit.bench.suites.first_use import directions  # noqa: E402
from tunekit.tunable import registry, timing  # noqa: E402
from tunekit.tunable.params import make_trial  # noqa: E402
from tunekit.tunable.screen import input_sets  # noqa: E402

NAMES = ["logsumexp_backward_triton_flat_b1024_w4", "logsumexp_backward_triton_static_b1024_w4"]


def spin_mhz(context, cycles: int = 200_000) -> float:
    """The SM clock right after ``context`` ran: a spin of ``cycles`` clock cycles timed with events (MHz)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000)  # the host enqueues the rest meanwhile
    context()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end) / 1e3


def main() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    d = next(x for x in directions("logsumexp") if x.direction == "bwd")
    op = registry.get_op(d.op)
    params = d.example((16384, 512), torch.float16, device, -1)
    sets = input_sets(params, make_trial(params))
    big = [torch.empty(64 << 20, dtype=torch.uint8, device=device) for _ in range(2)]
    small = [torch.empty(4 << 20, dtype=torch.uint8, device=device) for _ in range(2)]
    other = make_trial(params, copy_inputs=True)
    contexts = {
        "none": lambda: None,
        "copy 64 MiB": lambda: big[1].copy_(big[0]),
        "fill 64 MiB": lambda: big[1].fill_(1),
        "copy 4 MiB": lambda: small[1].copy_(small[0]),
        "read 64 MiB (sum)": lambda: big[0].sum(dtype=torch.int32),
        "static kernel on another set": lambda: op.candidate(NAMES[1]).run(other),
        "spin 50 us": lambda: torch.cuda._sleep(int(0.05 * timing.sleep_cycles_per_ms(device))),
        "copy 64 MiB x 12 (~0.5 ms)": lambda: [big[1].copy_(big[0]) for _ in range(12)],
        "read 64 MiB x 12 (sum)": lambda: [big[0].sum(dtype=torch.int32) for _ in range(12)],
        "read 4 MiB (sum)": lambda: small[0].sum(dtype=torch.int32),
        "read 64 MiB (amax)": lambda: big[0].amax(),
    }
    timer = timing.CudaGraphTimer(device)
    runners = {}
    for n in NAMES:
        run = op.candidate(n).run

        def run_all(run=run):
            for p in sets:
                run(p)
        run_all()
        runners[n] = run_all
    per_pass = 13e-3 * len(sets)
    reps = max(1, round(timer.target_ms / per_pass))
    measures = {n: timer.prepare(fn, reps) for n, fn in runners.items()}
    queue = timer.queue
    plain_start = queue.record_start
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; 16384x512 float16, {len(sets)} input sets, "
          f"{reps} passes a replay; us per call, median of 12 (min-max)")
    for label, context in contexts.items():
        queue.record_start = lambda context=context: (context(), plain_start())
        samples = {n: [] for n in NAMES}
        for i in range(12):
            for n in (NAMES if i % 2 == 0 else NAMES[::-1]):
                samples[n].append(measures[n]() / len(sets) * 1e3)
        clocks = f"{statistics.median(spin_mhz(context) for _ in range(5)):.0f} MHz"
        cells = ", ".join(f"{n.split('_triton_')[1]} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                          for n, v in samples.items())
        print(f"{label:30s} {cells}; a spin's clock right after the context {clocks}", flush=True)
    queue.record_start = plain_start


if __name__ == "__main__":
    main()
