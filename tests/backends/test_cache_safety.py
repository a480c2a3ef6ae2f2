"""What tunekit loads from its cache it checks first: folders private to the user, entries owned by
the user and writable by nobody else, every built extension matching its recorded SHA-256; a torn,
corrupt or altered entry is rebuilt, a folder others can write is not used (a warning, and the slow
path or an uncached compile). Real builds and real NVRTC compiles; no GPU."""

from __future__ import annotations

import hashlib
import os
import stat
import warnings

import pytest

from tunekit.backends import cache, extension, fast_launch, nvrtc
from tunekit.tunable.errors import TunekitWarning

MODULE = "tunekit_fast_launch"
needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def built(tmp_path):
    """A fresh build of the C launch extension in a private folder: (folder, path)."""
    folder = tmp_path / "launch"
    path = fast_launch.build(folder)
    return folder, path


def test_folders_are_created_private_and_entries_carry_their_hash(tmp_path, built):
    folder, path = built
    assert mode(folder) == 0o700 and mode(path) & 0o022 == 0
    recorded = open(path + ".sha256").read().strip()
    assert recorded == hashlib.sha256(open(path, "rb").read()).hexdigest()
    lock = f".{MODULE}.lock"  # the build's lock, per extension
    assert sorted(p.name for p in folder.iterdir()) == sorted([os.path.basename(path), os.path.basename(path) + ".sha256",
                                                               lock])
    assert mode(folder / lock) & 0o077 == 0
    assert extension.verify(path) is None


def test_a_private_dir_makes_every_missing_folder_private(tmp_path):
    made = cache.private_dir(tmp_path / "a" / "b" / "c")
    assert made == tmp_path / "a" / "b" / "c"
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3


def _rebuilt(path, folder):
    """The path build() returns for ``folder`` now, checking that it replaced the entry."""
    before = os.stat(path).st_ino
    again = fast_launch.build(folder)
    assert again == path and os.stat(path).st_ino != before, "the entry was used, not rebuilt"
    assert extension.verify(path) is None
    return again


def test_a_corrupt_entry_is_rebuilt(built):
    folder, path = built
    with open(path, "r+b") as f:  # torn: the hash no longer matches
        f.truncate(100)
    assert "SHA-256" in extension.verify(path)
    _rebuilt(path, folder)


def test_a_missing_hash_is_rebuilt(built):
    folder, path = built
    os.remove(path + ".sha256")
    assert extension.verify(path) is not None
    _rebuilt(path, folder)


def test_an_entry_others_can_write_is_rebuilt(built):
    folder, path = built
    os.chmod(path, 0o666)
    assert "writable by others" in extension.verify(path)
    _rebuilt(path, folder)
    assert mode(path) & 0o022 == 0


def test_an_entry_that_verifies_but_does_not_load_is_rebuilt_once(built):
    """A library whose recorded hash matches but that will not load (garbage written with its own
    hash): load_or_reason rebuilds it once and loads the new one."""
    folder, path = built
    garbage = b"\x7fELF not a library"
    with open(path, "wb") as f:
        f.write(garbage)
    with open(path + ".sha256", "w") as f:
        f.write(hashlib.sha256(garbage).hexdigest())
    assert extension.verify(path) is None
    builds = []

    def build(rebuild=False):
        builds.append(rebuild)
        return fast_launch.build(folder, rebuild=rebuild)

    module, reason = extension.load_or_reason(build, MODULE, "TUNEKIT_FAST_LAUNCH")
    assert reason is None and builds == [False, True]
    assert callable(module.launch) and open(path, "rb").read() != garbage


def test_loading_a_built_entry_reads_and_hashes_it_once(tmp_path, monkeypatch):
    """build() verified the entry it returns; load_or_reason imports it without a second verify (each read and
    hashed the library, 2.5-3 ms on the H100 host)."""
    folder = tmp_path / "launch"
    fast_launch.build(folder)
    checked = []
    verify = extension.verify
    monkeypatch.setattr(extension, "verify", lambda path: checked.append(path) or verify(path))
    module, reason = extension.load_or_reason(lambda rebuild=False: fast_launch.build(folder, rebuild),
                                              MODULE, "TUNEKIT_FAST_LAUNCH")
    assert reason is None and callable(module.launch)
    assert len(checked) == 1


