"""What both suites share: number formatting, the timing label, and ``head_to_head``.

``head_to_head`` exists because timings taken apart are not comparable at the precision the targets
need: two separate measurements of one kernel can differ by more than the 2% a tuned/eager target
allows (clocks and the rest of the run drift between them). Timed in the same rounds, in rotated
order, on the same buffers and with the same repetitions per measurement, they agree.
"""

from __future__ import annotations

import statistics
import sys

import torch

from ...tunable.dtypes import BY_NAME, KERNEL_DTYPES
from ...tunable.timing import make_timer

__all__ = [
    "DTYPES",
    "device_name",
    "fmt",
    "head_to_head",
    "log",
    "pct",
    "raise_compile_limits",
    "reason",
    "shape_text",
    "timing_label",
]

#: the dtypes the suites measure, by name (the kernels' storage types)
DTYPES = {name: dtype for name, dtype in BY_NAME.items() if dtype in KERNEL_DTYPES}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def shape_text(shape) -> str:
    return "x".join(str(s) for s in shape)


def pct(nbytes, ms, gbps) -> float | None:
    """``nbytes`` moved in ``ms`` as % of ``gbps``; None when either is missing."""
    return None if not ms or not gbps else 100 * nbytes / (ms * 1e-3) / 1e9 / gbps


def fmt(v, spec=".1f", none="–") -> str:
    return none if v is None else format(v, spec)


def reason(exc: BaseException) -> str:
    """The first line of an exception, short enough for a table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def device_name(device: torch.device) -> str:
    """The GPU's name (what result files are named after), or the device type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def timing_label(device_type: str) -> str:
    """How times were taken, in the words the reports use."""
    return "CUDA-graph replay, L2-cold inputs" if device_type == "cuda" else "host timer"


def raise_compile_limits() -> None:
    """Every (shape, dtype) recompiles; Dynamo's default limits would fall back to eager silently."""
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)


def head_to_head(contenders: dict, sets, device, repeats: int) -> dict[str, tuple[float, float]]:
    """{name: (median ms per call, spread)} of each ``(fn, graph)`` run over every input set; measured
    in ``repeats`` rounds, each timing every contender once in an order rotated from round to round
    (so drift hits all alike), on the same buffers and with the same repetitions per measurement."""
    passes = {}
    for name, (fn, graph) in contenders.items():
        def run_all(fn=fn):
            for p in sets:
                fn(p)
        passes[name] = (run_all, graph)
        run_all()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    events = make_timer(device, graph=False)
    one = max(min(events.measure(run_all, 1) for run_all, _ in passes.values()), 1e-4)
    reps = max(1, min(2000, int(1.0 / one)))  # about 1 ms per measurement, as measure.time_callable
    measures = {}
    for name, (run_all, graph) in passes.items():
        try:
            measures[name] = make_timer(device, graph=graph).prepare(run_all, reps)
        except Exception:  # not capturable: plain events
            measures[name] = events.prepare(run_all, reps)
    samples = {name: [] for name in measures}
    names = list(measures)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            samples[name].append(measures[name]() / len(sets))
    return {n: (statistics.median(v), (max(v) - min(v)) / statistics.median(v)) for n, v in samples.items()}
