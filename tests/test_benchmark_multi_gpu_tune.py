"""benchmarks/suites/multi_gpu_tune.py: the workload, the verdict and the report on made-up numbers, and a
``--smoke`` run end to end on the CPU (real processes, real stores)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "suites" / "multi_gpu_tune.py"
spec = importlib.util.spec_from_file_location("bench_multi_gpu_tune", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

META = {"device": "NVIDIA H200 + NVIDIA H200", "date": "2026-01-01 00:00:00", "count": 40, "budget_ms": 50.0,
        "torch": "x", "command": "python benchmarks/suites/multi_gpu_tune.py", "smoke": False, "workload": "ops"}


def row(run, call_s, present=40, untuned=0):
    return {"run": run, "devices": "cuda:0 NVIDIA H200", "workers": 1, "call_s": call_s, "process_s": call_s + 3,
            "tuned": present, "incomplete": 0, "failed": 0, "present": present, "untuned": untuned,
            "split": "cuda:0 (this process) 21, cuda:1 (spawned) 19"}


def test_the_gpu_workload_has_40_distinct_interleaved_signatures():
    calls = bench.workload(40, smoke=False)
    assert len(calls) == 40 == len({(n, s, d, tuple(sorted(a.items()))) for n, s, d, a in calls})
    assert {c[0] for c in calls} == {"silu", "gelu", "logsumexp", "silu_backward", "gelu_backward",
                                     "logsumexp_backward"}
    assert {c[2] for c in calls} == {torch.float32, torch.float16, torch.bfloat16}
    with pytest.raises(SystemExit, match="only"):
        bench.workload(500, smoke=False)


def test_verdict_and_report():
    assert bench.verdict(10.0, 5.9, smoke=False, complete=True, target=0.6) == (pytest.approx(0.59), "PASS")
    assert bench.verdict(10.0, 6.1, smoke=False, complete=True, target=0.6)[1] == "FAIL"
    assert bench.verdict(10.0, 1.0, smoke=False, complete=False, target=0.6)[1] == "FAIL (entries missing)"
    assert bench.verdict(10.0, 20.0, smoke=True, complete=True, target=0.6)[1].startswith("n/a")
    text = bench.render(META, [row("one GPU", 10.0), row("all GPUs", 5.5)])
    assert "| one GPU | cuda:0 NVIDIA H200 | 1 | 10.00 | 13.00 | 40 | 0 | 0 | 40/40 |" in text
    assert "in call: **0.55x** (target <= 0.6x): **PASS**" in text
    gemm = bench.render({**META, "workload": "llama-gemm"}, [row("one GPU", 10.0), row("all GPUs", 5.7)])
    assert "(llama-gemm)" in gemm and "in call: **0.57x** (target <= 0.55x): **FAIL**" in gemm
    missing = bench.render(META, [row("one GPU", 10.0), row("all GPUs", 5.5, present=39, untuned=1)])
    assert "39/40 (1 left untuned)" in missing and "**FAIL (entries missing)**" in missing


def test_smoke_run_tunes_every_recorded_signature_in_both_configurations(tmp_path, capsys):
    assert bench.main(["--smoke", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    md = (tmp_path / "out" / "multi_gpu_tune-smoke-cpu.md").read_text()
    assert md == printed
    assert "| one CPU process | cpu | 1 |" in md and "| 2 CPU processes | cpu | 2 |" in md
    assert md.count("| 6/6 |") == 2 and "n/a (smoke run on the CPU)" in md
    data = json.loads((tmp_path / "out" / "multi_gpu_tune-smoke-cpu.json").read_text())
    for run in ("single", "parallel"):
        (result,) = data["runs"][run]
        assert result["present"] == 6 and result["untuned"] == 0 and result["summary"]["failed"] == []


def test_the_model_workload_records_the_llama_steps_gemm_signatures(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(PATH.parent))
    import model_gemm_workload

    keys = model_gemm_workload.record(str(tmp_path / "r.sqlite"), torch.device("cpu"), smoke=True)
    # 2 layers of q/k/v/o, gate/up/down and the LM head: forward products, input and weight gradients
    assert len(keys) == len(set(keys)) >= 10
    assert {op for op, _, _ in keys} <= set(model_gemm_workload.GEMM_OPS)
    assert any("N=128 K=64" in signature for _, signature, _ in keys)  # the LM head (vocab 128)


def test_count_is_refused_for_the_model_workload(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--workload", "llama-gemm", "--count", "5"])
    assert "--count applies to --workload ops" in capsys.readouterr().err