@pytest.mark.parametrize("folder_mode", [0o770, 0o707, 0o777])
def test_a_folder_others_can_write_is_refused_with_one_warning(tmp_path, folder_mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, folder_mode)
    with pytest.raises(cache.UntrustedCache, match="writable by others"):
        fast_launch.build(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            module, reason = extension.load_or_reason(lambda rebuild=False: fast_launch.build(folder, rebuild),
                                                      MODULE, "TUNEKIT_FAST_LAUNCH")
            assert module is None and "writable by others" in reason
    assert len([w for w in caught if issubclass(w.category, TunekitWarning)]) == 1
    assert list(folder.iterdir()) == []  # nothing was built there


def test_a_folder_whose_parent_others_can_write_is_refused(tmp_path):
    parent = tmp_path / "open"
    folder = parent / "launch"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(parent, 0o777)  # anyone could rename our folder away and put theirs in its place
    assert "could replace" in cache.folder_problem(folder)
    os.chmod(parent, 0o1777)  # sticky, as /tmp: only the owner may rename its entries
    assert cache.folder_problem(folder) is None


def test_an_entry_of_another_user_is_refused(built, monkeypatch):
    """Ownership: as seen by another user (a different effective uid), nothing here is trusted."""
    folder, path = built
    monkeypatch.setattr(cache, "_owner", lambda: os.geteuid() + 1)
    assert "belongs to another user" in extension.verify(path)
    assert "belongs to another user" in cache.entry_problem(os.stat(path), path)


# -- cubins ---------------------------------------------------------------------------------------

CODE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }'


@pytest.fixture
def cubins(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "root"))
    return tmp_path / "root" / "cubin"


def _cached(folder):
    return [p for p in folder.iterdir() if p.suffix == ".cubin"]


@needs_nvrtc
def test_a_cubin_cache_others_can_write_is_not_used(cubins, monkeypatch):
    cubins.mkdir(parents=True)
    os.chmod(cubins, 0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = nvrtc.compile_cubin(CODE, "k.cu", "sm_90")
        assert nvrtc.compile_cubin(CODE, "k.cu", "sm_90") == first
    assert first[:4] == b"\x7fELF" and _cached(cubins) == []
    assert len([w for w in caught if issubclass(w.category, TunekitWarning)]) == 1


@needs_nvrtc
@pytest.mark.parametrize("damage", ["garbage", "writable", "refresh"])
def test_a_bad_cached_cubin_is_compiled_again_and_replaced(cubins, monkeypatch, damage):
    good = nvrtc.compile_cubin(CODE, "k.cu", "sm_90")
    (path,) = _cached(cubins)
    assert mode(path) == 0o600 and mode(cubins) == 0o700
    if damage == "garbage":
        path.write_bytes(b"not a cubin")
    elif damage == "writable":
        os.chmod(path, 0o666)
    compiles = []
    real = nvrtc._nvrtc_compile
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: compiles.append(a) or real(*a))
    assert nvrtc.compile_cubin(CODE, "k.cu", "sm_90", refresh=damage == "refresh") == good
    assert len(compiles) == 1 and path.read_bytes() == good and mode(path) == 0o600
    assert nvrtc.compile_cubin(CODE, "k.cu", "sm_90") == good and len(compiles) == 1  # the replacement is used


@needs_nvrtc
def test_threads_compiling_one_cubin_compile_it_once(cubins, monkeypatch):
    import concurrent.futures
    import threading

    compiles = []
    gate = threading.Barrier(8)
    real = nvrtc._nvrtc_compile
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: compiles.append(a) or real(*a))

    def compile_after_all_arrive(_):
        gate.wait()
        return nvrtc.compile_cubin(CODE, "k.cu", "sm_90")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(compile_after_all_arrive, range(8)))
    assert len(set(results)) == 1 and len(compiles) == 1


def test_different_extensions_build_side_by_side_and_one_extension_builds_once(tmp_path, monkeypatch):
    """The build lock is per extension: a slow build of one (the C++ ones take 12-14 s) must not hold
    back another (the C launcher, which every CUDA C candidate waits for); two builds of one
    extension still run one at a time and the second finds the first's result."""
    import threading
    import time

    folder = tmp_path / "launch"
    cache.private_dir(folder)
    spans, compile_real = {}, extension._compile

    def slow_compile(code, source, command, flags, base, path):
        start = time.monotonic()
        time.sleep(0.5)
        compile_real(code, source, command, flags, base, path)
        spans.setdefault(os.path.basename(path).split("-")[0], []).append((start, time.monotonic()))

    monkeypatch.setattr(extension, "_compile", slow_compile)
    builds = [lambda: extension.build("fast_launch.c", "tunekit_a", directory=folder),
              lambda: extension.build("fast_launch.c", "tunekit_b", directory=folder),
              lambda: extension.build("fast_launch.c", "tunekit_b", directory=folder)]
    threads = [threading.Thread(target=b) for b in builds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans["tunekit_a"]) == 1 and len(spans["tunekit_b"]) == 1  # the second b found the first's build
    (a0, a1), (b0, b1) = spans["tunekit_a"][0], spans["tunekit_b"][0]
    assert a0 < b1 and b0 < a1, "two different extensions did not build at the same time"
