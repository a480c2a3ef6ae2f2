"""Reports from saved results (tunekit.report, tunekit.bench.suites.panels, tunekit.plots), on made-up
results and on the committed H200 results; no measuring here (tests/test_cli_bench.py measures)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunekit.bench.suites import activations, logsumexp
from tunekit.bench.suites.panels import COMPILE, EAGER, SAME_SIZE_COPY, TUNED, panels_from, suite_of
from tunekit.bench.suites.progress import ProgressBar
from tunekit.bench.suites.sizes import layout, parse_sizes
from tunekit.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
H200 = [RESULTS / "activations-NVIDIA_H200.json", RESULTS / "logsumexp-NVIDIA_H200.json"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GBPS = 4000.0  # 4e6 bytes in 1 us is 4000 GB/s, 100% of the copy


def act_row(shape, nbytes, tuned_us=1.0, eager_us=2.0, compile_us=None):
    """One activations row as benchmarks/suites/activations.py writes it, with times in microseconds."""
    return {"shape": list(shape), "bytes": nbytes, "signature": "x", "input_sets": 1, "compile_error": None,
            "candidates": {"torch_silu": {"status": "ok", "reason": "", "time_ms": eager_us * 1e-3, "spread": 0.1},
                           "silu_f16x8": {"status": "ok", "reason": "", "time_ms": tuned_us * 1e-3, "spread": 0.1},
                           "silu_f32x4": {"status": "unsupported", "reason": "dtype", "time_ms": None, "spread": None}},
            "tuned": {"name": "silu_f16x8", "why": "tuned now", "time_ms": tuned_us * 1e-3},
            "best": {"name": "silu_f16x8", "time_ms": tuned_us * 1e-3},
            "head_to_head": {}, "eager_ms": eager_us * 1e-3, "compile_ms": compile_us and compile_us * 1e-3,
            "copy_ms": tuned_us * 1e-3, "copy_bytes": nbytes}


def synthetic_activations():
    rows = [act_row((2048, 1024), 8_000_000, 2.0, 4.0, 2.5), act_row((1024, 1024), 4_000_000, 1.0, 2.0)]
    return {"device": "Made-up GPU", "date": "2026-01-01 00:00:00", "versions": {"torch": "t", "cuda": "c", "triton": "x"},
            "args": {"repeats": 5, "device": "cuda"}, "copy_gbps_start": GBPS, "copy_gbps_end": GBPS, "elapsed_s": 1.0,
            "skipped": {}, "results": {"silu fwd, float16": {"case": "silu", "op": "silu", "dtype": "float16",
                                                            "rows": rows, "seconds": 1.0}}}


def synthetic_logsumexp():
    def row(direction, shape, dim):
        return {"direction": direction, "shape": list(shape), "dim": dim, "dtype": "bfloat16", "signature": "x",
                "input_bytes": 4_000_000, "bytes": 4_000_000, "tuned": {"name": "rows_bf16"}, "tuned_ms": 2e-3,
                "eager_ms": 1e-2, "compile_ms": None, "errors": {}, "input_sets": 1,
                "candidates": {"torch_logsumexp": {"status": "ok", "time_ms": 1e-2},
                               "rows_bf16": {"status": "ok", "time_ms": 2e-3},
                               "columns_bf16": {"status": "unsupported", "reason": "rows"}}}
    return {"device": "Made-up GPU", "date": "2026-01-01 00:00:00", "versions": {"torch": "t", "cuda": "c", "triton": "x"},
            "command": "python benchmarks/suites/logsumexp.py", "args": {"repeats": 3, "device": "cuda"},
            "copy_gbps_start": GBPS, "not_measured": [], "elapsed_s": 1.0, "copy_gbps_end": GBPS, "final": True,
            "rows": [row("fwd", (4096, 256), -1), row("bwd", (4096, 256), -1), row("fwd", (256, 4096), 0)]}


def test_panels_of_an_activations_file():
    (panel,) = panels_from(synthetic_activations())
    assert (panel.suite, panel.key, panel.title, panel.device) == ("activations", "silu-float16", "silu forward, float16",
                                                                   "Made-up GPU")
    assert [p.label for p in panel.points] == ["1024x1024", "2048x1024"]  # sorted by size
    small = panel.points[0]
    assert small.gbps[TUNED] == pytest.approx(4000.0) and small.gbps[EAGER] == pytest.approx(2000.0)
    assert small.gbps[SAME_SIZE_COPY] == pytest.approx(4000.0) and COMPILE not in small.gbps
    assert panel.points[1].gbps[COMPILE] == pytest.approx(3200.0)
    assert panel.candidates() == ["torch_silu", "silu_f16x8"]  # unsupported everywhere: no line
    assert panel.tuned_counts() == {"silu_f16x8": 2}
    assert "CUDA-graph replay" in panel.timing and "median of 5" in panel.timing


def test_panels_of_a_logsumexp_file():
    panels = {p.key: p for p in panels_from(synthetic_logsumexp())}
    assert set(panels) == {"fwd-bfloat16", "bwd-bfloat16"}
    fwd = panels["fwd-bfloat16"]
    assert [p.label for p in fwd.points] == ["4096x256 dim -1", "256x4096 dim 0"]  # the run's order
    assert fwd.points[0].gbps[TUNED] == pytest.approx(2000.0) and fwd.points[0].gbps[EAGER] == pytest.approx(400.0)
    assert fwd.what == "logsumexp forward"


def test_suite_of_tells_files_apart():
    assert suite_of(synthetic_activations()) == "activations"
    assert suite_of(synthetic_logsumexp()) == "logsumexp"
    assert suite_of([{"op": "silu", "candidates": []}]) == "explore"
    with pytest.raises(ValueError, match="not a tunekit results file"):
        suite_of({"something": 1})


def test_committed_results_render_to_the_committed_markdown():
    """The package's renderers read the scripts' JSON and write exactly the Markdown the scripts wrote."""
    lse = json.loads(H200[1].read_text())
    meta = {k: v for k, v in lse.items() if k not in ("final", "rows")}
    assert logsumexp.render(meta, lse["rows"]) == H200[1].with_suffix(".md").read_text()
    act = json.loads(H200[0].read_text())
    new, old = activations.render(act).splitlines(), H200[0].with_suffix(".md").read_text().splitlines()
    if "command" not in act:  # files written before the command was recorded: that line differs
        new, old = new[:2] + new[3:], old[:2] + old[3:]
    assert new == old


def test_committed_results_give_a_panel_per_case_and_dtype():
    panels = panels_from(json.loads(H200[0].read_text()))
    assert len(panels) == 18 and all(len(p.points) == 10 and p.device == "NVIDIA H200" for p in panels)
    assert all(TUNED in pt.gbps and EAGER in pt.gbps and SAME_SIZE_COPY in pt.gbps for p in panels for pt in p.points)
    lse = panels_from(json.loads(H200[1].read_text()))
    assert sorted(p.key for p in lse) == sorted(f"{d}-{t}" for d in ("fwd", "bwd") for t in ("float32", "float16", "bfloat16"))


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC


def test_report_from_synthetic_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from PIL import Image

    (tmp_path / "a.json").write_text(json.dumps(synthetic_activations()))
    (tmp_path / "l.json").write_text(json.dumps(synthetic_logsumexp()))
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "a.json"), str(tmp_path / "l.json"), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["activations-overview-fwd.png", "activations-silu-float16.png", "activations.md",
                            "logsumexp-overview.png", "logsumexp-fwd-bfloat16.png", "logsumexp-bwd-bfloat16.png",
                            "logsumexp.md", "report.md"])
    for png in out.glob("*.png"):
        assert is_png(png)
        with Image.open(png) as im:
            im.verify()
    report = (out / "report.md").read_text()
    assert "Made-up GPU" in report and "**4000 GB/s**" in report and "![silu forward, float16](activations-silu-float16.png)" in report
    assert "CPU timings" not in report and "### Targets" in report
    assert (out / "logsumexp.md").read_text() == logsumexp.render(
        {k: v for k, v in synthetic_logsumexp().items() if k not in ("final", "rows")}, synthetic_logsumexp()["rows"])
    printed = capsys.readouterr().out.split()
    assert str(out / "report.md") in printed


def test_report_of_the_committed_h200_results(tmp_path):
    """The README's plots: drawn from the committed JSON, small files."""
    pytest.importorskip("matplotlib")
    code = main(["report", *map(str, H200), "--out", str(tmp_path), "--no-markdown", "--prefix", "h200-",
                 "--only", "*overview*", "activations-silu-float16", "logsumexp-fwd-bfloat16"])
    assert code == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["h200-activations-overview-bwd.png", "h200-activations-overview-fwd.png",
                     "h200-activations-silu-float16.png", "h200-logsumexp-fwd-bfloat16.png", "h200-logsumexp-overview.png"]
    for png in tmp_path.iterdir():
        assert is_png(png) and png.stat().st_size < 200_000


