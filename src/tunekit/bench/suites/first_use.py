"""First use: what a fresh process with tunekit's default settings gets on signatures it meets first.

For ``benchmarks/suites/first_use.py`` and ``tunekit bench --first-use``: :func:`run` starts a child
process per op family and cache state and merges their rows (``first_use_report``: goals, Markdown).

- A fresh process per family and cache state: "empty" (new tunekit, Triton and Inductor cache
  folders), then "warm" (the same folders again), each with a fresh results file, in the parent's
  environment less every ``TUNEKIT_*`` variable (default settings) and ``TRITON_INTERPRET``. Before
  its first signature a child only creates the CUDA context (every GPU program has one) and measures
  the copy bandwidth: the first signature pays the process's one-off costs (building the launch
  extensions, importing Triton), and its row says ``first_in_process``.
- Per signature, fresh random inputs (``op.make_example``, never zeros), then the public function
  (``tunekit.silu(x)``, ``silu_backward(dy, x)``, ``gelu(x, approximate=...)``, ``logsumexp(x, dim)``,
  ``logsumexp_backward(dy, x, lse, dim)``: called directly, not through autograd), synchronized
  before and after each call, until ``op.decision(params)`` gives the final choice or ``max_calls``
  calls (more, for at most :data:`PENDING_LIMIT_S`, while a shipped choice compiles on a worker):
  every call's wall (the first ``max_calls``; past them their sum) and the choice in effect after call 1, call 20 and at the end; then
  :data:`STEADY_CALLS` more calls, the final choice's wall per call (the 10,000-call estimate's unit).
- Then torch eager's first call on the same inputs and its steady wall (:func:`torch_first_call`: what
  a program without tunekit pays for a new shape; a process's first signature takes it from a fresh
  process of torch alone, :func:`torch_baseline`), which the tuning share deducts.
- Then offline tuning of the signature (``tune_params``, default settings, a retry with twice the
  budget; it never touches the
  inputs) and device times head to head (:func:`~tunekit.bench.suites.common.head_to_head`: rotated
  rounds, CUDA-graph replays over input sets that overflow L2) of each distinct choice, torch eager
  (as the activations and logsumexp suites time it), torch.compile (``dynamic=False,
  fullgraph=True``; compile time recorded, result checked against float32 math with tuning's
  tolerance) and a copy of as many bytes (the faster of eager and graph): the roofline. That ends
  before the next first call, compiling no candidate the session had not begun preparing.
- Time: :func:`run` shares ``time_limit`` among the children by estimated work; a child starts no
  signature past its deadline (listed as not measured) and is killed :data:`GRACE_S` after it.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...offline.tune_one import tune_params
from ...ops import gelu, gelu_backward, logsumexp, logsumexp_backward, silu, silu_backward
from ...tunable import context
from ...tunable.params import make_trial
from ...tunable.registry import get_op
from ..measure import copy_bandwidth, versions
from . import activations as act_suite
from . import logsumexp as lse_suite
from .common import DTYPES, device_name, log, raise_compile_limits, reason, timing_label
from .first_use_timing import device_times, sync
from .first_use_report import STATES, label, merge_child, new_results, progress_line, read_lines, write_files

__all__ = ["FAMILIES", "PRESETS", "Direction", "directions", "signatures", "run", "write_files", "child"]

FAMILIES = ("silu", "gelu", "gelu_tanh", "logsumexp")
QUICK_LSE_SHAPES = [((32768, 64), -1), ((4096, 4096), -1), ((64, 1048576), -1), ((4096, 4096), 0)]
#: mode -> run() arguments: "full" and "quick" for a GPU; "smoke" shows on a CPU that it runs end to end
PRESETS = {
    "full": {"families": list(FAMILIES), "dtypes": list(DTYPES), "act_shapes": act_suite.TARGET_SHAPES,
             "lse_shapes": lse_suite.SHAPES, "device": "cuda", "repeats": 10, "compile": True, "graph": True,
             "time_limit": 400.0},
    "smoke": {"families": ["silu"], "dtypes": ["float32"], "act_shapes": [(64, 128), (128, 128)],
              "lse_shapes": lse_suite.QUICK_SHAPES, "device": "cpu", "repeats": 3, "compile": False, "graph": False,
              "time_limit": 120.0, "copy_nbytes": 2**24},
}
PRESETS["quick"] = {**PRESETS["full"], "lse_shapes": QUICK_LSE_SHAPES}
#: calls of the final choice that give its steady wall per call; seconds a child may run past its deadline;
#: seconds calls go on past ``max_calls`` while the choice is not final (a shipped choice compiling on a worker)
STEADY_CALLS, GRACE_S, PENDING_LIMIT_S = 20, 45.0, 20.0
#: seconds torch eager's baseline process may take (its start, CUDA's, the copy bandwidth, one call)
BASELINE_S = 30.0
#: estimated seconds, to share the time limit: a process's start, and one signature by cache state
EST_START_S, EST_SIGNATURE_S = 10.0, {"empty": 3.0, "warm": 1.5}


@dataclass(frozen=True)
class Direction:
    """One tunable op of a family as the benchmark calls it (``q``: one of the timed input sets)."""

    family: str
    direction: str                  # "fwd" or "bwd"
    op: str                         # the tunable op's name
    example: Callable               # (shape, dtype, device, dim) -> params on fresh random inputs
    public: Callable                # params -> the public function's result on the params' inputs
    eager: Callable                 # q -> torch eager's result (as the activations / logsumexp suites time it)
    compiled: Callable              # the function torch.compile compiles
    compiled_args: Callable         # q -> its arguments
    reference: Callable             # q -> ``compiled``'s result in float32 math


_PUBLIC = {"silu": lambda p: silu(p.x), "silu_bwd": lambda p: silu_backward(p.dy, p.x), "gelu": lambda p: gelu(p.x),
           "gelu_bwd": lambda p: gelu_backward(p.dy, p.x), "gelu_tanh": lambda p: gelu(p.x, approximate="tanh"),
           "gelu_tanh_bwd": lambda p: gelu_backward(p.dy, p.x, "tanh")}


def _activation(family: str, case) -> Direction:
    """Eager writes the set's own output (as the activations suite); torch.compile compiles
    ``out.copy_(f(x))`` on 1-D views, which Inductor fuses into one kernel writing ``out``."""
    ins = lambda q: [getattr(q, f) for f in case.fields]  # noqa: E731
    out = lambda q: getattr(q, q.outputs[0])  # noqa: E731

    def copy_into(*tensors):
        *inputs, result = tensors
        return result.copy_(case.functional(*inputs))

    return Direction(
        family, case.direction, case.op,
        example=lambda shape, dtype, device, dim: get_op(case.op).make_example(shape, dtype=dtype, device=device,
                                                                               **case.op_args),
        public=_PUBLIC[case.name], eager=lambda q: case.eager_out(*ins(q), out=out(q)), compiled=copy_into,
        compiled_args=lambda q: [t.view(-1) for t in ins(q)] + [out(q).view(-1)],
        reference=lambda q: case.functional(*[t.float() for t in ins(q)]).view(-1))


def _logsumexp(direction: str) -> Direction:
    """Eager and torch.compile: the logsumexp suite's functions (``torch.logsumexp``; autograd's formula),
    writing the set's own output as that suite's do (its docstring says why)."""
    op, make_example, eager_fn, fields = lse_suite.DIRECTIONS[direction]
    ins = lambda q: [getattr(q, f) for f in fields] + [q.dims]  # noqa: E731
    public = (lambda p: logsumexp(p.x, p.dims)) if direction == "fwd" else (
        lambda p: logsumexp_backward(p.dy, p.x, p.lse, p.dims))
    return Direction(
        "logsumexp", direction, op.name, example=lambda shape, dtype, device, dim: make_example(shape, dtype, device, dim),
        public=public, eager=lambda q: eager_fn(*ins(q), q.out), compiled=lse_suite.written(eager_fn),
        compiled_args=lambda q: ins(q) + [q.out],
        reference=lambda q: eager_fn(*[t.float() if isinstance(t, torch.Tensor) else t for t in ins(q)]))


def directions(family: str) -> list[Direction]:
    if family == "logsumexp":
        return [_logsumexp("fwd"), _logsumexp("bwd")]
    return [_activation(family, act_suite.CASES[family]), _activation(family, act_suite.CASES[family + "_bwd"])]


def signatures(family: str, dtypes, act_shapes, lse_shapes) -> list[tuple[Direction, tuple, int | None, str]]:
    """(direction, shape, dim, dtype) in the order a child meets them: shape, then direction, then dtype
    (so a run cut short by its time limit still covers every dtype and both directions)."""
    shapes = ([(tuple(s), d) for s, d in lse_shapes] if family == "logsumexp"
              else [(tuple(s), None) for s in act_shapes])
    return [(d, shape, dim, dname) for shape, dim in shapes for d in directions(family) for dname in dtypes]


# -- the child: one family, one cache state ------------------------------------------------------
def in_effect(op, params) -> str:
    """The candidate the next call with ``params``' signature runs: the final choice once decided,
    else the tuning session's incumbent, else the default (``TunableOp.in_effect``: looks only)."""
    return op.in_effect(params)[0].name


