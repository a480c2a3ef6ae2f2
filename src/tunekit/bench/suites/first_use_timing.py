"""First-use suite, step 3: the device time per call of each choice, torch eager, torch.compile and a
copy of the same bytes, timed head to head over L2-cold input sets (``first_use.py`` says the method).

``d`` below is a ``first_use.Direction``: one tunable op of a family as the suite calls it.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ...tunable.numerics import compare
from ...tunable.params import make_trial
from ...tunable.screen import input_sets
from .common import head_to_head, reason

__all__ = ["device_times", "sync"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compiled(d, op, params, sets, device) -> tuple[Callable | None, float | None, str | None]:
    """torch.compile of the torch function for this signature: (a set's runner, compile s, error)."""
    torch._dynamo.reset()  # this signature's own compile, timed from nothing compiled in memory
    seconds = None
    try:
        fn = torch.compile(d.compiled, dynamic=False, fullgraph=True)
        sync(device)
        t0 = time.perf_counter()
        got = fn(*d.compiled_args(sets[0]))
        sync(device)
        seconds = time.perf_counter() - t0
        problem = compare(got, d.reference(sets[0]).to(got.dtype), op.tolerance(params))
        if problem:
            raise AssertionError(f"torch.compile result: {problem}")
        return (lambda q: fn(*d.compiled_args(q))), seconds, None
    except Exception as exc:  # recorded; the other contenders still count
        return None, seconds, reason(exc)


def device_times(d, op, params, names, device, *, repeats: int, graph: bool, compile: bool) -> dict:
    """Step 3: device time per call (ms) of each named candidate, torch eager, torch.compile and a copy
    of the same bytes, timed head to head over L2-cold input sets."""
    sets = input_sets(params, make_trial(params))
    row = {"input_sets": len(sets), "errors": {}, "compile_s": None}
    contenders = {f"tunekit:{n}": (op.candidate(n).run, graph) for n in names}
    contenders["eager"] = (d.eager, graph)
    if compile:
        runner, row["compile_s"], error = _compiled(d, op, params, sets, device)
        if runner is not None:
            contenders["compile"] = (runner, graph)
        else:
            row["errors"]["compile"] = error
    x = params.x
    n = max(1, params.bytes_moved() // (2 * x.element_size()))
    copies = {id(q): (torch.empty(n, dtype=x.dtype, device=device), torch.empty(n, dtype=x.dtype, device=device))
              for q in sets}
    copy = lambda q: copies[id(q)][1].copy_(copies[id(q)][0])  # noqa: E731
    contenders["copy_eager"] = (copy, False)
    if graph:
        contenders["copy_graph"] = (copy, True)
    times = head_to_head(contenders, sets, device, repeats)
    row["device_ms"] = {"tunekit": {name: times[f"tunekit:{name}"][0] for name in names}, "eager": times["eager"][0],
                        "compile": times["compile"][0] if "compile" in times else None,
                        "copy": min(times[k][0] for k in ("copy_eager", "copy_graph") if k in times)}
    row["spread"] = {k: round(v[1], 4) for k, v in times.items()}
    row["copy_bytes"] = 2 * n * x.element_size()
    return row
