"""The tunekit command, run in-process (and once as a real process)."""

import csv
import json
import subprocess
import sys

import pytest

from tunekit.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ops_lists_every_op_and_candidate(capsys):
    code, out, _ = run(capsys, "ops", "--device", "cpu")
    assert code == 0
    assert "torch_silu" in out and "torch_x_sigmoid" in out and "default" in out
    code, out, _ = run(capsys, "ops", "--device", "cpu", "--json")
    data = json.loads(out)
    silu = next(o for o in data["ops"] if o["op"] == "silu")
    names = {c["candidate"] for c in silu["candidates"]}
    assert {"torch_silu", "torch_x_sigmoid", "silu_f16x8_pack"} <= names
    gpu_only = next(c for c in silu["candidates"] if c["candidate"] == "silu_f16x8_pack")
    assert gpu_only["unsupported"]["float16"] == "needs a CUDA device"


def test_explore_prints_the_honest_table(capsys):
    code, out, _ = run(capsys, "explore", "silu", "--shape", "64x33", "--dtype", "float16", "--device", "cpu",
                       "--repeats", "3")
    assert code == 0
    assert "copy bandwidth" in out and "% copy" in out and "* tuned choice:" in out
    assert "torch_x_sigmoid" in out


def test_explore_json(capsys):
    code, out, _ = run(capsys, "explore", "silu", "--shape", "100", "--device", "cpu", "--repeats", "3", "--json")
    data = json.loads(out)
    assert data["signature"] == "x=f32[n=100]@0 out=new cpu"
    rows = {r["candidate"]: r for r in data["candidates"]}
    assert rows["torch_silu"]["default"] and rows["torch_silu"]["vs_default"] == 1.0
    assert sum(r["tuned_choice"] for r in rows.values()) == 1
    for name in ("torch_silu", "torch_x_sigmoid"):
        r = rows[name]
        assert r["status"] == "ok" and r["time_ms"] > 0 and r["gbps"] > 0 and len(r["first_values"]) == 2
    assert rows["silu_f32x4"]["status"] == "unsupported" and rows["silu_f32x4"]["reason"] == "needs a CUDA device"


def test_explore_on_cuda_without_a_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["explore", "silu", "--shape", "8", "--device", "cuda"])
    code, out, _ = run(capsys, "ops")
    assert "no CUDA device is present" in out and "GPU candidates are skipped" in out


def test_results_show_export_clear_import(capsys, tmp_path):
    import torch
    import tunekit

    tunekit.silu(torch.randn(10))
    tunekit.silu(torch.randn(20))
    code, out, _ = run(capsys, "results", "show")
    assert code == 0 and "2 entries" in out and "x=f32[n=10]@0" in out
    target = tmp_path / "out.csv"
    assert run(capsys, "results", "export", str(target))[0] == 0
    rows = list(csv.DictReader(target.open()))
    assert len(rows) == 2
    code, out, _ = run(capsys, "results", "clear")
    assert "cleared 2" in out
    assert "0 entries" in run(capsys, "results", "show")[1]
    code, out, _ = run(capsys, "results", "import", str(target))
    assert code == 0 and "imported 2" in out
    shown = json.loads(run(capsys, "results", "show", "--json")[1])
    assert sorted(e["signature"] for e in shown) == sorted(r["signature"] for r in rows)


def test_results_import_of_a_bad_file_fails_cleanly(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("op,signature\nsilu,x\n")
    code, _, err = run(capsys, "results", "import", str(bad))
    assert code == 1 and "nothing imported" in err
    code, _, err = run(capsys, "results", "import", str(tmp_path / "missing.csv"))
    assert code == 1 and "cannot read" in err


def test_results_option_picks_the_file(capsys, tmp_path):
    target = tmp_path / "elsewhere.sqlite"
    code, out, _ = run(capsys, "--results", str(target), "results", "show")
    assert code == 0 and str(target) in out


def test_python_dash_m_and_version():
    out = subprocess.run([sys.executable, "-m", "tunekit", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("tunekit ")


def test_tune_finishes_recorded_signatures_and_a_second_run_has_nothing_to_do(capsys, tmp_path):
    import torch
    import tunekit

    with tunekit.tuning(tuning=False, record_untuned=True):
        tunekit.silu(torch.randn(33))
        tunekit.logsumexp(torch.randn(5, 7), 1)
    assert {u.op for u in tunekit.results_store().untuned()} == {"silu", "logsumexp"}
    code, out, err = run(capsys, "tune", "--max-tuning-ms", "2000")
    assert code == 0 and "2 tuned" in out, (out, err)
    assert tunekit.results_store().untuned() == []
    assert {e.op for e in tunekit.results_store().entries()} == {"silu", "logsumexp"}
    code, out, _ = run(capsys, "tune")
    assert code == 0 and "0 tuned" in out


def test_untuned_export_then_tune_from_the_file(capsys, tmp_path):
    import torch
    import tunekit

    with tunekit.tuning(tuning=False, record_untuned=True):
        tunekit.gelu(torch.randn(21), approximate="tanh")
    target = tmp_path / "untuned.jsonl"
    code, out, _ = run(capsys, "results", "export-untuned", str(target))
    assert code == 0 and "1 untuned signature" in out and len(target.read_text().splitlines()) == 1
    elsewhere = tmp_path / "other.sqlite"
    code, out, _ = run(capsys, "--results", str(elsewhere), "tune", "--file", str(target))
    assert code == 0 and "1 tuned" in out
    assert [e.op for e in tunekit.results_store(str(elsewhere)).entries()] == ["gelu"]


def test_import_reports_rows_whose_validators_do_not_match(capsys, tmp_path):
    import torch
    import tunekit

    tunekit.silu(torch.randn(12))
    target = tmp_path / "out.csv"
    assert run(capsys, "results", "export", str(target))[0] == 0
    rows = list(csv.DictReader(target.open()))
    rows[0]["validators"] = json.dumps({**json.loads(rows[0]["validators"]), "torch": "0.0-elsewhere"})  # another torch
    with target.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    run(capsys, "results", "clear")
    code, out, _ = run(capsys, "results", "import", str(target))
    assert code == 0 and "imported 0" in out and "rejected" in out
    code, out, _ = run(capsys, "results", "import", "--all", str(target))
    assert code == 0 and "imported 1" in out
