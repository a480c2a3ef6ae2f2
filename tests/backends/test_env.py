"""The backends' environment variables are read strictly: a value tunekit cannot read is an error
naming the variable, raised where the variable is first needed, never taken as the default."""

from __future__ import annotations

import os

import pytest

from tunekit.backends import cache, cuda, env, extension, fast_call, fast_launch

SWITCHES = ["TUNEKIT_FAST_CALL", "TUNEKIT_FAST_LAUNCH", "TUNEKIT_PDL", "TUNEKIT_TRITON_SUBPROCESS",
            "TUNEKIT_TRITON_STATIC"]
assert set(SWITCHES) == set(env.SWITCHES)


@pytest.mark.parametrize("raw, value", [
    ("1", True), ("0", False), ("true", True), ("FALSE", False), (" Yes ", True), ("no", False), ("On", True),
    ("off\n", False),
])
def test_switches_accept_the_usual_spellings(monkeypatch, raw, value):
    monkeypatch.setenv("TUNEKIT_PDL", raw)
    assert env.switch("TUNEKIT_PDL") is value


def test_an_unset_switch_is_its_default(monkeypatch):
    monkeypatch.delenv("TUNEKIT_PDL", raising=False)
    assert env.switch("TUNEKIT_PDL") is True and env.switch("TUNEKIT_PDL", default=False) is False


@pytest.mark.parametrize("raw", ["", " ", "2", "-1", "enable", "truee", "0.0", "n"])
def test_anything_else_is_a_value_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("TUNEKIT_FAST_CALL", raw)
    with pytest.raises(ValueError, match=r"TUNEKIT_FAST_CALL=.*expected one of 1/0, true/false, yes/no, on/off"):
        env.switch("TUNEKIT_FAST_CALL")


@pytest.fixture
def fresh_loads():
    """The extensions and the dependent launch read their variable again (and again after the test)."""
    caches = [fast_launch._load, fast_call._load, cuda._dependent_launch]
    for c in caches:
        c.cache_clear()
    yield
    for c in caches:
        c.cache_clear()


@pytest.mark.parametrize("variable, first_use", [
    ("TUNEKIT_FAST_LAUNCH", fast_launch.load),
    ("TUNEKIT_FAST_CALL", fast_call.load),
    ("TUNEKIT_PDL", lambda: cuda._dependent_launch(0)),  # read before the device is asked anything
])
def test_each_switch_raises_at_its_first_use(monkeypatch, fresh_loads, variable, first_use):
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValueError, match=variable):
        first_use()
    with pytest.raises(ValueError, match=variable):  # not cached as "off": it raises until fixed
        first_use()


@pytest.mark.parametrize("bad", SWITCHES)
def test_the_first_read_of_any_switch_reports_a_bad_one(monkeypatch, bad):
    """A bad value is not left for a read that may come only inside a candidate being checked."""
    monkeypatch.setenv(bad, "sure")
    for variable in SWITCHES:
        with pytest.raises(ValueError, match=f"{bad}='sure'"):
            env.switch(variable)


@pytest.mark.parametrize("variable, module", [("TUNEKIT_FAST_LAUNCH", fast_launch), ("TUNEKIT_FAST_CALL", fast_call)])
def test_an_extension_switched_off_says_so(monkeypatch, fresh_loads, variable, module):
    monkeypatch.setenv(variable, " OFF ")
    assert module.load() is None
    assert module.unavailable() == f"disabled by {variable}=OFF"


def test_the_pdl_switch_off_means_plain_launches(monkeypatch, fresh_loads):
    monkeypatch.setenv("TUNEKIT_PDL", "no")
    assert cuda._dependent_launch(0) is None  # decided before the device's capability is asked


# -- TUNEKIT_CACHE ------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["-1", "cache", "./cache", "build/-o"])
def test_a_relative_cache_path_is_a_value_error(monkeypatch, raw):
    monkeypatch.setenv("TUNEKIT_CACHE", raw)
    with pytest.raises(ValueError, match="TUNEKIT_CACHE=.*absolute path"):
        cache.cache_dir("launch")


def test_the_cache_path_expands_home_and_an_empty_one_is_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TUNEKIT_CACHE", "~/tk")
    assert cache.cache_dir("cubin") == tmp_path / "tk" / "cubin"
    monkeypatch.setenv("TUNEKIT_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir("launch") == tmp_path / "xdg" / "tunekit" / "launch"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG specification says: ignore it
    assert cache.cache_dir("launch") == tmp_path / ".cache" / "tunekit" / "launch"


def test_a_bad_cache_path_is_not_swallowed_by_the_extension_fallback(monkeypatch, fresh_loads):
    """Other build problems fall back to the slow path; a setting tunekit cannot read raises."""
    monkeypatch.setenv("TUNEKIT_CACHE", "-1")
    with pytest.raises(ValueError, match="TUNEKIT_CACHE"):
        fast_launch.load()
    with pytest.raises(ValueError, match="TUNEKIT_CACHE"):
        extension.load_or_reason(fast_launch.build, "tunekit_fast_launch", "TUNEKIT_FAST_LAUNCH")


def test_a_cache_path_whose_folders_start_with_a_dash_still_builds(monkeypatch, tmp_path):
    """Every path reaches the compiler absolute, so none reads as an option."""
    root = tmp_path / "-1"
    monkeypatch.setenv("TUNEKIT_CACHE", str(root))
    path = fast_launch.build()
    assert os.path.dirname(path) == str(root / "launch") and extension.verify(path) is None
