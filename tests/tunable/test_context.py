"""Settings: scoping, environment defaults, validation."""

import math
import os
import pathlib
import subprocess
import sys
import threading

import pytest

import tunekit
from tunekit.tunable import context
from tunekit.tunable.errors import SettingsError

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def test_tuning_scopes_and_restores_settings():
    assert tunekit.settings().tuning is True
    with tunekit.tuning(tuning=False, max_tuning_ms=5) as s:
        assert s.tuning is False and tunekit.settings() is s
        with tunekit.tuning(max_tuning_ms=7):
            assert tunekit.settings().max_tuning_ms == 7 and tunekit.settings().tuning is False
        assert tunekit.settings().max_tuning_ms == 5
    assert tunekit.settings().tuning is True and tunekit.settings().max_tuning_ms == 200


def test_settings_restored_after_an_exception():
    with pytest.raises(KeyError):
        with tunekit.tuning(enabled=False):
            raise KeyError("x")
    assert tunekit.settings().enabled is True


def test_other_threads_keep_their_own_settings():
    seen = []
    with tunekit.tuning(tuning=False):
        t = threading.Thread(target=lambda: seen.append(tunekit.settings().tuning))
        t.start()
        t.join()
    assert seen == [True]


def test_environment_variables_give_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNEKIT_TUNING", "0")
    monkeypatch.setenv("TUNEKIT_MAX_TUNING_MS", "12.5")
    monkeypatch.setenv("TUNEKIT_RECORD_UNTUNED", "yes")
    monkeypatch.setenv("TUNEKIT_RESULTS", str(tmp_path / "r.sqlite"))
    s = context.reload_environment()
    assert (s.tuning, s.max_tuning_ms, s.record_untuned, s.results) == (False, 12.5, True, str(tmp_path / "r.sqlite"))


def test_bad_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TUNEKIT_NUMERICAL_CHECK", "maybe")
    with pytest.raises(ValueError, match="TUNEKIT_NUMERICAL_CHECK"):
        context.reload_environment()


def test_invalid_settings_are_rejected():
    with pytest.raises(TypeError, match="unknown tuning setting"):
        with tunekit.tuning(speed="max"):
            pass
    with pytest.raises(ValueError, match="max_tuning_ms"):
        with tunekit.tuning(max_tuning_ms=0):
            pass
    with pytest.raises(ValueError, match="margin"):
        with tunekit.tuning(margin=1.5):
            pass


def test_configure_changes_process_defaults():
    try:
        tunekit.configure(margin=0.1)
        assert tunekit.settings().margin == 0.1
    finally:
        context.reload_environment()
    assert tunekit.settings().margin == 0.03


def test_every_setting_has_an_environment_variable_documented_in_the_readme():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for var in context.ENV_VARS.values():
        assert var in readme, f"{var} is not documented in README.md"


@pytest.mark.parametrize("var, value", [
    ("TUNEKIT_MAX_TUNING_MS", "nan"), ("TUNEKIT_MAX_TUNING_MS", "inf"), ("TUNEKIT_MAX_TUNING_MS", "-1"),
    ("TUNEKIT_MAX_TUNING_MS", "0"), ("TUNEKIT_MAX_TUNING_MS", ""), ("TUNEKIT_MAX_TUNING_MS", "1e999"),
    ("TUNEKIT_PRUNE_RATIO", "nan"), ("TUNEKIT_PRUNE_RATIO", "inf"), ("TUNEKIT_PRUNE_RATIO", "0.5"),
    ("TUNEKIT_MARGIN", "nan"), ("TUNEKIT_MARGIN", "1"), ("TUNEKIT_MARGIN", "-0.1"),
    ("TUNEKIT_TUNING_STEP_MS", "nan"), ("TUNEKIT_TUNING_STEP_MS", "-5"),
    ("TUNEKIT_ENABLED", ""), ("TUNEKIT_ENABLED", " "), ("TUNEKIT_TUNING", "2"), ("TUNEKIT_CUDA_GRAPH", "nan"),
    ("TUNEKIT_RECORD_UNTUNED", "y"), ("TUNEKIT_USE_STORED", "garbage" * 40),
])
def test_environment_values_that_mean_nothing_are_errors_naming_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=f"^{var}=") as raised:
        context.reload_environment()
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300
    kept = tunekit.settings()  # the defaults (the suite runs with TUNEKIT_TUNING_STEP_MS=inf: tests/conftest.py)
    assert kept == context.TuningSettings(results=kept.results, tuning_step_ms=kept.tuning_step_ms,
                                          use_shipped=kept.use_shipped)  # what conftest sets


