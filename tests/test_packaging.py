"""Every non-Python file the package reads at run time (CUDA C kernels and headers, the launch
extension's C file, the shipped results and kernel builds) is named by pyproject's package-data, so a wheel install has them too (an
editable install would hide a missing pattern)."""

import fnmatch
import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tunekit"


def test_every_runtime_source_file_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tunekit"]
    shipped = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
               if p.suffix in (".cu", ".cuh", ".c", ".cpp", ".h", ".csv", ".zip") and "__pycache__" not in p.parts]
    assert any(s.endswith(".cuh") for s in shipped) and any(s.endswith(".c") for s in shipped)
    missing = [s for s in shipped if not any(fnmatch.fnmatch(s, pat) for pat in patterns)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
