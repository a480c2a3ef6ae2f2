"""benchmarks/suites/gemm.py: its CPU-runnable parts. ``--smoke`` end to end (two tiny shapes, Triton's
interpreter, files written), the shape selection, the goals table, and the refusal without a GPU."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "suites" / "gemm.py"
spec = importlib.util.spec_from_file_location("bench_gemm", PATH)
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_gemm"] = bench  # its dataclasses look their module up
spec.loader.exec_module(bench)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_smoke_run_writes_the_report(tmp_path, capsys):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    md = tmp_path / "gemm-smoke-cpu.md"
    assert md.read_text().strip() == printed.strip()
    assert "## Goals" in printed and "| smoke.linear | 12x24x40 |" in printed and "## Fused epilogue" in printed
    raw = json.loads((tmp_path / "gemm-smoke-cpu.json").read_text())
    assert raw["device"] == "cpu" and raw["dtype"] == "float32" and len(raw["rows"]) == 2
    for row in raw["rows"]:
        assert row["check"] == "ok"
        assert {"cublas", "tunekit"} <= set(row["times_ms"]) and all(t > 0 for t in row["times_ms"].values())
        assert row["tuned"]["choice"] and row["first_use"]["calls"] >= 1 and row["tune_warm_s"] > 0
        assert row["signature"].startswith("mm f32 M=")
    linear = raw["rows"][0]
    assert "autotune" in linear["times_ms"] and linear["autotune_s"] > 0  # torch.compile's column ran
    assert linear["fused"]["ratio"] > 0


def test_shape_selection():
    default = bench.select("default")
    names = [s.name for s in default]
    assert "llama3-8b.up.M16" in names and "odd4097x4095x4096" in names and "square8192" in names
    assert sum(s.autotune for s in default) == 4 and sum(s.fused for s in default) == 2
    everything = bench.select("all")
    assert len(everything) == 2 * 4 * 5 + 8
    forms = {s.name: s.form for s in everything}
    assert forms["odd4097x4095x4096"] == forms["odd777x1555x333"] == "linear"  # the F.linear(x, w)
    assert forms["odd4097x4095x4096.mm"] == forms["odd777x1555x333.mm"] == "mm"
    assert {s.M for s in everything if s.name.startswith("llama3-70b.down")} == {1, 16, 128, 4096, 8192}
    picked = bench.select("llama3-70b.kv.M128,100x200x300")
    assert [(s.M, s.N, s.K, s.form) for s in picked] == [(128, 1024, 8192, "linear"), (100, 200, 300, "mm")]
    with pytest.raises(Exception, match="unknown shape"):
        bench.select("nope")


def _row(name, M, N, K, cublas, tunekit, first_s=1.0, warm_s=0.1, **extra):
    return {"shape": name, "M": M, "N": N, "K": K, "times_ms": {"cublas": cublas, "tunekit": tunekit},
            "first_use": {"seconds": first_s}, "tuned": {"seconds": 2.0}, "tune_warm_s": warm_s, **extra}


def test_goals_table_passes_and_misses():
    rows = [_row("odd4097x4095x4096", 4097, 4095, 4096, 1.0, 0.19), _row("odd777x1555x333", 777, 1555, 333, 1.0, 0.7),
            _row("a", 4096, 4096, 4096, 1.0, 0.9), _row("d", 1, 4096, 4096, 1.0, 0.88, autotune_s=5.0)]
    text = "\n".join(bench.goals(rows))
    assert "| odd4097x4095x4096 >= 5.0x cuBLAS | 5.26x | PASS |" in text
    assert "| odd777x1555x333 >= 1.4x cuBLAS | 1.43x | PASS |" in text
    assert "never slower than cuBLAS by > 2% | worst 0.900x" in text
    assert "| tuning below max-autotune's compile time | 1 of 1 shapes | PASS |" in text
    rows.append(_row("slow", 64, 64, 64, 1.0, 1.05, first_s=4.0))
    text = "\n".join(bench.goals(rows))
    assert "worst 1.050x the time (slow) | MISS" in text and "worst 4.00 s | MISS" in text


def test_peak_is_known_only_for_the_gpus_it_names():
    assert bench.peak_tflops(torch.device("cpu"), torch.bfloat16) is None


def test_without_cuda_it_refuses_a_gpu_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
