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


def test_every_source_ends_with_its_guarded_instantiations():
    """The kernels' instantiations are the last thing in each .cu, in one
    ``#ifndef TUNEKIT_SELECTED_KERNELS`` section (tunekit.backends.kernel_units compiles them one
    at a time by leaving it out)."""
    for source in SOURCES:
        lines = source.read_text().rstrip("\n").splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("#ifndef TUNEKIT_SELECTED_KERNELS")]
        assert len(starts) == 1 and lines[-1] == "#endif", source.name
        assert not any(line.startswith("#") for line in lines[starts[0] + 1:-1]), source.name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("selected", [False, True], ids=["whole", "no-kernels"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles_each_source(source, selected, tmp_path):
    """``nvcc -c`` for sm_90, from the kernels folder, with the headers NVRTC uses for cuda_fp16.h;
    also with TUNEKIT_SELECTED_KERNELS defined (the templates alone, what a kernel's unit starts from)."""
    includes = [f"-I{d}" for d in nvrtc.include_dirs()]
    defines = ["-DTUNEKIT_SELECTED_KERNELS"] if selected else []
    run = subprocess.run(["nvcc", "-c", "-std=c++17", "-arch=sm_90", *defines, *includes, str(source), "-o",
                          str(tmp_path / "out.o")], capture_output=True, text=True, timeout=600, cwd=KERNELS)
    assert run.returncode == 0, run.stderr[-3000:]
