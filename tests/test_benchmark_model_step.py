"""benchmarks/suites/model_step.py end to end on the CPU (``--smoke``: tiny models, a few steps), and its clear
refusals without transformers or CUDA."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "suites" / "model_step.py"
spec = importlib.util.spec_from_file_location("bench_model_step", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_smoke_run_reports_both_models_through_tunekit(tmp_path, capsys):
    pytest.importorskip("transformers")
    silu, gelu, lse = F.silu, F.gelu, torch.logsumexp
    assert bench.main(["--smoke", "--out", str(tmp_path), "--results", str(tmp_path / "r.sqlite")]) == 0
    assert F.silu is silu and F.gelu is gelu and torch.logsumexp is lse  # the benchmark's patches are undone
    printed = capsys.readouterr().out
    (md,) = tmp_path.glob("model_step-smoke-cpu.md")
    assert md.read_text().strip() == printed.strip()
    assert "| model | torch ms | tunekit.patch ms |" in printed
    rows = {r["model"]: r for r in json.loads((tmp_path / "model_step-smoke-cpu.json").read_text())["rows"]}
    assert set(rows) == {"llama", "gpt2"}
    layers = bench.SMOKE["layers"]
    assert rows["llama"]["tunekit_calls_per_step"]["silu"] == layers
    assert rows["gpt2"]["tunekit_calls_per_step"]["gelu"] == layers
    # the backward: torch's own node (ops/_shared/grad_call.py, built by conftest): tunekit's backward never runs
    assert rows["llama"]["tunekit_calls_per_step"]["silu_backward"] == 0
    assert rows["gpt2"]["tunekit_calls_per_step"]["gelu_backward"] == 0
    for r in rows.values():
        assert r["loss_diff"] < 1e-5 and r["steps_timed"] > 0
        assert all(t > 0 for t in r["median_ms"].values())
    assert "Tuned choices:" in printed and "- silu `" in printed and "- gelu `" in printed
    assert "- gelu_backward `" not in printed  # never called, never tuned


def test_without_transformers_it_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    assert bench.main(["--smoke"]) == 2
    assert "transformers is not installed" in capsys.readouterr().err


def test_without_cuda_it_refuses_a_gpu_run(monkeypatch, capsys, tmp_path):
    pytest.importorskip("transformers")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
