"""Shipped kernel builds: a cubin shipped under its cache name is used in place of NVRTC (and only
when shipped results are on), cubin names do not depend on where the headers are installed, bundles
hold what a fresh cache built, and shipped Triton entries reach Triton's own cache."""

import shutil
import zipfile

import pytest

from tunekit.backends import nvrtc, shipped_kernels
from tunekit.tunable import context

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")

SOURCE = 'extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }'


@pytest.fixture
def pretuned(tmp_path, monkeypatch):
    """An empty package folder of shipped files, and an empty cubin cache."""
    folder = tmp_path / "pretuned"
    folder.mkdir()
    monkeypatch.setattr(shipped_kernels, "PRETUNED_DIR", folder)
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    shipped_on(monkeypatch, True)
    shipped_kernels.forget()
    yield folder
    shipped_kernels.forget()


def shipped_on(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("TUNEKIT_USE_SHIPPED", "1" if on else "0")
    context.reload_environment()


def _bundle(folder, members: dict[str, bytes], name="GPU.kernels.zip"):
    with zipfile.ZipFile(folder / name, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    shipped_kernels.forget()


@needs_nvrtc
def test_a_shipped_cubin_replaces_the_compile_only_when_shipped_results_are_on(pretuned, monkeypatch):
    name = nvrtc.cubin_name(SOURCE, "add_one", "sm_90")
    marked = b"\x7fELF shipped build of add_one"
    _bundle(pretuned, {f"cubin/{name}": marked})

    def no_compiler(*args):
        raise AssertionError("NVRTC ran although the build was shipped")

    with monkeypatch.context() as m:
        m.setattr(nvrtc, "_nvrtc_compile", no_compiler)
        assert nvrtc.compile_cubin(SOURCE, "add_one", "sm_90") == marked
    shipped_on(monkeypatch, False)
    compiled = nvrtc.compile_cubin(SOURCE, "add_one", "sm_90")
    assert compiled != marked and compiled[:4] == b"\x7fELF"
    # refresh (a cubin that did not load) compiles, never takes the shipped copy again
    shipped_on(monkeypatch, True)
    assert nvrtc.compile_cubin(SOURCE, "add_one", "sm_90", refresh=True) != marked


@needs_nvrtc
def test_a_shipped_file_that_is_no_elf_image_is_ignored(pretuned):
    name = nvrtc.cubin_name(SOURCE, "add_one", "sm_90")
    _bundle(pretuned, {f"cubin/{name}": b"not a cubin"})
    assert shipped_kernels.shipped_cubin(name) is None
    assert nvrtc.compile_cubin(SOURCE, "add_one", "sm_90")[:4] == b"\x7fELF"


@needs_nvrtc
def test_cubin_names_follow_the_headers_text_not_their_folder(tmp_path, monkeypatch):
    (original,) = nvrtc.include_dirs()[:1]
    before = nvrtc.cubin_name(SOURCE, "add_one", "sm_90")
    copy = tmp_path / "include"
    shutil.copytree(original, copy)
    for changed_text in (False, True):
        if changed_text:
            with open(copy / "cuda_bf16.h", "a") as f:
                f.write("\n// another release\n")
        monkeypatch.setattr(nvrtc, "include_dirs", lambda: (str(copy),))
        nvrtc.headers_digest.cache_clear()
        try:
            assert (nvrtc.cubin_name(SOURCE, "add_one", "sm_90") == before) is not changed_text
        finally:
            nvrtc.headers_digest.cache_clear()
    assert nvrtc.cubin_name(SOURCE, "add_one", "sm_80") != before
    assert nvrtc.cubin_name(SOURCE, "add_one", "sm_90", ("-DX=1",)) != before


@needs_nvrtc
def test_the_headers_digest_is_kept_and_follows_a_rewrite(tmp_path, monkeypatch):
    """Kept under a fingerprint of the headers' metadata (backends/nvrtc.headers_digest): a later process reads
    it without hashing; a header rewritten to the same size gets a new fingerprint, so it is hashed again."""
    (original,) = nvrtc.include_dirs()[:1]
    copy = tmp_path / "include"
    shutil.copytree(original, copy)
    monkeypatch.setattr(nvrtc, "include_dirs", lambda: (str(copy),))
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    computed, real = [], nvrtc._headers_digest
    monkeypatch.setattr(nvrtc, "_headers_digest", lambda folder: computed.append(folder) or real(folder))

    def digest():  # as a new process would
        nvrtc.headers_digest.cache_clear()
        return nvrtc.headers_digest()
    try:
        first = digest()
        assert digest() == first == real(str(copy)) and computed == [str(copy)]  # the second read the kept one
        header = copy / "cuda_bf16.h"
        text = header.read_bytes()
        header.write_bytes(text[:-1] + (b"y" if text.endswith(b"x") else b"x"))  # the same size, other text
        assert digest() == real(str(copy)) != first and len(computed) == 2
        for kept in (tmp_path / "cache" / "headers-digest").glob("*.digest"):
            kept.write_text("not-a-digest")  # a kept text that is not a digest: computed again
        assert digest() == real(str(copy)) and len(computed) == 3
        monkeypatch.setattr(nvrtc._version, "__version__", "another release")  # may digest them another way
        assert digest() == real(str(copy)) and len(computed) == 4
    finally:
        nvrtc.headers_digest.cache_clear()


@needs_nvrtc
def test_a_bundle_holds_the_cubins_a_fresh_cache_built(pretuned, tmp_path):
    nvrtc.compile_cubin(SOURCE, "add_one", "sm_90")
    cubins = tmp_path / "cache" / "cubin"
    (only,) = cubins.glob("*.cubin")
    out = pretuned / "GPU.kernels.zip"
    assert shipped_kernels.write_bundle(out, cubins, None, None) == (1, 0, 0, 0)
    assert shipped_kernels.shipped_cubin(only.name) == only.read_bytes()
    assert shipped_kernels.bundle_for(pretuned / "GPU.csv") == out


def _triton_entry(folder, kernel="k"):
    return {f"triton/{folder}/{kernel}.json": b'{"name": "k"}', f"triton/{folder}/{kernel}.cubin": b"\x7fELF k"}


@pytest.fixture
def triton_cache(pretuned, tmp_path, monkeypatch):
    triton = pytest.importorskip("triton")
    from triton.runtime import cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(shipped_kernels, "_seeded", {})
    return triton, cache


def test_shipped_triton_entries_reach_tritons_cache_once(triton_cache, pretuned):
    triton, cache = triton_cache
    _bundle(pretuned, {"triton/VERSION": triton.__version__.encode(), **_triton_entry("ABC"),
                       "triton/DEF/lone.json": b"{}"})  # metadata without its binary: not copied
    assert shipped_kernels.seed_triton_cache() == 1
    group = cache.FileCacheManager("ABC").get_group("k.json")
    assert sorted(group) == ["k.cubin", "k.json"]
    assert open(group["k.cubin"], "rb").read() == b"\x7fELF k"
    assert cache.FileCacheManager("DEF").get_group("lone.json") is None
    assert shipped_kernels.seed_triton_cache() == 1  # once per process: the same answer, no second copy
    shipped_kernels._seeded.clear()
    assert shipped_kernels.seed_triton_cache() == 0  # already in the cache


def test_triton_entries_of_another_triton_version_or_with_shipped_results_off_are_not_copied(
        triton_cache, pretuned, monkeypatch):
    triton, cache = triton_cache
    _bundle(pretuned, {"triton/VERSION": b"0.0.1", **_triton_entry("ABC")})
    assert shipped_kernels.seed_triton_cache() == 0
    assert cache.FileCacheManager("ABC").get_group("k.json") is None
    _bundle(pretuned, {"triton/VERSION": triton.__version__.encode(), **_triton_entry("ABC")})
    shipped_kernels._seeded.clear()
    shipped_on(monkeypatch, False)
    assert shipped_kernels.seed_triton_cache() == 0 and not shipped_kernels._seeded
    assert cache.FileCacheManager("ABC").get_group("k.json") is None


@needs_nvrtc
def test_a_damaged_bundle_is_left_out_with_a_warning_and_compiles_go_on(pretuned):
    from tunekit.tunable import TunekitWarning

    name = nvrtc.cubin_name(SOURCE, "add_one", "sm_90")
    _bundle(pretuned, {f"cubin/{name}": b"\x7fELF shipped"}, name="GOOD.kernels.zip")
    (pretuned / "OTHER_GPU.kernels.zip").write_bytes(b"PK\x03\x04 truncated")
    shipped_kernels.forget()
    with pytest.warns(TunekitWarning, match="OTHER_GPU.kernels.zip"):
        assert shipped_kernels.shipped_cubin(name) == b"\x7fELF shipped"
    other = nvrtc.compile_cubin(SOURCE.replace("1.0f", "2.0f"), "add_two", "sm_90")  # not shipped: compiled
    assert other[:4] == b"\x7fELF"


def test_a_bundle_is_opened_once_for_every_member_read_and_again_after_forget(pretuned, monkeypatch):
    _bundle(pretuned, {"static/a.kernel": b"A", "static/b.kernel": b"B"})
    opened = []
    real = zipfile.ZipFile

    def counting(*args, **kwargs):
        if len(args) == 1 and not kwargs:  # opened for reading (the tests' _bundle writes)
            opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(shipped_kernels.zipfile, "ZipFile", counting)
    reads = [shipped_kernels.shipped_static(m) for m in ("static/a.kernel", "static/b.kernel", "static/a.kernel")]
    assert reads == [b"A", b"B", b"A"] and shipped_kernels.shipped_static("static/none.kernel") is None
    assert len(opened) == 1
    _bundle(pretuned, {"static/a.kernel": b"A2"})  # rewritten in place: forget() drops the open file
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A2" and len(opened) == 2


def test_this_gpu_models_bundle_is_read_first_and_the_others_only_on_a_miss(pretuned, monkeypatch):
    import torch

    _bundle(pretuned, {"static/a.kernel": b"A", "static/both.kernel": b"A's"}, name="GPU_A.kernels.zip")
    _bundle(pretuned, {"static/b.kernel": b"B", "static/both.kernel": b"B's"}, name="GPU_B.kernels.zip")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "GPU B")
    opened = []
    real = zipfile.ZipFile

    def counting(*args, **kwargs):
        if len(args) == 1 and not kwargs:
            opened.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(shipped_kernels.zipfile, "ZipFile", counting)
    assert shipped_kernels.shipped_static("static/both.kernel") == b"B's"  # this model's build
    assert shipped_kernels.shipped_static("static/b.kernel") == b"B" and opened == ["GPU_B.kernels.zip"]
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A"  # a miss: every bundle, once
    assert sorted(opened) == ["GPU_A.kernels.zip", "GPU_B.kernels.zip"]


def test_a_read_whose_bundle_was_closed_meanwhile_opens_it_again(pretuned, monkeypatch):
    """forget() in another thread may close the file _open just gave a reader: the read retries."""
    _bundle(pretuned, {"static/a.kernel": b"A"})
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A"
    bundle = next(iter(shipped_kernels._opened))
    stale = shipped_kernels._opened[bundle]
    stale[0].close()
    real, calls = shipped_kernels._open, []

    def first_stale(b):
        calls.append(b)
        return stale if len(calls) == 1 else real(b)

    monkeypatch.setattr(shipped_kernels, "_open", first_stale)
    shipped_kernels._opened.clear()
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A" and len(calls) == 2


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_opens_the_bundles_again(pretuned):
    import os

    _bundle(pretuned, {"static/a.kernel": b"A"})
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A" and shipped_kernels._opened
    pid = os.fork()
    if pid == 0:  # the child: nothing inherited open, and the read works
        ok = not shipped_kernels._opened and shipped_kernels.shipped_static("static/a.kernel") == b"A"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shipped_kernels.shipped_static("static/a.kernel") == b"A"  # the parent's handle still works
