"""``tunekit bench --quick`` and ``tunekit explore --plot`` end to end on the CPU (what CI can run), and
the benchmark scripts, which are thin wrappers over the same package code."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tunekit.bench.suites import activations, logsumexp
from tunekit.cli import main
from tunekit.bench.report import BENCH_OPS

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def no_triton_interpreter(monkeypatch):
    """Without a GPU, conftest lets Triton kernels run in its interpreter; a benchmark of them there
    takes minutes and measures nothing useful, so here they are unsupported, as on a plain CPU box."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", ROOT / "benchmarks" / "suites" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_quick_on_the_cpu(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from PIL import Image

    out = tmp_path / "bench"
    code = main(["bench", "--quick", "--device", "cpu", "--out", str(out), "--ops", "silu", "gelu_backward,logsumexp",
                 "--dtypes", "float32,bfloat16"])
    assert code == 0
    captured = capsys.readouterr()
    total = 2 * (1 + 2) * len(activations.QUICK_SHAPES) + 2 * len(logsumexp.QUICK_SHAPES)
    assert f"{total}/{total}" in captured.err  # the progress bar got to the end
    assert "report.md" in captured.out
    report = (out / "report.md").read_text()
    assert "# tunekit benchmark report: cpu" in report and "**CPU timings.**" in report
    assert "Copy bandwidth (256 MiB, read + write, measured in the same run): **" in report
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"activations-overview-fwd.png", "activations-overview-bwd.png", "logsumexp-overview.png",
                    "activations-silu-float32.png", "activations-silu-bfloat16.png",
                    "activations-gelu_bwd-float32.png", "activations-gelu_bwd-bfloat16.png",
                    "activations-gelu_tanh_bwd-float32.png", "activations-gelu_tanh_bwd-bfloat16.png",
                    "logsumexp-fwd-float32.png", "logsumexp-fwd-bfloat16.png"}
    for name in pngs:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC and f"]({name})" in report
        with Image.open(out / name) as im:
            im.verify()
    raw = json.loads((out / "activations.json").read_text())
    assert raw["device"] == "cpu" and raw["timing"] == "host timer" and raw["copy_gbps_start"] > 0
    assert {e["case"] for e in raw["results"].values()} == {"silu", "gelu_bwd", "gelu_tanh_bwd"}
    row = raw["results"]["silu fwd, float32"]["rows"][0]
    assert row["tuned"]["time_ms"] > 0 and row["eager_ms"] > 0 and row["compile_ms"] is None  # --quick: no compile
    lse = json.loads((out / "logsumexp.json").read_text())
    assert {r["direction"] for r in lse["rows"]} == {"fwd"} and lse["final"]
    assert (out / "activations.md").read_text() == activations.render(raw)
    assert "256 MiB copy bandwidth" in (out / "logsumexp.md").read_text()


def test_bench_without_matplotlib_stops_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    assert main(["bench", "--quick", "--device", "cpu", "--out", str(tmp_path / "b")]) == 2
    assert "pip install 'tunekit[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_bench_no_plots_needs_no_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "b"
    assert main(["bench", "--quick", "--device", "cpu", "--out", str(out), "--ops", "silu", "--dtypes", "float32",
                 "--no-plots"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["activations.json", "activations.md", "report.md"]


def test_bench_ops_are_the_registered_ops():
    assert set(BENCH_OPS) == {"silu", "silu_backward", "gelu", "gelu_backward", "logsumexp", "logsumexp_backward"}
    with pytest.raises(SystemExit):
        main(["bench", "--ops", "softmax"])


def test_explore_plot_of_a_size_sweep(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "silu.png"
    code = main(["explore", "silu", "--device", "cpu", "--sizes", "1K..16K:4", "--repeats", "3", "--plot", str(png)])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("* tuned choice:") == 3 and "silu 1024 float32" in out and "silu 16384 float32" in out
    assert f"plot: {png}" in out and png.read_bytes()[:8] == PNG_MAGIC


def test_explore_several_shapes_json_and_its_report(tmp_path, capsys):
    code = main(["explore", "logsumexp", "--device", "cpu", "--shape", "1x256", "--sizes", "1K,4K", "--repeats", "3",
                 "--json"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["shape"] for r in results] == [[4, 256], [16, 256]] and all(r["repeats"] == 3 for r in results)
    pytest.importorskip("matplotlib")
    (tmp_path / "e.json").write_text(json.dumps(results))
    assert main(["report", str(tmp_path / "e.json"), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "explore-logsumexp-float32.png").read_bytes()[:8] == PNG_MAGIC
    assert "`tunekit explore` on **device: cpu" in (tmp_path / "r" / "report.md").read_text()


def test_explore_sizes_must_fit_the_rows():
    with pytest.raises(SystemExit, match="not a multiple of the row length 256"):
        main(["explore", "logsumexp", "--device", "cpu", "--shape", "1x256", "--sizes", "1000"])
    with pytest.raises(SystemExit, match="at most one --shape"):
        main(["explore", "silu", "--device", "cpu", "--shape", "8", "--shape", "16", "--sizes", "1K"])


def test_explore_single_shape_json_is_unchanged(capsys):
    assert main(["explore", "silu", "--shape", "100", "--device", "cpu", "--repeats", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert isinstance(result, dict) and result["shape"] == [100]


def test_activations_script_writes_its_files(tmp_path):
    script = load_script("activations")
    assert script.main(["--device", "cpu", "--shapes", "32x32,64x64", "--cases", "silu,gelu_bwd", "--dtypes", "float32",
                        "--no-compile", "--repeats", "3", "--out", str(tmp_path)]) == 0
    raw = json.loads((tmp_path / "activations-cpu.json").read_text())
    assert list(raw)[:6] == ["device", "date", "versions", "args", "command", "timing"]
    assert raw["args"]["cases"] == ["silu", "gelu_bwd"] and raw["args"]["out"] == str(tmp_path)
    assert list(raw["results"]) == ["silu fwd, float32", "gelu_bwd bwd, float32"]
    text = (tmp_path / "activations-cpu.md").read_text()
    assert text == script.render(raw) and "`python benchmarks/suites/activations.py --device cpu" in text


def test_logsumexp_script_writes_its_files(tmp_path, capsys):
    script = load_script("logsumexp")
    assert script.main(["--device", "cpu", "--shapes", "64x64,8x4x16:1", "--dtypes", "float32", "--no-compile",
                        "--repeats", "3", "--out", str(tmp_path)]) == 0
    raw = json.loads((tmp_path / "logsumexp-cpu.json").read_text())
    assert raw["final"] and len(raw["rows"]) == 4 and raw["args"]["shapes"] == [[[64, 64], -1], [[8, 4, 16], 1]]
    text = (tmp_path / "logsumexp-cpu.md").read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert text == script.render({k: v for k, v in raw.items() if k not in ("final", "rows")}, raw["rows"])
