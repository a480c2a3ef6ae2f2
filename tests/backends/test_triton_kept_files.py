"""Where kept Triton kernels live (backends/triton_kept_files.py): file names that change with
everything a cubin depends on, the file format, tunekit's cache folder and the shipped bundles."""

import os
import pathlib
import zipfile

import pytest
import torch  # the package's tests import torch first

from tunekit.backends import shipped_kernels, triton_kept_files as files, triton_static
from tunekit.backends.triton_kept_files import Recipe
from tunekit.tunable import tuning


@pytest.mark.parametrize("variable, value", [("TRITON_F32_DEFAULT", "ieee"), ("DISABLE_MMA_V3", "1"),
                                             ("DISABLE_LLVM_OPT", "1"), ("NVPTX_ENABLE_DUMP", "1")])
def test_file_names_change_with_the_key_the_architecture_and_codegen_settings(monkeypatch, variable, value):
    key = triton_static.call_key((3, 4.0), {"BLOCK": 64})
    name = files.file_name("logsumexp", "k", key, "sm90")
    assert name == files.file_name("logsumexp", "k", key, "sm90") and name.endswith(".kernel")
    assert name != files.file_name("logsumexp", "k", key, "sm100")
    assert name != files.file_name("logsumexp", "k2", key, "sm90")
    assert name != files.file_name("logsumexp", "k", triton_static.call_key((3, 5.0), {"BLOCK": 64}), "sm90")
    monkeypatch.setenv(variable, value)  # changes what Triton compiles
    files._build_identity.cache_clear()
    try:
        assert name != files.file_name("logsumexp", "k", key, "sm90")
    finally:
        monkeypatch.delenv(variable)
        files._build_identity.cache_clear()
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # where Triton keeps builds: not what it builds
    try:
        for own in files._torch_ptxas():  # torch's own ptxas (either release's place): any torch.compile sets it
            monkeypatch.setenv("TRITON_PTXAS_PATH", own)
            files._build_identity.cache_clear()
            assert name == files.file_name("logsumexp", "k", key, "sm90")
        monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/other/ptxas")  # an assembler the user chose: counted
        files._build_identity.cache_clear()
        assert name != files.file_name("logsumexp", "k", key, "sm90")
    finally:
        files._build_identity.cache_clear()


def test_torchs_own_ptxas_through_a_link_or_a_relative_path_is_left_out_too(monkeypatch, tmp_path):
    own = pathlib.Path(files._torch_ptxas()[0])
    (tmp_path / "torch_link").symlink_to(own.parents[1], target_is_directory=True)
    monkeypatch.chdir(own.parents[1])
    assert not files._counted("TRITON_PTXAS_PATH", str(tmp_path / "torch_link" / "bin" / "ptxas"))
    assert not files._counted("TRITON_PTXAS_PATH", os.path.join(".", "bin", "ptxas"))
    assert files._counted("TRITON_PTXAS_PATH", str(tmp_path / "bin" / "ptxas"))


def test_the_ptxas_torch_compile_names_is_torchs_own():
    """Where this torch's compile_tasks.py points TRITON_PTXAS_PATH (``parents[k] / "bin" / "ptxas"`` of its own
    path) is one of the paths left out; torch 2.11 (on the device) names <torch>/bin/ptxas, also left out."""
    import pathlib
    import re

    compile_tasks = pathlib.Path(torch.__file__).parent / "_inductor" / "runtime" / "compile_tasks.py"
    level = re.search(r'parents\[(\d)\] / "bin" / "ptxas"', compile_tasks.read_text())
    assert level is not None
    assert str(compile_tasks.absolute().parents[int(level.group(1))] / "bin" / "ptxas") in files._torch_ptxas()
    assert str(pathlib.Path(torch.__file__).parent / "bin" / "ptxas") in files._torch_ptxas()


def kept_pair(body: bytes, symbol="k"):
    image = b"\x7fELF" + body
    return Recipe(symbol, 4, 0, 0, (0,), (8,), files.cubin_name(image)), image


def test_kept_files_round_trip_and_a_cubin_is_stored_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    recipe, image = kept_pair(b"body")
    files.keep("a.kernel", recipe, image)
    files.keep("b.kernel", recipe, image)  # another shape launching the same cubin
    assert files.find("a.kernel") == recipe == files.find("b.kernel") and files.cubin(recipe.cubin) == image
    folder = tmp_path / "cache" / "triton-static"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["a.kernel", "b.kernel", recipe.cubin + ".cubin"])
    assert oct(os.stat(folder / "a.kernel").st_mode & 0o777) == "0o600"


def test_damaged_kept_files_are_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    recipe, image = kept_pair(b"body")
    files.keep("a.kernel", recipe, image)
    folder = tmp_path / "cache" / "triton-static"
    (folder / f"{recipe.cubin}.cubin").write_bytes(b"\x7fELFother")  # not the content its name says
    assert files.cubin(recipe.cubin) is None
    (folder / "c.kernel").write_bytes(b'{"format": 1, "symbol": "k"}')  # another format
    (folder / "d.kernel").write_bytes(b"\xff\xfe not json")
    assert files.find("c.kernel") is None and files.find("d.kernel") is None and files.find("missing.kernel") is None


def test_a_shipped_bundle_serves_kept_files_unless_shipped_builds_are_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    pretuned = tmp_path / "pretuned"
    pretuned.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    recipe, image = kept_pair(b"shipped")
    (kept / "s.kernel").write_bytes(recipe.to_json().encode())
    (kept / f"{recipe.cubin}.cubin").write_bytes(image)
    assert shipped_kernels.write_bundle(pretuned / "GPU.kernels.zip", tmp_path / "none", None, None, kept) == (0, 0, 2, 0)
    assert sorted(zipfile.ZipFile(pretuned / "GPU.kernels.zip").namelist()) == sorted(
        ["static/s.kernel", f"static/{recipe.cubin}.cubin"])
    monkeypatch.setattr(shipped_kernels, "PRETUNED_DIR", pretuned)
    shipped_kernels.forget()
    try:
        with tuning(use_shipped=True):  # the tests' default is off
            assert files.find("s.kernel") == recipe and files.cubin(recipe.cubin) == image
        with tuning(use_shipped=False):
            assert files.find("s.kernel") is None and files.cubin(recipe.cubin) is None
    finally:
        shipped_kernels.forget()


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
