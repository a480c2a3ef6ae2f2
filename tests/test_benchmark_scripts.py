"""The benchmark scripts that no suite test imports start on a CPU machine (``--help``): their imports
and argument parsers hold. ``read_ceiling.py`` and ``copy_ceiling.py`` imported a module that had
moved (``activations``'s ``head_to_head``, now in ``tunekit.bench.suites.common``) and failed on the
GPU before measuring anything."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["benchmarks/ceilings/copy_ceiling.py", "benchmarks/ceilings/read_ceiling.py",
                                    "benchmarks/pretune.py"])
def test_script_starts(script):
    done = subprocess.run([sys.executable, "-W", "error::SyntaxWarning", str(ROOT / script), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_pretune_only_tunes_what_it_names_and_keeps_the_rest(tmp_path):
    """``--only REGEX`` tunes the matching signatures and keeps every other entry of the file: two runs naming
    disjoint decode shapes leave both runs' entries (CPU: the script's own device; small decode GEMMs)."""
    import csv

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith("TUNEKIT_")}

    def run(regex):  # the Triton candidates refuse the CPU without the interpreter: a quick, complete entry
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks/pretune.py"), "--device", "cpu", "--families", "gemm",
                               "--only", regex, "--out", str(tmp_path), "--time-limit", "60"],
                              capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        (table,) = tmp_path.glob("*.csv")
        with open(table, newline="") as f:
            return {row["signature"] for row in csv.DictReader(f)}

    first = run(r"qo\.M1 ")
    assert len(first) == 1 and all(" M=1 " in s for s in first)
    both = run(r"up\.M1 ")
    assert first < both and len(both) == 2


@pytest.mark.parametrize("activation", ["none", "gelu_tanh"])
def test_pretunes_fused_linear_signatures_are_those_of_the_public_calls(tmp_path, activation):
    """The shipped entries pretune.py makes for the GEMM suite's fused shapes are keyed by the signatures a
    user's ``tunekit.linear(x, w, b)`` / ``linear_act(x, w, b, "gelu_tanh")`` meets (a smaller shape of the
    same form; the default runs, tuning off, the signature recorded)."""
    import importlib.util

    import torch

    import tunekit
    from tunekit.tunable.results import ResultsStore

    spec = importlib.util.spec_from_file_location("pretune_script", ROOT / "benchmarks" / "pretune.py")
    pretune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pretune)
    labels = [label for label, op, _ in pretune.work(["gemm"], torch.device("cpu")) if op == "addmm"]
    assert f"addmm llama3-8b.up.M4096 bias {activation} bfloat16" in labels
    gemm = pretune._gemm_suite()
    shape = gemm.Shape("small.linear", 16, 24, 32)
    made = pretune._linear_example(gemm, shape, activation, torch.device("cpu"))
    x, w, b = made.a, made.b.t(), made.c
    with tunekit.tuning(tuning=False, record_untuned=True, results=tmp_path / "r.sqlite"):
        tunekit.linear(x, w, b) if activation == "none" else tunekit.linear_act(x, w, b, activation)
    (record,) = ResultsStore(tmp_path / "r.sqlite").untuned("addmm")
    assert record.signature == made.signature()


def test_a_bundle_rewritten_without_quack_carries_the_quack_kernels_it_replaces(tmp_path):
    """pretune.py's bundle step on a machine without quack-kernels: the quack builds of the bundle being
    replaced go into the fresh quack cache folder (whole folders, every file), nothing else of it."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("pretune_script", ROOT / "benchmarks" / "pretune.py")
    pretune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pretune)
    old = tmp_path / "GPU.kernels.zip"
    with zipfile.ZipFile(old, "w") as z:
        for key in ("k1", "k2"):
            for name in ("kernel.so", "recipe.json", "libs.json"):
                z.writestr(f"quack/{key}/{name}", f"{key}/{name}")
        z.writestr("cubin/x.cubin", "cubin")
        z.writestr("triton/abc/t.json", "{}")
    fresh = tmp_path / "quack"
    assert pretune._carry_quack_kernels(old, fresh) == 2
    assert sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file()) == [
        f"{k}/{n}" for k in ("k1", "k2") for n in ("kernel.so", "libs.json", "recipe.json")]
    assert (fresh / "k2" / "recipe.json").read_text() == "k2/recipe.json"
    assert pretune._carry_quack_kernels(tmp_path / "none.zip", tmp_path / "other") == 0
    bad = tmp_path / "bad.kernels.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("quack/../escaped/kernel.so", "x")  # would land in tmp_path / "escaped"
    with pytest.raises(SystemExit, match="outside its folder"):
        pretune._carry_quack_kernels(bad, tmp_path / "third")
    assert not (tmp_path / "escaped").exists()
