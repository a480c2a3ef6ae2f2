"""benchmarks/suites/logsumexp.py: the target verdicts and the report, on made-up rows (no GPU)."""

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "suites" / "logsumexp.py"
spec = importlib.util.spec_from_file_location("bench_logsumexp", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

GBPS = 4000.0  # copy bandwidth: 4000 GB/s, so 4e6 bytes in 1 us is 100%


def row(direction="fwd", dtype="float16", input_bytes=64 * 2**20, pct=95.0, eager_x=6.0, compile_x=1.2, **kw):
    """A measured row whose tuned time gives ``pct`` % of GBPS, eager ``eager_x`` times slower, compile
    ``compile_x`` times slower than tuned."""
    nbytes = input_bytes + 1024
    tuned_ms = nbytes / (pct / 100 * GBPS * 1e9) * 1e3
    r = {"direction": direction, "shape": [4096, 4096], "dim": -1, "dtype": dtype, "input_bytes": input_bytes,
         "bytes": nbytes, "tuned_ms": tuned_ms, "eager_ms": eager_x * tuned_ms,
         "compile_ms": None if compile_x is None else compile_x * tuned_ms, "tuned": {"name": "k"}, "errors": {},
         "candidates": {"k": {"status": "ok", "time_ms": tuned_ms}}}
    r.update(kw)
    return r


def verdicts(r):
    return {k: v for k, (_, v) in bench.evaluate(r, GBPS).items()}


def test_forward_all_pass():
    assert verdicts(row()) == {"fwd_copy": "pass", "fwd_eager": "pass", "fwd_compile": "pass"}
    value, _ = bench.evaluate(row(), GBPS)["fwd_copy"]
    assert value == pytest.approx(95.0)


def test_forward_failures():
    v = verdicts(row(pct=89.0, eager_x=4.9, compile_x=0.99))
    assert v == {"fwd_copy": "fail", "fwd_eager": "fail", "fwd_compile": "fail"}


def test_thresholds_are_inclusive_and_compile_strict():
    assert verdicts(row(pct=90.0, eager_x=5.0, compile_x=1.0)) == {
        "fwd_copy": "pass", "fwd_eager": "pass", "fwd_compile": "fail"}  # equal to compile is not faster


def test_not_applicable():
    small = verdicts(row(input_bytes=32 * 2**20 - 2, pct=10.0))
    assert small["fwd_copy"] == "n/a"
    assert verdicts(row(input_bytes=32 * 2**20, pct=10.0))["fwd_copy"] == "fail"  # 32 MiB counts
    assert verdicts(row(dtype="float32", eager_x=1.0))["fwd_eager"] == "n/a"
    assert verdicts(row(dtype="bfloat16", eager_x=1.0))["fwd_eager"] == "fail"


def test_missing_measurements():
    v = verdicts(row(compile_x=None, tuned_ms=None))
    assert v == {"fwd_copy": "missing", "fwd_eager": "missing", "fwd_compile": "missing"}


def test_backward_targets():
    assert verdicts(row("bwd", pct=86.0)) == {"bwd_copy": "pass", "bwd_compile": "pass"}
    assert verdicts(row("bwd", pct=84.0, compile_x=0.5)) == {"bwd_copy": "fail", "bwd_compile": "fail"}


def test_summary_counts_and_cells():
    rows = [row(), row("bwd", pct=80.0), row(dtype="float32", shape=[32768, 64], input_bytes=8 * 2**20, pct=20.0)]
    lines = bench.summary_lines(rows, GBPS)
    table = [ln for ln in lines if ln.startswith("| 4096x4096")]
    assert len(table) == 1 and "95.0 PASS" in table[0] and "**80.0 FAIL**" in table[0]
    small = next(ln for ln in lines if ln.startswith("| 32768x64"))
    assert "(20.0)" in small and small.endswith("– | – |")  # no backward row for it
    counts = "\n".join(ln for ln in lines if ln.startswith("- "))
    assert "forward tuned >= 90% of the copy bandwidth (input >= 32 MiB): **1 pass, 0 fail**, 1 n/a" in counts
    assert "backward tuned >= 85% of the copy bandwidth (input >= 32 MiB): **0 pass, 1 fail**, 0 n/a, 1 not" in counts


def test_render_and_parse():
    meta = {"device": "cpu", "date": "2026-01-01 00:00:00", "versions": {"torch": "x", "cuda": None, "triton": None},
            "command": "python benchmarks/suites/logsumexp.py", "args": {"repeats": 3}, "copy_gbps_start": GBPS,
            "elapsed_s": 1.0, "not_measured": ["fwd 4x16777216 dim -1 float32"]}
    text = bench.render(meta, [row(), row("bwd")])
    assert "## Targets" in text and "## Forward" in text and "## Backward" in text and "Not measured" in text
    assert bench.parse_shapes("4096x4096:0,32x4096x128:1,64x64") == [((4096, 4096), 0), ((32, 4096, 128), 1),
                                                                     ((64, 64), -1)]