def test_python_dash_m_tunekit_report(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "l.json").write_text(json.dumps(synthetic_logsumexp()))
    out = subprocess.run([sys.executable, "-m", "tunekit.bench.report", str(tmp_path / "l.json"), "--out", str(tmp_path / "r"),
                          "--only", "logsumexp-overview"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert is_png(tmp_path / "r" / "logsumexp-overview.png") and (tmp_path / "r" / "report.md").exists()


def test_report_without_matplotlib_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    (tmp_path / "a.json").write_text(json.dumps(synthetic_activations()))
    assert main(["report", str(tmp_path / "a.json"), "--out", str(tmp_path / "r")]) == 2
    assert "pip install 'tunekit[plot]'" in capsys.readouterr().err


def test_report_of_a_file_that_is_not_results(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    assert main(["report", str(tmp_path / "x.json"), "--out", str(tmp_path / "r")]) == 1
    assert "not a tunekit results file" in capsys.readouterr().err


def test_sizes_sweeps_and_layouts():
    assert parse_sizes("1K..8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("2^16..2^20:4,3000") == [65536, 262144, 1048576, 3000]
    assert parse_sizes("1M") == [2**20]
    for bad in ("", "abc", "8K..1K:1", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_sizes(bad)
    assert layout([4096, 8192], 1024) == [(4, 1024), (8, 1024)]
    assert layout([100], None) == [(100,)]
    with pytest.raises(ValueError, match="not a multiple of the row length 1024"):
        layout([1000], 1024)


def test_progress_bar_prints_lines_off_a_terminal(tmp_path):
    log = tmp_path / "log.txt"
    with log.open("w") as stream:
        bar = ProgressBar(2, stream=stream)
        bar.note("copy 10 GB/s")
        bar.step("silu float32 32x32: tuned a")
        bar.step("silu float32 64x64: tuned b")
        bar.close()
    lines = log.read_text().splitlines()
    assert lines[0] == "copy 10 GB/s" and "1/2" in lines[1] and "2/2" in lines[2] and "#" * 24 in lines[2]
    assert "\r" not in log.read_text()
