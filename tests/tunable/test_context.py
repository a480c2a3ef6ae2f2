"""Settings: scoping, environment defaults, validation."""

import threading

import pytest

import tunekit
from tunekit.tunable import context


def test_tuning_scopes_and_restores_settings():
    assert tunekit.settings().tuning is True
    with tunekit.tuning(tuning=False, max_tuning_ms=5) as s:
        assert s.tuning is False and tunekit.settings() is s
        with tunekit.tuning(max_tuning_ms=7):
            assert tunekit.settings().max_tuning_ms == 7 and tunekit.settings().tuning is False
        assert tunekit.settings().max_tuning_ms == 5
    assert tunekit.settings().tuning is True and tunekit.settings().max_tuning_ms == 50


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
