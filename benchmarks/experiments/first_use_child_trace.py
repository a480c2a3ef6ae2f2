"""Answers: inside a first-use suite child (its environment, its setup: the 1 GiB copy, its imports, the same cache
folders), which steps hold each signature's first call? The suite's process-first activation rows read 14.7-16.8 ms
where first_call_timeline.py's process-first call reads 11.5 ms and torch's own first call, in a suite baseline
child, 6.9-7.0 ms. Runs the suite's own child function (``first_use.child``) in a child started as the suite starts
it, with first_call_timeline's step wrappers installed; prints each signature's first-call spans of 0.2 ms or more,
then the torch baseline child's first call. GPU (the activations families; ``--device cpu`` only checks it runs).

    PYTHONPATH=src python benchmarks/experiments/first_use_child_trace.py --family silu [--dtypes float32,float16] \
        [--env TUNEKIT_FAST_CALL=0]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _trace_child(config: dict) -> int:
    """The suite's child, each first_use() call's first call traced."""
    import first_call_timeline as timeline  # installs nothing until _wrap

    from tunekit.bench.suites import first_use as suite

    for module_name, path in timeline.STEPS + [("tunekit.tunable.validators", "_device_facts")]:
        timeline._wrap(module_name, path)
    original_first_use, original_timed = suite.first_use, suite._timed_call
    window: dict = {}

    def timed(fn, params, device):
        start = time.perf_counter()
        wall = original_timed(fn, params, device)
        window.setdefault("call", (start, time.perf_counter()))
        return wall

    def traced_first_use(d, op, params, device, max_calls):
        window.clear()
        timeline.SPANS.clear()
        row = original_first_use(d, op, params, device, max_calls)
        start, end = window["call"]
        print(f"## {d.family} {d.direction} {list(params.x.shape)} {params.x.dtype}: first call {row['first_call_ms']:.2f} ms")
        for s, e, thread, name in sorted(timeline.SPANS):
            if start <= s <= end + 0.02 and (e - s) * 1e3 >= 0.2:
                print(f"  {(s - start) * 1e3:7.2f} -> {(e - start) * 1e3:7.2f}  {(e - s) * 1e3:6.2f}  {thread[:26]:26s} {name}")
        return row

    suite.first_use, suite._timed_call = traced_first_use, timed
    return suite.child(config)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="silu")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the children (the suite drops TUNEKIT_*)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _trace_child(json.loads(args.child))
    from tunekit.bench.suites import first_use as suite

    root = Path(tempfile.mkdtemp(prefix="tunekit-child-trace-"))
    base = {"family": args.family, "dtypes": args.dtypes.split(","), "act_shapes": [[int(v) for v in args.shape.split("x")]],
            "lse_shapes": [], "device": args.device, "repeats": 3, "compile": False, "graph": args.device == "cuda",
            "max_calls": 200, "copy_nbytes": None if args.device == "cuda" else 2**20, "shipped": True, "deadline": None}
    for state in ("empty", "warm", "torch"):
        folder = root / (args.family if state != "torch" else f"{args.family}-torch")
        folder.mkdir(parents=True, exist_ok=True)
        config = {**base, "state": state, "baseline": state == "torch", "rows": str(folder / f"{state}-rows.jsonl"),
                  "spawned": time.time()}
        print(f"=== {state}", flush=True)
        env = suite.child_environment(folder, state if state != "torch" else "empty")
        env.update(item.split("=", 1) for item in args.env)
        subprocess.run([sys.executable, __file__, "--child", json.dumps(config)], check=False, env=env)
        if state == "torch":
            lines = [json.loads(x) for x in Path(config["rows"]).read_text().splitlines()]
            print("torch baseline child:", [{k: round(v, 3) for k, v in x.items() if k.endswith("_ms")}
                                            for x in lines if x["kind"] == "torch_first"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