def _timed_call(fn, params, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn(params)
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def first_use(d: Direction, op, params, device, max_calls: int) -> dict:
    """Steps 1-2: the public function until the choice is final (or ``max_calls`` calls), then the
    final choice's steady wall per call."""
    walls, choice, final_at, calls, total_ms, start, slowest = [], {}, None, 0, 0.0, time.perf_counter(), (0.0, None)
    while final_at is None and (calls < max_calls or time.perf_counter() - start < PENDING_LIMIT_S):
        wall = _timed_call(d.public, params, device)
        calls, total_ms = calls + 1, total_ms + wall
        if calls <= max_calls:  # kept per call; past them the sum and the slowest
            walls.append(wall)
        elif wall > slowest[0]:
            slowest = (wall, calls)
        final_at = calls if op.decision(params) is not None else None
        if calls in (1, 20):
            choice[f"call{calls}"] = in_effect(op, params)
    choice.setdefault("call20", in_effect(op, params))  # final before call 20: in effect from then on
    choice["final"] = in_effect(op, params)
    decided = op.decision(params)
    top = max([(w, i) for i, w in enumerate(walls[1:], 2)] + ([slowest] if slowest[1] else []), default=(None, None))
    row = {"first_call_ms": walls[0], "call_walls_ms": [round(w, 4) for w in walls], "calls_until_final": final_at,
           "calls_made": calls, "walls_sum_ms": total_ms, "s_until_final": time.perf_counter() - start if final_at else None,
           "final_reached": final_at is not None, "max_later_call_ms": top[0], "max_later_call_at": top[1], "choice": choice,
           "why": decided.why if decided else "tuning still in progress",
           "complete": decided.entry.complete if decided is not None and decided.entry is not None else None,
           "steady_call_ms": None}
    if final_at:
        row["steady_call_ms"] = statistics.median(_timed_call(d.public, params, device) for _ in range(STEADY_CALLS))
    return row


def torch_first_call(d: Direction, params, device) -> dict:
    """Torch eager's first call on the signature's inputs and its steady wall per call (ms): what a
    program without tunekit pays for its first call of a new shape (torch's lazy kernel loading).
    Measured after tunekit's calls, so a kernel tunekit already ran counts as loaded (this errs
    against tunekit); a process's first signature takes it from a fresh process (:func:`run`)."""
    q = make_trial(params)  # eager writes the set's own outputs, as in the device timings
    first = _timed_call(d.eager, q, device)
    return {"torch_first_call_ms": first,
            "torch_steady_call_ms": statistics.median(_timed_call(d.eager, q, device) for _ in range(STEADY_CALLS))}


def offline_choice(op, params) -> dict:
    """Step 4: what ``tunekit tune`` chooses for the signature under the same (default) settings."""
    t0 = time.perf_counter()
    entry = tune_params(op, params, context.current())
    return {"choice": entry.choice, "complete": entry.complete, "seconds": time.perf_counter() - t0}


def measure_signature(d: Direction, shape, dim, dname: str, device, config: dict, first_in_process: bool) -> dict:
    """Steps 1-4 for one signature: a row of the results."""
    op = get_op(d.op)
    torch.manual_seed(0)
    params = d.example(shape, DTYPES[dname], device, dim)
    row = {"family": d.family, "state": config["state"], "op": d.op, "direction": d.direction, "dtype": dname,
           "shape": list(shape), "dim": dim, "signature": params.signature(), "bytes": params.bytes_moved(),
           "first_in_process": first_in_process}
    row.update(first_use(d, op, params, device, config["max_calls"]))
    row["errors"] = {}
    try:
        row.update(torch_first_call(d, params, device))
    except Exception as exc:  # recorded: the share is then counted without it
        row["errors"]["torch_first_call"] = reason(exc)
    try:
        row["offline"] = offline_choice(op, params)
    except Exception as exc:  # recorded: the rest of the row still counts
        row["offline"], row["errors"]["offline"] = None, reason(exc)
    names = list(dict.fromkeys(list(row["choice"].values()) + ([row["offline"]["choice"]] if row["offline"] else [])))
    try:
        times = device_times(d, op, params, names, device, repeats=config["repeats"], graph=config["graph"],
                             compile=config["compile"])
        row["errors"].update(times.pop("errors"))
        row.update(times)
    except Exception as exc:  # e.g. out of memory for the input sets: the first-use numbers still count
        row["errors"]["device_times"] = reason(exc)
    return row


def child(config: dict) -> int:
    """One family in one cache state: a meta line, then a JSON line per signature into ``config["rows"]``."""
    device = torch.device(config["device"])
    path = Path(config["rows"])

    def emit(obj: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(obj, default=str) + "\n")

    if device.type == "cuda":  # the context every GPU program has: not tunekit's cost
        torch.ones(1, device=device).add_(1).cpu()
    ready = time.time()
    s = context.current()
    emit({"kind": "meta", "device": device_name(device), "versions": versions(), "timing": timing_label(device.type),
          "ready_s": ready - config["spawned"], "copy_gbps": copy_bandwidth(device, config.get("copy_nbytes")),
          "settings": {"max_tuning_ms": s.max_tuning_ms, "tuning_step_ms": s.tuning_step_ms, "margin": s.margin}})
    if config.get("baseline"):  # torch eager's first call of the family's first signature, nothing else
        d, shape, dim, dname = signatures(config["family"], config["dtypes"], config["act_shapes"], config["lse_shapes"])[0]
        torch.manual_seed(0)
        emit({"kind": "torch_first", **torch_first_call(d, d.example(shape, DTYPES[dname], device, dim), device)})
        return 0
    if config["compile"]:
        raise_compile_limits()
    first = True
    for d, shape, dim, dname in signatures(config["family"], config["dtypes"], config["act_shapes"], config["lse_shapes"]):
        what = label(d.family, d.direction, shape, dim, dname)
        if config["deadline"] is not None and time.time() > config["deadline"]:
            emit({"kind": "not_measured", "label": what})
            continue
        try:
            row = measure_signature(d, shape, dim, dname, device, config, first)
        except Exception as exc:  # e.g. out of memory making the inputs: recorded, the next one runs
            emit({"kind": "not_measured", "label": f"{what} ({reason(exc)})"})
            continue
        finally:
            first = False
            if device.type == "cuda":
                torch.cuda.empty_cache()
        emit({"kind": "row", **row})
        log(progress_line(row))
    emit({"kind": "end", "elapsed_s": time.time() - ready})
    return 0


# -- the parent ----------------------------------------------------------------------------------
def child_environment(folder: Path, state: str, shipped: bool = True) -> dict:
    """The parent's environment with default tunekit settings and the family's cache folders
    (``shipped=False``: also ``TUNEKIT_USE_SHIPPED=0``, what a GPU model with no shipped results gets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEKIT_") and k != "TRITON_INTERPRET"}
    if not shipped:
        env["TUNEKIT_USE_SHIPPED"] = "0"
    src = str(Path(__file__).resolve().parents[3])  # the folder holding the tunekit package
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(TUNEKIT_CACHE=str(folder / "tunekit"), TRITON_CACHE_DIR=str(folder / "triton"),
               TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), TUNEKIT_RESULTS=str(folder / f"{state}-results.sqlite"))
    return env


def _pump(stream, tail: collections.deque) -> None:
    for line in stream:
        tail.append(line.rstrip())
        print(line, end="", file=sys.stderr, flush=True)


def start_child(config: dict, folder: Path) -> dict:
    """Run one child to its end (killed GRACE_S after its deadline); its lines, exit code, output tail."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = folder / f"{config['state']}-rows.jsonl"  # the folder is new in every run
    config = {**config, "rows": str(rows), "spawned": time.time()}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tunekit.bench.suites.first_use", "--child", json.dumps(config)],
                            env=child_environment(folder, config["state"], config.get("shipped", True)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: collections.deque = collections.deque(maxlen=15)
    (pump := threading.Thread(target=_pump, args=(proc.stdout, tail), daemon=True)).start()
    timeout = None if config["deadline"] is None else max(0.0, config["deadline"] - time.time()) + GRACE_S
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        tail.append(f"killed {GRACE_S:.0f} s after its deadline")
    pump.join(timeout=10)
    return {"rc": rc, "seconds": time.perf_counter() - t0, "rows": rows, "tail": list(tail)}


def torch_baseline(config: dict, folder: Path) -> tuple[dict, dict]:
    """Torch eager's first call of the family's first signature in a fresh process started as the
    children are (``{}`` if it failed), and how that process ended: the program without tunekit pays
    that call as its process's first. At most :data:`BASELINE_S` (then killed :data:`GRACE_S` later)."""
    result = start_child({**config, "state": "torch", "baseline": True, "deadline": time.time() + BASELINE_S}, folder)
    found = [x for x in read_lines(Path(result["rows"])) if x["kind"] == "torch_first"]
    ended = {"rc": result["rc"], "seconds": result["seconds"],
             "error": None if found else " | ".join(result["tail"][-6:]) or f"exit {result['rc']}"}
    return ({k: v for k, v in found[0].items() if k != "kind"} if found else {}), ended


def _deadline(jobs_left: list[tuple[str, str]], counts: dict[str, int], end: float | None) -> float | None:
    """This child's share of the time left, in proportion to its estimated work among the children left."""
    if end is None:
        return None
    est = [EST_START_S + counts[f] * EST_SIGNATURE_S[s] for f, s in jobs_left]
    return time.time() + max(0.0, end - time.time()) * est[0] / sum(est)


def run(*, families, dtypes, act_shapes, lse_shapes, device: str = "cuda", repeats: int = 10, compile: bool = True,
        graph: bool = True, max_calls: int = 200, time_limit: float | None = 400.0, copy_nbytes: int | None = None,
        shipped: bool = True, cache_dir: str | None = None, keep_caches: bool = False, command: str = "python benchmarks/suites/first_use.py",
        args: dict | None = None, on_update=None) -> dict:
    """Every family in both cache states, a fresh child process each; the raw results (the JSON).
    ``shipped=False``: the children ignore shipped pre-tuned results (``TUNEKIT_USE_SHIPPED=0``).
    ``on_update(raw)`` after each child (write the files then: a run cut short keeps what it measured)."""
    started = time.perf_counter()
    end = time.time() + time_limit if time_limit else None
    root = Path(tempfile.mkdtemp(prefix="tunekit-first-use-", dir=cache_dir))
    if keep_caches:
        log(f"first use: cache folders and children's rows in {root}")
    expected = {f: [label(d.family, d.direction, *rest) for d, *rest in signatures(f, dtypes, act_shapes, lse_shapes)]
                for f in families}
    base = {"family": None, "dtypes": list(dtypes), "act_shapes": [list(s) for s in act_shapes],
            "lse_shapes": [[list(s), d] for s, d in lse_shapes], "device": device, "repeats": repeats,
            "compile": compile, "graph": graph, "max_calls": max_calls, "copy_nbytes": copy_nbytes, "shipped": shipped}
    raw = new_results(command, args, {**base, "families": list(families), "time_limit": time_limit})
    jobs, baselines = [(f, s) for f in families for s in STATES], {}
    try:
        for i, (family, state) in enumerate(jobs):
            deadline = _deadline(jobs[i:], {f: len(e) for f, e in expected.items()}, end)
            if deadline is not None and deadline - time.time() < EST_START_S:
                raw["not_measured"] += [f"{state}: {e} (no time left)" for e in expected[family]]
                continue
            if family not in baselines:  # its own folder: the children's cache folders stay as their state says
                baselines[family], raw.setdefault("baselines", {})[family] = torch_baseline(
                    {**base, "family": family}, root / f"{family}-torch")
                deadline = _deadline(jobs[i:], {f: len(e) for f, e in expected.items()}, end)  # what is left now
            result = start_child({**base, "family": family, "state": state, "deadline": deadline}, root / family)
            merge_child(raw, family, state, expected[family], result)
            for row in raw["rows"]:
                if row["family"] == family and row.get("first_in_process") and baselines[family]:
                    row.update(baselines[family], torch_first_from="a fresh process")
                    row["errors"].pop("torch_first_call", None)
            raw["elapsed_s"] = time.perf_counter() - started
            if on_update is not None:
                on_update(raw)
    finally:
        if not keep_caches:
            shutil.rmtree(root, ignore_errors=True)
    raw["elapsed_s"], raw["final"] = time.perf_counter() - started, True
    return raw


if __name__ == "__main__":  # a child, as start_child runs it: python -m tunekit.bench.suites.first_use --child CONFIG
    raise SystemExit(child(json.loads(sys.argv[sys.argv.index("--child") + 1])))
