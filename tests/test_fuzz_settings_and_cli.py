"""Bad values for every ``TUNEKIT_*`` variable and for every subcommand of the ``tunekit`` command: never
a traceback or a crash, never a value silently ignored. A setting tunekit cannot use is exit code 2 and
one line naming the variable; bad arguments are exit code 2, a run that fails exit code 1, each said in
lines that start with ``tunekit``.

Each case is ``python -m tunekit ...`` as the command runs it (``runpy._run_module_as_main``, with
``sys.argv`` and ``sys.orig_argv`` as ``-m`` sets them) in a process of its own, forked from one server
process that imported torch once: a fresh interpreter per case would spend seconds importing torch
each time. The cases run once, together, a few at a time (the ``outcomes`` fixture).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tunekit.tunable import context

SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")
JOBS = 3

SERVER = r"""
import atexit, json, os, runpy, signal, sys, time, traceback
import torch  # once: every case is forked from here

def case(spec, out, err):
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    signal.alarm(240)  # a hung case ends, and fails, instead of hanging the test
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    sys.argv = ["-m", *spec["argv"]]  # what python -m sets while it imports the package
    sys.orig_argv = [sys.executable, "-m", "tunekit", *spec["argv"]]
    code = 0
    try:
        runpy._run_module_as_main("tunekit")
    except SystemExit as exc:  # as the interpreter would end
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

specs, folder, jobs = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
waiting, running, codes = list(enumerate(specs)), {}, {}
while waiting or running:
    while waiting and len(running) < jobs:
        index, spec = waiting.pop(0)
        pid = os.fork()
        if pid == 0:
            case(spec, f"{folder}/{index}.out", f"{folder}/{index}.err")
        running[pid] = index
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""

#: values that mean nothing for a setting: empty, not a number, negative, a word, too large for a float
BAD = {"empty": "", "nan": "nan", "negative": "-1", "garbage": "garbage", "huge": "9" * 400}
BOOLEANS = [v for n, v in context.ENV_VARS.items() if isinstance(context._FIELDS[n].default, bool)]
NUMBERS = [v for n, v in context.ENV_VARS.items() if isinstance(context._FIELDS[n].default, float)]
#: read by the backends when a CUDA kernel first loads or launches; checked at import on every machine
BACKENDS = ["TUNEKIT_FAST_CALL", "TUNEKIT_FAST_LAUNCH", "TUNEKIT_PDL", "TUNEKIT_CACHE"]


def expected_for(var: str, label: str):
    """(exit code, what stderr must say) for ``var`` set to BAD[label]."""
    if var == "TUNEKIT_TUNING_STEP_MS" and label == "huge":
        return 0, None  # infinity: no limit per call, a documented value
    if var in BOOLEANS + NUMBERS + ["TUNEKIT_DISTRIBUTED"]:
        return 2, f"tunekit: {var}="
    if var == "TUNEKIT_RESULTS":  # a path: empty is the default one; a name too long cannot be a file
        return (1, "File name too long): its results cannot be read") if label == "huge" else (0, None)
    if var == "TUNEKIT_CACHE" and label == "empty":
        return 0, None  # empty: the default cache
    return 2, f"tunekit: {var}="


def env_cases():
    for var in sorted(set(context.ENV_VARS.values()) | {"TUNEKIT_DISTRIBUTED", *BACKENDS}):
        for label in BAD:
            marks = []
            argv = (["explore", "silu", "--shape", "64", "--device", "cpu", "--repeats", "1"] if var in BACKENDS
                    else ["results", "show"])
            yield pytest.param({"env": {var: BAD[label]}, "argv": argv, "expect": expected_for(var, label)},
                               id=f"{var}={label}", marks=marks)


