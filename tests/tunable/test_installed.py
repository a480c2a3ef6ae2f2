"""installed_version: the answer importlib.metadata.version gives, for every installed distribution and
for the layouts it must hand over to importlib.metadata."""

import importlib.metadata
import sys

import pytest

from tunekit.tunable import installed
from tunekit.tunable.installed import installed_version


def test_every_installed_distribution_gives_importlib_metadata_s_version():
    names = {d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"]}
    assert len(names) > 10  # torch, pytest and their dependencies at least
    differ = {n: (importlib.metadata.version(n), installed_version(n)) for n in names
              if importlib.metadata.version(n) != installed_version(n)}
    assert differ == {}


@pytest.mark.parametrize("spelling", ["PyTest", "PYTEST", "pytest"])
def test_names_compare_normalized_as_pip_does(spelling):
    assert installed_version(spelling) == importlib.metadata.version("pytest")


def test_a_missing_distribution_is_none():
    assert installed_version("tunekit-no-such-distribution") is None


def test_a_dist_info_folder_is_read_in_sys_path_order(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, version in ((first, "1.2.3+local"), (second, "9.9")):
        info = folder / f"fake_tunekit_dist-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-tunekit-dist\nVersion: {version}\n\nbody\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second), *sys.path])
    installed._listing.cache_clear()
    try:
        assert installed_version("Fake.Tunekit-Dist") == "1.2.3+local" == importlib.metadata.version("fake-tunekit-dist")
    finally:
        installed._listing.cache_clear()


def test_a_metadata_without_its_version_header_asks_importlib_metadata(tmp_path, monkeypatch):
    info = tmp_path / "odd_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-dist\n\nVersion: 7\n")  # the body is not a header
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    installed._listing.cache_clear()
    asked = []
    monkeypatch.setattr(installed, "_from_metadata", lambda name: asked.append(name) or "from importlib")
    try:
        assert installed_version("odd-dist") == "from importlib"
        assert asked == ["odd-dist"]
    finally:
        installed._listing.cache_clear()