def test_environment_values_that_mean_something_are_read(monkeypatch):
    for var, value in (("TUNEKIT_ENABLED", " OFF "), ("TUNEKIT_MAX_TUNING_MS", "1e6"), ("TUNEKIT_TUNING_STEP_MS", "inf"),
                       ("TUNEKIT_PRUNE_RATIO", "1"), ("TUNEKIT_MARGIN", "0"), ("TUNEKIT_RESULTS", "")):
        monkeypatch.setenv(var, value)
    s = context.reload_environment()
    assert (s.enabled, s.max_tuning_ms, s.tuning_step_ms, s.prune_ratio, s.margin, s.results) == (
        False, 1e6, math.inf, 1.0, 0.0, None)


@pytest.mark.parametrize("changes, error", [
    ({"max_tuning_ms": math.nan}, SettingsError), ({"max_tuning_ms": math.inf}, SettingsError),
    ({"max_tuning_ms": -1}, SettingsError), ({"prune_ratio": math.nan}, SettingsError),
    ({"margin": math.nan}, SettingsError), ({"tuning_step_ms": math.nan}, SettingsError),
    ({"max_tuning_ms": "50"}, TypeError), ({"max_tuning_ms": True}, TypeError),
    ({"tuning": "no"}, TypeError), ({"enabled": None}, TypeError), ({"numerical_check": 2}, TypeError),
    ({"results": 5}, TypeError),
])
def test_code_settings_are_checked_the_same_way(changes, error):
    for scope in (lambda: tunekit.tuning(**changes).__enter__(), lambda: tunekit.configure(**changes)):
        with pytest.raises(error, match=next(iter(changes))):
            scope()
    assert tunekit.settings().max_tuning_ms == context.TuningSettings().max_tuning_ms


def test_code_settings_are_normalised():
    with tunekit.tuning(tuning=0, enabled=1, max_tuning_ms=7, results=pathlib.Path("x.sqlite")) as s:
        assert (s.tuning, s.enabled, s.max_tuning_ms, s.results) == (False, True, 7.0, "x.sqlite")
        assert type(s.max_tuning_ms) is float


@pytest.mark.parametrize("value", ["", "maybe", "2"])
def test_tunekit_distributed_garbage_is_an_error(monkeypatch, value):
    from tunekit import distributed

    monkeypatch.setenv("TUNEKIT_DISTRIBUTED", value)
    with pytest.raises(SettingsError, match="TUNEKIT_DISTRIBUTED="):
        distributed.enable_from_environment()
    assert not distributed.is_enabled()
    monkeypatch.setenv("TUNEKIT_DISTRIBUTED", "off")
    assert distributed.enable_from_environment() is False


def test_a_bad_variable_stops_the_import_with_one_clear_line_and_the_command_with_no_traceback():
    env = dict(os.environ, TUNEKIT_MAX_TUNING_MS="nan", PYTHONPATH=SRC)
    done = subprocess.run([sys.executable, "-c", "import tunekit"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == ("tunekit.tunable.errors.SettingsError: TUNEKIT_MAX_TUNING_MS='nan': "
                                                    "max_tuning_ms must be a finite number > 0, got nan")
    for command in (["-m", "tunekit", "--version"], ["-m", "tunekit", "results", "show"]):
        done = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == ("tunekit: TUNEKIT_MAX_TUNING_MS='nan': max_tuning_ms must be a finite number > 0, "
                               "got nan\n")
