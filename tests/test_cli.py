"""The tunekit command, run in-process (and once as a real process)."""

import csv
import json
import math
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

    with tunekit.tuning(tuning_step_ms=math.inf):  # each call tunes to the end and stores its entry
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
    assert code == 1 and err == f"tunekit: {tmp_path / 'missing.csv'}: No such file or directory\n"


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

    with tunekit.tuning(tuning_step_ms=math.inf):
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


@pytest.mark.parametrize("argv, words", [
    (["explore", "nosuchop"], "argument op: no tunekit op named 'nosuchop'; known ops: "),
    (["tune", "--op", "nosuchop"], "argument --op: no tunekit op named 'nosuchop'"),
    (["results", "export", "--op", "nosuchop", "x.csv"], "argument --op: no tunekit op named 'nosuchop'"),
    (["explore", "silu", "--repeats", "0"], "argument --repeats: expected a whole number from 1"),
    (["explore", "silu", "--shape", "8", "--device", "bogus"], "--device 'bogus': expected cpu, cuda or cuda:N"),
    (["ops", "--device", "cpu:1"], "--device 'cpu:1': expected cpu"),
    (["explore", "silu", "--shape", "8", "--device", "cpu", "--approximate", "tanh"],
     "--approximate applies to gelu, gelu_backward, not to silu"),
    (["explore", "silu", "--shape", "100000000000x100000000000"], "bad shape '100000000000x100000000000'"),
    (["explore", "silu", "--shape", "200000x200000", "--device", "cpu", "--dtype", "float64"],
     "the largest shape needs about"),
    (["explore", "silu", "--sizes", "2^90"], "bad sizes '2^90': at most 2^40"),
    (["explore", "silu", "--shape", "10x"], "bad shape '10x'"),
    (["explore", "silu", "--shape", "10xx10"], "bad shape '10xx10'"),
    (["explore", "silu", "--shape", "0"], "bad shape '0'"),
    (["explore", "silu", "--shape", "-4"], "bad shape '-4'"),
    (["explore", "silu", "--seed", "-1"], "argument --seed"),
    (["explore", "silu", "--shape", "8", "--device", "cpu", "--plot", "/nonexistent-dir/x.png"], "no such folder"),
    (["tune", "--max-tuning-ms", "-1"], "argument --max-tuning-ms: expected a number of milliseconds > 0"),
    (["tune", "--max-tuning-ms", "nan"], "argument --max-tuning-ms"),
    (["tune", "--gpus", "7"], "--gpus '7': this machine has"),
    (["bench", "--repeats", "0"], "argument --repeats"),
    (["bench", "--time-limit", "nan"], "argument --time-limit"),
    (["report", "x.json", "--dpi", "0"], "argument --dpi"),
    (["results", "clear", "--op", "nosuchop"], "--op 'nosuchop': no such op here or in"),
])
def test_unusable_input_is_one_line_and_exit_code_2(capsys, argv, words):
    import torch

    if torch.cuda.device_count() >= 8 and "--gpus" in argv:
        pytest.skip("this machine has 8 GPUs")
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.startswith("tunekit: ") and err.count("\n") == 1, err
    assert words in err and ("known ops" not in words or "silu, silu_backward" in err)


def test_files_that_cannot_be_written_or_read_are_one_line_and_exit_code_1(capsys, tmp_path):
    for argv, words in ((["results", "export", "/nonexistent-dir/x.csv"], "/nonexistent-dir/x.csv: No such file"),
                        (["results", "export", str(tmp_path)], f"{tmp_path}: Is a directory"),
                        (["results", "export-untuned", "/nonexistent-dir/x.jsonl"], "No such file")):
        code, out, err = run(capsys, *argv)
        assert code == 1 and out == "" and err.startswith("tunekit: ") and err.count("\n") == 1 and words in err
    assert list(tmp_path.iterdir()) == [tmp_path / "results.sqlite"]  # no staging file left behind


def record_then_damage(path):
    """Three recorded silu signatures, two of them damaged by hand (a first_seen and a spec)."""
    import sqlite3

    import torch
    import tunekit

    with tunekit.tuning(tuning=False, record_untuned=True):
        for n in (33, 34, 35):
            tunekit.silu(torch.randn(n))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE untuned SET first_seen = 'abc' WHERE signature LIKE '%n=34]%'")
    conn.execute("UPDATE untuned SET spec = '{oops' WHERE signature LIKE '%n=35]%'")
    conn.commit()
    conn.close()


