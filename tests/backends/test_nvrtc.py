"""NVRTC: every shipped .cu source compiles for sm_80 and sm_90 (no GPU needed), errors carry the
log, and the cubin cache is keyed and written atomically."""

import concurrent.futures
import os
from importlib import resources

import pytest

from tunekit.backends import nvrtc

SOURCES = sorted(p.name for p in resources.files("tunekit.kernels.cuda").iterdir() if p.name.endswith(".cu"))

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")


def test_nvrtc_is_installed_in_ci():
    if os.environ.get("CI"):
        assert nvrtc.available() is None, nvrtc.available()
    assert SOURCES, "no .cu sources shipped"


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("filename", SOURCES)
def test_every_source_compiles(filename, arch, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    cubin = nvrtc.compile_cubin(nvrtc.source(filename), filename, arch)
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000


@needs_nvrtc
def test_every_kernel_a_candidate_names_is_in_its_compiled_module(tmp_path, monkeypatch):
    import tunekit  # noqa: F401 (registers the ops)
    from tunekit.tunable.registry import all_ops

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    checked = 0
    for op in all_ops():
        for c in op.candidates:
            kernel = getattr(c, "kernel", None)
            if isinstance(kernel, nvrtc.CudaKernel):
                cubin = nvrtc.compile_cubin(nvrtc.source(kernel.filename), kernel.filename, "sm_90")
                assert b"\0" + kernel.name.encode() + b"\0" in cubin, f"{op.name}: {c.name} -> {kernel.name}"
                checked += 1
    assert checked >= 4 * 19


def test_local_includes_are_inlined_into_the_source():
    text = nvrtc.source("silu.cu")
    assert '#include "elementwise.cuh"' not in text and "map_strided" in text
    assert "#include <cuda_fp16.h>" in text  # system headers stay for NVRTC's include path


@needs_nvrtc
def test_compile_error_carries_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    with pytest.raises(nvrtc.CompileError) as info:
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_thing(); }', "broken.cu", "sm_90")
    assert "undefined_thing" in info.value.log and "broken.cu" in str(info.value)


@needs_nvrtc
def test_cache_is_used_and_keyed_by_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    code = nvrtc.source(SOURCES[0])
    first = nvrtc.compile_cubin(code, SOURCES[0], "sm_90")
    files = list((tmp_path / "cubin").iterdir())
    assert len(files) == 1

    def refuse(*a, **k):
        raise AssertionError("recompiled despite a cached cubin")

    monkeypatch.setattr(nvrtc, "_nvrtc_compile", refuse)
    assert nvrtc.compile_cubin(code, SOURCES[0], "sm_90") == first
    with pytest.raises(AssertionError, match="recompiled"):
        nvrtc.compile_cubin(code, SOURCES[0], "sm_80")  # another arch is another entry


@needs_nvrtc
def test_concurrent_compiles_leave_one_whole_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    code = nvrtc.source(SOURCES[0])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: nvrtc.compile_cubin(code, SOURCES[0], "sm_90"), range(4)))
    assert len(set(results)) == 1
    files = list((tmp_path / "cubin").iterdir())
    assert [f.suffix for f in files] == [".cubin"] and files[0].read_bytes() == results[0]