def cli_cases():
    """(id, argv, exit code, what stderr must say); FILE, DIR and PLAIN are put in place per case."""
    explore = ["explore", "silu", "--device", "cpu", "--repeats", "1"]
    return [
        ("no-command", [], 2, "tunekit: the following arguments are required"),
        ("bogus-command", ["frobnicate"], 2, "invalid choice"),
        ("ops-device", ["ops", "--device", "bogus"], 2, "--device 'bogus'"),
        ("ops-device-cuda-9", ["ops", "--device", "cuda:9"], 2, "--device cuda:9"),
        ("explore-op", ["explore", "nosuchop"], 2, "no tunekit op named 'nosuchop'"),
        *[(f"explore-shape-{label}", [*explore, "--shape", shape], 2, "bad shape")
          for label, shape in (("10x", "10x"), ("10xx10", "10xx10"), ("zero", "0"), ("negative", "-3"),
                               ("float", "1.5"), ("empty", ""), ("x", "x"), ("huge", "100000000000x100000000000"),
                               ("nine-dims", "1x1x1x1x1x1x1x1x1"), ("unicode", "١٠"))],
        ("explore-too-big-for-memory", [*explore, "--shape", "300000x300000"], 2, "the largest shape needs"),
        ("explore-dtype", [*explore, "--dtype", "float8"], 2, "argument --dtype"),
        *[(f"explore-repeats-{v}", ["explore", "silu", "--repeats", v], 2, "argument --repeats")
          for v in ("0", "-1", "abc", "nan", "9" * 30)],
        ("explore-seed", ["explore", "silu", "--seed", "-1"], 2, "argument --seed"),
        ("explore-sizes", [*explore, "--sizes", "1..0x"], 2, "bad sizes"),
        ("explore-sizes-huge", [*explore, "--sizes", "2^100000000"], 2, "bad sizes"),
        ("explore-sizes-rows", [*explore, "--shape", "1x256", "--sizes", "1000"], 2, "not a multiple"),
        ("explore-approximate-silu", [*explore, "--shape", "8", "--approximate", "tanh"], 2, "--approximate"),
        ("explore-approximate-bogus", ["explore", "gelu", "--approximate", "fast"], 2, "argument --approximate"),
        ("explore-device", [*explore, "--device", "tpu"], 2, "--device 'tpu'"),
        ("explore-plot", [*explore, "--shape", "8", "--plot", "/nonexistent/x.png"], 2, "no such folder"),
        ("bench-ops", ["bench", "--ops", "nosuchop"], 2, "argument --ops"),
        ("bench-dtypes", ["bench", "--dtypes", "float8"], 2, "argument --dtypes"),
        ("bench-repeats", ["bench", "--repeats", "0"], 2, "argument --repeats"),
        ("bench-time-limit", ["bench", "--time-limit", "nan"], 2, "argument --time-limit"),
        ("bench-device", ["bench", "--device", "bogus"], 2, "--device 'bogus'"),
        ("report-missing", ["report", "missing.json"], 1, "tunekit report: cannot read"),
        ("report-garbage", ["report", "PLAIN"], 1, "tunekit report: cannot read"),
        ("report-dpi", ["report", "PLAIN", "--dpi", "0"], 2, "argument --dpi"),
        ("tune-op", ["tune", "--op", "nosuchop"], 2, "no tunekit op named 'nosuchop'"),
        ("tune-gpus", ["tune", "--gpus", "bogus"], 2, "--gpus"),
        ("tune-gpus-many", ["tune", "--gpus", "99"], 2, "--gpus"),
        ("tune-file-missing", ["tune", "--file", "missing.jsonl"], 2, "missing.jsonl: No such file"),
        ("tune-file-garbage", ["tune", "--file", "PLAIN"], 2, "invalid row(s)"),
        ("tune-file-dir", ["tune", "--file", "DIR"], 2, "Is a directory"),
        *[(f"tune-budget-{v}", ["tune", "--max-tuning-ms", v], 2, "argument --max-tuning-ms")
          for v in ("-1", "0", "nan", "inf", "abc")],
        ("results-no-action", ["results"], 2, "the following arguments are required"),
        ("results-show-op", ["results", "show", "--op", "nosuchop"], 2, "--op 'nosuchop'"),
        ("results-show-dir", ["--results", "DIR", "results", "show"], 1, "is a directory"),
        ("results-show-under-a-file", ["--results", "PLAIN/r.sqlite", "results", "show"], 1, "cannot be created"),
        ("results-export-nodir", ["results", "export", "/nonexistent/x.csv"], 1, "/nonexistent/x.csv: No such file"),
        ("results-export-dir", ["results", "export", "DIR"], 1, "Is a directory"),
        ("results-export-op", ["results", "export", "x.csv", "--op", "nosuchop"], 2, "no tunekit op"),
        ("results-export-untuned-nodir", ["results", "export-untuned", "/nonexistent/x"], 1, "No such file"),
        ("results-import-missing", ["results", "import", "missing.csv"], 1, "missing.csv: No such file"),
        ("results-import-garbage", ["results", "import", "PLAIN"], 1, "nothing imported"),
        ("results-import-dir", ["results", "import", "DIR"], 1, "Is a directory"),
        ("results-import-into-garbage", ["--results", "PLAIN", "results", "import", "FILE"], 1,
         "cannot import results: results file"),
        ("results-clear-garbage", ["--results", "PLAIN", "results", "clear"], 1, "cannot clear results"),
        ("results-clear-op", ["results", "clear", "--op", "nosuchop"], 2, "--op 'nosuchop'"),
        ("tune-into-garbage", ["--results", "PLAIN", "tune"], 1, "cannot tune: results file"),
    ]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run once: id -> (exit code, stdout, stderr)."""
    root = tmp_path_factory.mktemp("fuzz")
    specs, ids = [], []
    for param in [*env_cases(), *(pytest.param({"argv": a}, id=i) for i, a, _, _ in cli_cases())]:
        spec, case_id = dict(param.values[0]), param.id
        cwd = root / f"case{len(specs)}"
        cwd.mkdir()
        (cwd / "DIR").mkdir()
        (cwd / "PLAIN").write_text("op,signature\nnot,a results file\n")
        (cwd / "FILE").write_text(",".join(["op", "signature", "device", "choice", "complete", "tuned_at",
                                            "tuning_ms", "validators", "candidates"]) + "\n")
        env = {"TUNEKIT_RESULTS": str(cwd / "results.sqlite"), "XDG_CACHE_HOME": str(cwd / "cache"),
               **spec.get("env", {})}
        argv = [str(cwd / a) if a in ("FILE", "DIR", "PLAIN") else a.replace("PLAIN/", f"{cwd}/PLAIN/")
                for a in spec["argv"]]
        specs.append({"env": env, "argv": argv, "cwd": str(cwd)})
        ids.append(case_id)
    (root / "specs.json").write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEKIT_") and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC
    done = subprocess.run([sys.executable, "-c", SERVER, str(root / "specs.json"), str(root), str(JOBS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout)
    return {case_id: (codes[str(i)], (root / f"{i}.out").read_text(), (root / f"{i}.err").read_text())
            for i, case_id in enumerate(ids)}


def check(outcome, code, says):
    got, out, err = outcome
    assert "Traceback" not in err and "Traceback" not in out, err
    assert got == code, (got, out, err)
    lines = err.splitlines()
    assert all(line.startswith("tunekit") for line in lines), err  # ours, each line
    if says is not None:
        assert says in err, err
    if code:
        assert lines and len(lines) <= 2, err  # the error (a warning about the results file may come first)


@pytest.mark.parametrize("case", env_cases())
def test_every_setting_with_a_bad_value(outcomes, request, case):
    code, says = case["expect"]
    check(outcomes[request.node.callspec.id], code, says)


@pytest.mark.parametrize("argv, code, says", [pytest.param(a, c, s, id=i) for i, a, c, s in cli_cases()])
def test_every_subcommand_with_a_bad_value(outcomes, request, argv, code, says):
    check(outcomes[request.node.callspec.id], code, says)
