"""Every CUDA C source compiles as plain CUDA C with ``nvcc`` too, not only through tunekit's NVRTC
loader (which inlines each header once): the headers guard themselves with ``#pragma once``.
Needs ``nvcc`` (skipped without it); no GPU."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from tunekit.backends import nvrtc

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "src" / "tunekit" / "kernels" / "cuda"
SOURCES = sorted(KERNELS.glob("*.cu"))
HEADERS = sorted(KERNELS.glob("*.cuh"))


def test_every_header_guards_itself():
    assert HEADERS, "no headers found"
    for header in HEADERS:
        assert "#pragma once" in header.read_text(), f"{header.name} has no #pragma once"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles_each_source(source, tmp_path):
    """``nvcc -c`` for sm_90, from the kernels folder, with the headers NVRTC uses for cuda_fp16.h."""
    includes = [f"-I{d}" for d in nvrtc.include_dirs()]
    run = subprocess.run(["nvcc", "-c", "-std=c++17", "-arch=sm_90", *includes, str(source), "-o",
                          str(tmp_path / "out.o")], capture_output=True, text=True, timeout=600, cwd=KERNELS)
    assert run.returncode == 0, run.stderr[-3000:]
