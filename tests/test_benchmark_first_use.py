"""The first-use benchmark: its smoke run end to end on the CPU (a subprocess, as a user runs the
script), the goals' verdicts on made-up rows at their limits, merging a child's rows, and
``tunekit bench --first-use``'s wiring."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunekit.bench.suites import first_use
from tunekit.bench.suites.first_use_report import (
    evaluate, merge_child, new_results, render, summarize, tuning_share, write_files,
)
from tunekit.cli import main
from tunekit.tunable.registry import get_op

ROOT = Path(__file__).resolve().parents[1]


def make_row(**changes) -> dict:
    """A signature's row as a child writes it: every goal passes unless ``changes`` say otherwise."""
    row = {"family": "silu", "state": "empty", "op": "silu", "direction": "fwd", "dtype": "float16",
           "shape": [4096, 4096], "dim": None, "bytes": 1000, "copy_bytes": 1000, "first_in_process": False,
           "first_call_ms": 50.0, "call_walls_ms": [50.0, 10.0, 10.0], "calls_until_final": 3, "final_reached": True,
           "max_later_call_ms": 10.0, "choice": {"call1": "a", "call20": "b", "final": "b"}, "steady_call_ms": 1.0,
           "offline": {"choice": "b", "complete": True},
           "device_ms": {"tunekit": {"a": 2.0, "b": 1.0}, "eager": 1.0, "compile": 1.0, "copy": 1.0}, "errors": {}}
    row.update(changes)
    return row


def times(tunekit=None, **others) -> dict:
    out = {"tunekit": tunekit or {"a": 2.0, "b": 1.0}, "eager": 1.0, "compile": 1.0, "copy": 1.0}
    out.update(others)
    return out


# -- the smoke run, end to end ------------------------------------------------------------------
def test_smoke_run_writes_sane_json_and_markdown(tmp_path):
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suites" / "first_use.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = json.loads((tmp_path / "first_use-cpu.json").read_text())
    assert raw["suite"] == "first_use" and raw["device"] == "cpu" and raw["final"] and raw["timing"] == "host timer"
    assert raw["settings"] == {"max_tuning_ms": 200.0, "tuning_step_ms": 20.0, "margin": 0.03}  # the defaults
    assert [(c["family"], c["state"], c["rc"], c["error"]) for c in raw["children"]] == [
        ("silu", "empty", 0, None), ("silu", "warm", 0, None)]
    assert all(c["copy_gbps"] > 0 and c["ready_s"] > 0 for c in raw["children"]) and not raw["not_measured"]
    assert raw["elapsed_s"] < time.perf_counter() - started
    rows = raw["rows"]
    assert len(rows) == 8 and {(r["state"], r["direction"], tuple(r["shape"])) for r in rows} == {
        (s, d, shape) for s in ("empty", "warm") for d in ("fwd", "bwd") for shape in ((64, 128), (128, 128))}
    for r in rows:
        names = {c.name for c in get_op(r["op"]).candidates}
        assert r["first_call_ms"] > 0 and r["first_call_ms"] == pytest.approx(r["call_walls_ms"][0], abs=1e-3)
        assert r["final_reached"] and r["calls_until_final"] >= 1 and len(r["call_walls_ms"]) == r["calls_until_final"]
        assert set(r["choice"]) == {"call1", "call20", "final"} and set(r["choice"].values()) <= names
        assert r["offline"]["choice"] in names and r["offline"]["seconds"] > 0
        assert r["steady_call_ms"] > 0 and r["device_ms"]["eager"] > 0 and r["device_ms"]["copy"] > 0
        assert set(r["device_ms"]["tunekit"]) == set(r["choice"].values()) | {r["offline"]["choice"]}
        assert all(t > 0 for t in r["device_ms"]["tunekit"].values())
        assert r["device_ms"]["compile"] is None and r["compile_s"] is None and not r["errors"]  # smoke: no compile
        assert r["copy_bytes"] == r["bytes"]  # float32: whole elements
    assert [r["first_in_process"] for r in rows] == [True, False, False, False] * 2
    assert all(r["torch_first_call_ms"] > 0 and r["torch_steady_call_ms"] > 0 for r in rows)
    assert [(f, b["rc"], b["error"]) for f, b in raw["baselines"].items()] == [("silu", 0, None)]
    firsts = [r for r in rows if r["first_in_process"]]  # from one fresh process of torch alone, both states
    assert {r.get("torch_first_from") for r in rows} == {None, "a fresh process"}
    assert firsts[0]["torch_first_call_ms"] == firsts[1]["torch_first_call_ms"]
    md = (tmp_path / "first_use-cpu.md").read_text()
    assert md == render(raw)
    assert md.startswith("# First use: cpu (") and "## Goals" in md and "## silu, empty cache" in md
    assert "## silu, warm cache" in md and "16 MiB copy bandwidth" in md and "| silu | warm | 0 |" in md


