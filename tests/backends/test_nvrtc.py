"""NVRTC: every shipped .cu source compiles for sm_80 and sm_90 (no GPU needed), errors carry the
log, and the cubin cache is keyed and written atomically."""

import concurrent.futures
import importlib.util
import os
from importlib import resources

import pytest

from tunekit.backends import nvrtc

SOURCES = sorted(p.name for p in resources.files("tunekit.kernels.cuda").iterdir() if p.name.endswith(".cu"))

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")


def test_nvrtc_is_installed_in_ci():
    if os.environ.get("CI"):
        assert nvrtc.available() is None, nvrtc.available()
        assert nvrtc.nvrtc_version() >= (12, 0)  # and it loads: available() reads metadata only
    assert SOURCES, "no .cu sources shipped"


def test_available_answers_from_metadata_without_loading_cuda_bindings(monkeypatch):
    """With an NVRTC wheel and cuda-bindings installed, available() loads neither (bindings() is not
    called); without the wheel it loads them, and their failure is its answer."""
    if importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("cuda-bindings is not installed here")
    loaded = []

    def bindings():
        loaded.append(True)
        raise RuntimeError("cuda-bindings failed to load")
    monkeypatch.setattr(nvrtc, "bindings", bindings)
    monkeypatch.setattr(nvrtc, "_wheel_release", lambda: "nvidia-cuda-nvrtc 13.0.88")
    nvrtc._installed.cache_clear()
    try:
        assert nvrtc.available() is None and not loaded
        monkeypatch.setattr(nvrtc, "_wheel_release", lambda: None)
        nvrtc._installed.cache_clear()
        assert "failed to load" in nvrtc.available() and loaded
    finally:
        nvrtc._installed.cache_clear()


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
    from tunekit.backends.cuda import CudaKernel
    from tunekit.tunable.registry import all_ops

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    checked = 0
    for op in all_ops():
        for c in op.candidates:
            kernel = getattr(c, "kernel", None)
            if isinstance(kernel, CudaKernel):
                cubin = nvrtc.compile_cubin(nvrtc.source(kernel.filename), kernel.filename, "sm_90")
                assert b"\0" + kernel.name.encode() + b"\0" in cubin, f"{op.name}: {c.name} -> {kernel.name}"
                checked += 1
    assert checked >= 4 * 19


def test_local_includes_are_inlined_into_the_source():
    text = nvrtc.source("silu.cu")
    assert '#include "elementwise.cuh"' not in text and "map_strided" in text
    assert "#include <cuda_fp16.h>" in text  # system headers stay for NVRTC's include path


def test_a_header_included_twice_is_inlined_once():
    """logsumexp.cu includes fastmath.cuh, and so does logsumexp_fold.cuh, which it also includes:
    a second copy would redefine fast_exp2 (without include guards in the inlined text)."""
    text = nvrtc.source("logsumexp.cu")
    assert text.count("__device__ __forceinline__ float fast_exp2(") == 1
    assert "// ---- fastmath.cuh (included above) ----" in text and "struct Partial {" in text


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
def test_kept_builds_only_loads_a_cached_cubin_and_compiles_nothing(tmp_path, monkeypatch):
    """Inside ``builds_only()`` (a stand-in's preparation) a cubin neither cached nor shipped raises
    NeedsCompiler before NVRTC runs; a cached one still loads."""
    from tunekit.tunable.preparations import NeedsCompiler, builds_only
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    code = nvrtc.source(SOURCES[0])
    compiles = []
    real = nvrtc._nvrtc_compile
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: compiles.append(a[1]) or real(*a))
    with builds_only(), pytest.raises(NeedsCompiler, match="no cached or shipped cubin"):
        nvrtc.compile_cubin(code, SOURCES[0], "sm_90")
    assert compiles == []
    assert not (tmp_path / "cubin").exists() or not list((tmp_path / "cubin").iterdir())  # nothing written
    first = nvrtc.compile_cubin(code, SOURCES[0], "sm_90")
    with builds_only():
        assert nvrtc.compile_cubin(code, SOURCES[0], "sm_90") == first
    assert compiles == [SOURCES[0]]


@needs_nvrtc
def test_concurrent_compiles_leave_one_whole_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    code = nvrtc.source(SOURCES[0])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: nvrtc.compile_cubin(code, SOURCES[0], "sm_90"), range(4)))
    assert len(set(results)) == 1
    files = list((tmp_path / "cubin").iterdir())
    assert [f.suffix for f in files] == [".cubin"] and files[0].read_bytes() == results[0]


def _cuobjdump():
    from pathlib import Path
    import shutil
    found = shutil.which("cuobjdump")
    if found:
        return found
    triton = pytest.importorskip("triton")
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not bundled.exists():
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled copy)")
    return str(bundled)


@needs_nvrtc
@pytest.mark.parametrize("filename", ["logsumexp_backward.cu", "silu.cu", "gelu.cu"])
def test_vector_forms_store_whole_16_byte_packs(filename, tmp_path, monkeypatch):
    """Every store of a 16-byte-pack kernel's main path is one STG.E.128 in the sm_90 SASS: NVVM
    split a pack's store into element stores in the logsumexp gradient's flat and columns forms
    (a 3x slower kernel; tunekit.store_pack). Tails stay scalar in the activations, so there only
    the count of 128-bit stores is checked."""
    import re
    import subprocess
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(nvrtc.compile_cubin(nvrtc.source(filename), filename, "sm_90"))
    sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    stores, name = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            stores[name] = []
        m = re.search(r"\b(STG\.E[.\w]*)", line)
        if m and name:
            stores[name].append(m.group(1))
    # 16-byte packs: the logsumexp _vec forms, the activations' f32x4 and x8_pack forms (the seeds'
    # f16x8 / bf16x8 forms are four 4-byte accesses by design)
    vector = {k: v for k, v in stores.items() if re.search(r"_vec(_x2)?$|f32x4|x8_pack", k)}
    assert vector, sorted(stores)
    for kernel, kinds in vector.items():
        if filename.startswith("logsumexp"):
            assert kinds and set(kinds) == {"STG.E.128"}, (kernel, kinds)
        else:
            assert "STG.E.128" in kinds, (kernel, kinds)


@needs_nvrtc
def test_a_compile_leaves_the_interpreters_shared_bytes_alone(tmp_path, monkeypatch):
    """NVRTC writes its log and cubin into the buffers it is handed: a clean compile's log is one NUL
    byte, and written into ``b" " * 1`` (the interpreter's shared one-byte object) it turned every
    b" " in the process, " ".encode() included, into b"\\0"."""
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    nvrtc.compile_cubin('extern "C" __global__ void k() {}', "clean.cu", "sm_90", use_cache=False)
    assert " ".encode() == bytes([32]) and b" " * 3 == bytes([32, 32, 32])
