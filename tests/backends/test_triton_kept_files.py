"""Where kept Triton kernels live (backends/triton_kept_files.py): file names that change with
everything a cubin depends on, the file format, tunekit's cache folder and the shipped bundles."""

import os
import zipfile

import torch  # noqa: F401 - the package's tests import torch first

from tunekit.backends import shipped_kernels, triton_kept_files as files, triton_static
from tunekit.backends.triton_kept_files import Recipe
from tunekit.tunable import tuning


def test_file_names_change_with_the_key_the_architecture_and_triton_settings(monkeypatch):
    key = triton_static.call_key((3, 4.0), {"BLOCK": 64})
    name = files.file_name("logsumexp", "k", key, "sm90")
    assert name == files.file_name("logsumexp", "k", key, "sm90") and name.endswith(".kernel")
    assert name != files.file_name("logsumexp", "k", key, "sm100")
    assert name != files.file_name("logsumexp", "k2", key, "sm90")
    assert name != files.file_name("logsumexp", "k", triton_static.call_key((3, 5.0), {"BLOCK": 64}), "sm90")
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")  # changes what Triton compiles
    files._build_identity.cache_clear()
    try:
        assert name != files.file_name("logsumexp", "k", key, "sm90")
    finally:
        monkeypatch.delenv("TRITON_F32_DEFAULT")
        files._build_identity.cache_clear()


def test_kept_files_round_trip_and_damaged_ones_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    recipe = Recipe("k", 4, 0, 0, (0,), (8,))
    files.keep("a.kernel", files.encode(recipe, b"\x7fELFbody"))
    assert files.find("a.kernel") == (recipe, b"\x7fELFbody")
    files.keep("b.kernel", recipe.to_json().encode() + b"\nnot an ELF image")
    files.keep("c.kernel", b'{"format": 99}\n\x7fELF')
    assert files.find("b.kernel") is None and files.find("c.kernel") is None
    assert oct(os.stat(tmp_path / "cache" / "triton-static" / "a.kernel").st_mode & 0o777) == "0o600"


def test_a_shipped_bundle_serves_kept_files_unless_shipped_builds_are_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    pretuned = tmp_path / "pretuned"
    pretuned.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    recipe = Recipe("k", 4, 0, 0, (0,), (8,))
    (kept / "s.kernel").write_bytes(files.encode(recipe, b"\x7fELFshipped"))
    assert shipped_kernels.write_bundle(pretuned / "GPU.kernels.zip", tmp_path / "none", None, None, kept) == (0, 0, 1)
    assert zipfile.ZipFile(pretuned / "GPU.kernels.zip").namelist() == ["static/s.kernel"]
    monkeypatch.setattr(shipped_kernels, "PRETUNED_DIR", pretuned)
    shipped_kernels._index.cache_clear()
    try:
        with tuning(use_shipped=True):  # the tests' default is off
            assert files.find("s.kernel") == (recipe, b"\x7fELFshipped")
        with tuning(use_shipped=False):
            assert files.find("s.kernel") is None
    finally:
        shipped_kernels._index.cache_clear()



def test_the_triton_version_is_read_without_importing_triton():
    import importlib.util
    import sys

    version = files.triton_version()
    if importlib.util.find_spec("triton") is None:
        assert version is None
    else:
        assert version and version[0].isdigit()
        if "triton" in sys.modules:
            assert version == sys.modules["triton"].__version__
