"""``tunekit explore``'s measurement and table: every candidate of an op on one example, timed by
:func:`tunekit.bench.measure.measure_candidates`, against the copy bandwidth measured in the same
run (memory-bound ops: GB/s and % of copy) or as TFLOP/s (matrix products, whose params have
``mnk`` and ``batch``)."""

from __future__ import annotations

import torch

from .measure import measure_candidates
from ..tunable import context

__all__ = ["explore_one", "print_explore"]


def _flops(params) -> float | None:
    """Floating-point operations of one call (2 M N K per matrix product), or None for other ops."""
    mnk = getattr(params, "mnk", None)
    if mnk is None:
        return None
    M, N, K = mnk
    return 2.0 * M * N * K * getattr(params, "batch", 1)


def _row(name, t, nbytes, flops, bandwidth, base, chosen) -> dict:
    row = {"candidate": name, "status": t.status, "reason": t.reason, "first_values": t.first_values,
           "time_ms": t.time_ms, "spread": t.spread, "default": t is base, "tuned_choice": name == chosen}
    if t.time_ms:
        gbps = nbytes / (t.time_ms * 1e-3) / 1e9
        row.update(gbps=gbps, pct_copy=100 * gbps / bandwidth,
                   vs_default=base.time_ms / t.time_ms if base.time_ms else None)
        if flops is not None:
            row["tflops"] = flops / (t.time_ms * 1e-3) / 1e12
    return row


def explore_one(op, shape, dtype: torch.dtype, device: torch.device, bandwidth: float, *, repeats: int = 20,
                graph: bool = True, seed: int = 0, arguments: dict | None = None, device_note: str = "") -> dict:
    """Every candidate of ``op`` on ``op.make_example(shape, dtype, device, **arguments)``: a dict
    of the example's facts and one row per candidate (status, first values, time, GB/s or TFLOP/s)."""
    torch.manual_seed(seed)
    arguments = arguments or {}
    params = op.make_example(shape, dtype, device, **arguments)
    timings = measure_candidates(op, params, repeats=repeats, graph=graph)
    chosen = op.resolve(params, context.current(), finish=True)
    nbytes, flops = params.bytes_moved(), _flops(params)
    base = timings[op.default.name]
    rows = [_row(name, t, nbytes, flops, bandwidth, base, chosen.candidate.name) for name, t in timings.items()]
    return {"op": op.name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "arguments": arguments,
            "device": device_note, "signature": params.signature(), "bytes": nbytes, "flops": flops,
            "copy_gbps": bandwidth, "repeats": repeats, "tuned_choice": chosen.candidate.name, "why": chosen.why,
            "candidates": rows}


def print_explore(result: dict) -> None:
    rows, bandwidth, gemm = result["candidates"], result["copy_gbps"], result.get("flops") is not None
    shape = "x".join(str(s) for s in result["shape"])
    print(f"{result['op']} {shape} {result['dtype']}   {result['device']}")
    print(f"signature {result['signature']}   copy bandwidth {bandwidth:.0f} GB/s (read+write, same run)")
    w = max(len(r["candidate"]) for r in rows) + 2
    rate = f"{'TFLOP/s':>9}" if gemm else f"{'GB/s':>9}{'% copy':>8}"
    print(f"{'':2}{'candidate':<{w}}{'first values':>28}{'median':>13}{rate}{'vs default':>11}")
    for r in rows:
        mark = "*" if r["tuned_choice"] else " "
        vals = ", ".join(f"{v:.8g}" for v in r["first_values"])
        if r["status"] != "ok":
            print(f"{mark} {r['candidate']:<{w}}{vals:>28}   rejected ({r['status']}): {r['reason']}")
            continue
        speed = f"{r['tflops']:>9.1f}" if gemm else f"{r['gbps']:>9.1f}{r['pct_copy']:>7.1f}%"
        print(f"{mark} {r['candidate']:<{w}}{vals:>28}{r['time_ms'] * 1e3:>10.2f} us{speed}{r['vs_default']:>10.2f}x")
    print(f"* tuned choice: {result['tuned_choice']} ({result['why']})")