# -- the goals, at their limits -------------------------------------------------------------------
def test_first_call_limit_depends_on_the_cache_state():
    assert evaluate(make_row(first_call_ms=500.0))["first_call"] == (0.5, "pass")
    assert evaluate(make_row(first_call_ms=500.01))["first_call"][1] == "fail"
    assert evaluate(make_row(state="warm", first_call_ms=100.0))["first_call"] == (0.1, "pass")
    assert evaluate(make_row(state="warm", first_call_ms=100.01))["first_call"][1] == "fail"
    assert evaluate(make_row(state="warm", first_call_ms=400.0))["first_call"][1] == "fail"


def test_later_calls_that_resume_tuning():
    assert evaluate(make_row(max_later_call_ms=20.0))["resume_call"] == (20.0, "pass")
    assert evaluate(make_row(max_later_call_ms=20.01))["resume_call"][1] == "fail"
    assert evaluate(make_row(calls_until_final=1, call_walls_ms=[5.0], max_later_call_ms=None))["resume_call"] == (
        None, "n/a")  # final on the first call: nothing resumed
    not_final = make_row(calls_until_final=None, final_reached=False, max_later_call_ms=25.0)
    assert evaluate(not_final)["resume_call"][1] == "fail"  # what was seen already misses


def test_tuning_share_of_ten_thousand_calls():
    # overhead 2 x 50.99 - 2 x 0.99 = 100 ms against 100 + 10,000 x 0.99 ms: exactly 1%
    exact = make_row(call_walls_ms=[50.99, 50.99], calls_until_final=2, steady_call_ms=0.99)
    assert tuning_share(exact) == 1.0 and evaluate(exact)["tuning_share"] == (1.0, "pass")
    above = make_row(call_walls_ms=[50.99, 51.0], calls_until_final=2, steady_call_ms=0.99)
    assert evaluate(above)["tuning_share"][1] == "fail"
    # only the calls until final count: 30 + 20 + 20 - 3 x 1 = 67 ms
    row = make_row(call_walls_ms=[30.0, 20.0, 20.0, 99.0], calls_until_final=3, steady_call_ms=1.0)
    assert tuning_share(row) == pytest.approx(100 * 67 / (67 + 10_000))
    assert tuning_share(make_row(call_walls_ms=[0.5, 0.5], calls_until_final=2, steady_call_ms=1.0)) == 0.0  # noise
    open_row = make_row(calls_until_final=None, final_reached=False, steady_call_ms=None)
    assert tuning_share(open_row) is None and evaluate(open_row)["tuning_share"] == (None, "open")


def test_tuning_share_is_net_of_what_torch_eagers_own_first_call_costs():
    # 67 ms of overhead, torch's first call 12 ms beyond its steady 2 ms: 57 ms count as tuning
    row = make_row(call_walls_ms=[30.0, 20.0, 20.0], calls_until_final=3, steady_call_ms=1.0,
                   torch_first_call_ms=12.0, torch_steady_call_ms=2.0)
    assert tuning_share(row) == pytest.approx(100 * 57 / (57 + 10_000))
    assert tuning_share(row, net=False) == pytest.approx(100 * 67 / (67 + 10_000))
    cheaper = make_row(call_walls_ms=[3.0], calls_until_final=1, steady_call_ms=1.0, torch_first_call_ms=175.0,
                       torch_steady_call_ms=0.5)  # torch's first call cost more than tunekit's: nothing to count
    assert tuning_share(cheaper) == 0.0 and tuning_share(cheaper, net=False) == pytest.approx(100 * 2 / 10_002)
    unmeasured = make_row(call_walls_ms=[30.0, 20.0, 20.0], calls_until_final=3, steady_call_ms=1.0,
                          torch_first_call_ms=None)
    assert tuning_share(unmeasured) == tuning_share(row, net=False)  # counted in full


def test_choice_after_twenty_calls_against_offline():
    row = make_row(choice={"call1": "c", "call20": "a", "final": "a"},
                   device_ms=times({"a": 1.02, "b": 1.0, "c": 9.0}))
    assert evaluate(row)["choice_vs_offline"] == (1.02, "pass")  # the choice after call 1 does not count
    row["device_ms"]["tunekit"]["a"] = 1.0201
    assert evaluate(row)["choice_vs_offline"][1] == "fail"
    assert evaluate(make_row(offline=None))["choice_vs_offline"] == (None, "missing")