def test_damaged_records_are_reported_and_the_rest_is_tuned(capsys, isolated_results):
    import tunekit

    record_then_damage(isolated_results)
    code, out, err = run(capsys, "tune", "--max-tuning-ms", "2000")
    assert code == 1 and "1 tuned" in out and "2 failed" in out, (out, err)
    assert out.count("damaged record in the results file") == 2 and "first_seen" in out and "spec" in out
    assert "Traceback" not in err
    assert [e.signature for e in tunekit.results_store().entries()] == ["x=f32[n=33]@0 out=new cpu"]
    code, out, err = run(capsys, "results", "show")
    assert code == 0 and "1 entry" in out
    assert err.startswith("tunekit: warning: tunekit results file") and "2 damaged untuned record(s)" in err


@pytest.mark.parametrize("argv", [["results", "import", "GOOD"], ["results", "clear"], ["tune"]])
def test_writes_to_an_unusable_results_file_fail_and_leave_it_alone(capsys, tmp_path, argv):
    good = tmp_path / "good.csv"
    assert run(capsys, "--results", str(tmp_path / "source.sqlite"), "results", "export", str(good))[0] == 0
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a database, some notes" * 100)
    argv = [str(good) if a == "GOOD" else a for a in argv]
    code, out, err = run(capsys, "--results", str(broken), *argv)
    assert code == 1 and "imported" not in out and "cleared" not in out and "tuned" not in out
    assert f"cannot {'tune' if argv == ['tune'] else argv[1] + (' results')}: results file '{broken}' is not an SQLite" \
        in err and "Traceback" not in err
    assert broken.read_bytes() == b"not a database, some notes" * 100


#: runs ``tunekit.cli.main`` on each argv of sys.argv[1] (JSON) in this one process (one torch import),
#: printing [exit code, stdout, stderr] per command as JSON
COMMANDS = """
import contextlib, io, json, sys
from tunekit.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def run_commands(commands, run=subprocess.run, **kwargs):
    """Each argv of ``commands`` through the CLI, in one new process: [(code, stdout, stderr)]."""
    done = run([sys.executable, "-c", COMMANDS, json.dumps(commands)], capture_output=True, text=True, timeout=300,
               **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tuned_and_recorded(n_tuned=2, untuned=()):
    import torch
    import tunekit

    with tunekit.tuning(tuning_step_ms=math.inf):  # each call tunes to the end and stores its entry
        for n in range(10, 10 + n_tuned):
            tunekit.silu(torch.randn(n))
    with tunekit.tuning(tuning=False, record_untuned=True):
        for n in untuned:
            tunekit.silu(torch.randn(n))


def test_a_results_file_copied_alone_after_tunekit_commands_has_every_entry(tmp_path, isolated_results):
    """Self-contained after tunekit ran in its own process and exited: no data left in side files."""
    import shutil

    from tunekit.tunable.results import ResultsStore

    tuned_and_recorded(2, untuned=[12])
    assert main(["results", "export", str(tmp_path / "out.csv")]) == 0
    other = tmp_path / "b" / "results.sqlite"
    done = run_commands([["--results", str(other), "results", "import", str(tmp_path / "out.csv")],
                         ["tune", "--max-tuning-ms", "2000"]])
    assert [code for code, _, _ in done] == [0, 0], done
    for path, expected in ((other, 2), (isolated_results, 3)):
        assert [p.name for p in path.parent.iterdir() if p.name.startswith("results.")] == ["results.sqlite"]
        copy = tmp_path / f"copy-{path.parent.name}.sqlite"
        shutil.copyfile(path, copy)
        assert len(ResultsStore(copy)) == expected


def test_a_read_only_results_file_is_shown_and_writes_to_it_fail(tmp_path):
    import read_only_mount

    run_read_only = read_only_mount.runner(tmp_path)
    shipped = tmp_path / "shipped" / "results.sqlite"
    with __import__("tunekit").tuning(results=str(shipped)):
        tuned_and_recorded(1)
    assert main(["--results", str(shipped), "results", "export", str(tmp_path / "x.csv")]) == 0
    before = shipped.read_bytes()
    commands = [["--results", str(shipped), *argv] for argv in (
        ["results", "show"], ["results", "import", str(tmp_path / "x.csv")], ["results", "clear"], ["tune"])]
    script = f"exec {sys.executable} -c '{COMMANDS}' '{json.dumps(commands)}'"
    show, *writes = run_commands(commands, run=lambda argv, **kw: run_read_only(shipped.parent, script))
    assert show[0] == 0 and "1 entry (read-only: " in show[1] and show[2] == ""
    for (code, out, err), doing in zip(writes, ("import results", "clear results", "tune")):
        assert (code, out) == (1, "") and err == (f"tunekit: cannot {doing}: results file '{shipped}' is read-only (the "
                                                  "file, or its folder (where SQLite's journal goes), is not writable)\n")
    assert shipped.read_bytes() == before