def test_after_first_use_against_torch():
    row = make_row(device_ms=times({"b": 1.02}, eager=1.0, compile=2.0))
    assert evaluate(row)["vs_eager"] == (1.02, "pass") and evaluate(row)["vs_torch"] == (1.02, "pass")
    row = make_row(device_ms=times({"b": 1.02}, eager=1.1, compile=0.99))
    assert evaluate(row)["vs_eager"][1] == "pass" and evaluate(row)["vs_torch"][1] == "fail"  # compile is faster
    row = make_row(device_ms=times({"b": 1.03}, eager=1.0, compile=None))
    assert evaluate(row)["vs_torch"] == (1.03, "fail")  # eager alone when compile is missing
    lse = make_row(family="logsumexp", op="logsumexp", device_ms=times({"b": 1.0}, eager=2.0))
    assert evaluate(lse)["vs_eager"] == (None, "n/a") and evaluate(lse)["vs_torch"][1] == "pass"


@pytest.mark.parametrize("family,direction,limit", [("gelu", "bwd", 95), ("logsumexp", "fwd", 90),
                                                    ("logsumexp", "bwd", 85)])
def test_copy_medians_at_their_limits(family, direction, limit):
    group = "activations" if family == "gelu" else f"logsumexp {direction}"

    def rows(*pcts):  # the final choice at pct % of the same-size copy: copy time pct, final time 100
        return [make_row(family=family, direction=direction, device_ms=times({"b": 100.0}, copy=float(p)))
                for p in pcts]

    at_limit = summarize(rows(limit, limit, limit - 5))["empty"][f"copy:{group}"]
    assert at_limit == {"n": 3, "median": limit, "verdict": "PASS"}
    assert summarize(rows(limit - 0.01, limit + 5, 1))["empty"][f"copy:{group}"]["verdict"] == "FAIL"
    other = "activations" if group != "activations" else "logsumexp fwd"
    assert summarize(rows(limit))["empty"][f"copy:{other}"] == {"n": 0, "median": None, "verdict": "n/a"}


def test_copy_percent_counts_the_bytes_each_moved():
    row = make_row(bytes=1000, copy_bytes=500, device_ms=times({"b": 2.0}, copy=1.0))
    assert summarize([row])["empty"]["copy:activations"]["median"] == 100.0  # twice the bytes in twice the time


def test_summary_counts_verdicts_per_cache_state():
    rows = [make_row(), make_row(first_call_ms=600.0), make_row(state="warm", first_call_ms=50.0),
            make_row(state="warm", calls_until_final=None, final_reached=False, steady_call_ms=None)]
    s = summarize(rows)
    assert s["empty"]["first_call"] == {"pass": 1, "fail": 1, "open": 0, "missing": 0, "n/a": 0,
                                             "median": pytest.approx(0.325), "verdict": "FAIL"}
    assert s["warm"]["first_call"]["verdict"] == "PASS" and s["warm"]["first_call"]["pass"] == 2
    assert s["warm"]["tuning_share"]["open"] == 1 and s["warm"]["tuning_share"]["verdict"] == "PASS"
    only_open = summarize([make_row(calls_until_final=None, final_reached=False, steady_call_ms=None)])
    assert only_open["empty"]["tuning_share"]["verdict"] == "OPEN" and "warm" not in only_open
    assert summarize([make_row(family="logsumexp")])["empty"]["vs_eager"]["verdict"] == "n/a"


def test_render_of_made_up_rows_marks_misses(tmp_path):
    raw = new_results("made up", None, {"device": "cuda"})
    raw.update(device="Made Up GPU", versions={"torch": "2", "cuda": "12", "triton": "3"}, rows=[
        make_row(first_in_process=True, first_call_ms=2000.0), make_row(state="warm", dim=None)])
    raw["children"] = [{"family": "silu", "state": "empty", "rc": 0, "seconds": 5.0, "ready_s": 2.0,
                        "copy_gbps": 4000.0, "signatures": 1, "error": None}]
    md = render(raw)
    assert "# First use: Made Up GPU" in md and "1 GiB copy bandwidth (read + write, eager): **4000 GB/s**" in md
    assert "2.000 ✗ (process's first)" in md and "processes' first: 2.00; the others: median –" in md
    assert [p.name for p in write_files(raw, tmp_path)] == ["first_use-Made_Up_GPU.json", "first_use-Made_Up_GPU.md"]


# -- the parent's bookkeeping ----------------------------------------------------------------------
def test_a_killed_child_keeps_its_rows_and_names_what_it_missed(tmp_path):
    rows = tmp_path / "rows.jsonl"
    row = make_row(dtype="float32", shape=[8, 8])
    rows.write_text("\n".join([json.dumps({"kind": "meta", "device": "GPU", "copy_gbps": 3.0, "ready_s": 1.0}),
                               json.dumps({"kind": "row", **row}),
                               json.dumps({"kind": "not_measured", "label": "silu bwd 8x8 float32 (OOM)"}),
                               '{"kind": "row", "fam']))  # cut by the kill
    raw = new_results("c", None, {"device": "cuda"})
    expected = ["silu fwd 8x8 float32", "silu bwd 8x8 float32", "silu fwd 16x16 float32"]
    merge_child(raw, "silu", "empty", expected, {"rows": str(rows), "rc": -9, "seconds": 3.0, "tail": ["killed"]})
    assert raw["device"] == "GPU" and raw["rows"] == [row]
    assert raw["not_measured"] == ["empty: silu bwd 8x8 float32 (OOM)", "empty: silu fwd 16x16 float32 (process ended)"]
    assert raw["children"][0]["error"] == "killed" and raw["children"][0]["signatures"] == 1


def test_time_is_shared_by_estimated_work(monkeypatch):
    monkeypatch.setattr(first_use.time, "time", lambda: 1000.0)
    jobs = [("silu", "empty"), ("silu", "warm")]
    empty = first_use.EST_START_S + 12 * first_use.EST_SIGNATURE_S["empty"]
    warm = first_use.EST_START_S + 12 * first_use.EST_SIGNATURE_S["warm"]
    assert first_use._deadline(jobs, {"silu": 12}, 1100.0) == pytest.approx(1000.0 + 100 * empty / (empty + warm))
    assert first_use._deadline(jobs[1:], {"silu": 12}, 1100.0) == 1100.0  # the last child gets what is left
    assert first_use._deadline(jobs, {"silu": 12}, None) is None


def test_the_full_run_covers_every_signature_in_a_cut_friendly_order():
    p = first_use.PRESETS["full"]
    counts = {f: len(first_use.signatures(f, p["dtypes"], p["act_shapes"], p["lse_shapes"])) for f in p["families"]}
    assert counts == {"silu": 12, "gelu": 12, "gelu_tanh": 12, "logsumexp": 54}
    first = [(d.direction, shape, dim, dt) for d, shape, dim, dt in first_use.signatures("logsumexp", p["dtypes"],
                                                                                         p["act_shapes"], p["lse_shapes"])][:6]
    assert first == [(d, (32768, 64), -1, dt) for d in ("fwd", "bwd") for dt in ("float32", "float16", "bfloat16")]


def test_child_environment_has_default_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNEKIT_MAX_TUNING_MS", "5000")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env = first_use.child_environment(tmp_path, "warm")
    assert {k for k in env if k.startswith("TUNEKIT_")} == {"TUNEKIT_CACHE", "TUNEKIT_RESULTS"}
    assert "TRITON_INTERPRET" not in env and env["TUNEKIT_RESULTS"] == str(tmp_path / "warm-results.sqlite")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton") and env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT / "src")


# -- tunekit bench --first-use ----------------------------------------------------------------------
def test_bench_first_use_runs_the_families_of_the_ops(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_run(**options):
        seen.update(options)
        raw = new_results(options["command"], None, {"device": options["device"]})
        raw.update(device="cpu", rows=[make_row()], final=True)
        return raw

    monkeypatch.setattr(first_use, "run", fake_run)
    out = tmp_path / "b"
    assert main(["bench", "--first-use", "--device", "cpu", "--out", str(out), "--ops", "gelu_backward,logsumexp",
                 "--dtypes", "bfloat16", "--repeats", "4"]) == 0
    assert seen["families"] == ["gelu", "gelu_tanh", "logsumexp"] and seen["dtypes"] == ["bfloat16"]
    assert seen["device"] == "cpu" and seen["repeats"] == 4 and not seen["compile"]  # on a CPU: the smoke preset
    assert seen["act_shapes"] == first_use.PRESETS["smoke"]["act_shapes"]
    assert seen["command"].startswith("tunekit bench --first-use --ops gelu_backward,logsumexp")
    assert sorted(p.name for p in out.iterdir()) == ["first_use-cpu.json", "first_use-cpu.md"]
    assert "first_use-cpu.md" in capsys.readouterr().out
