"""Triton's key of its own install, stored between processes (``backends/triton_key.py``): the
fingerprint follows every file Triton hashes, a known fingerprint installs the stored key without
hashing, an unknown one hashes and stores, and a stored key others could have written is not used.
A fake Triton package (a folder tree and a module-like object) stands for the real one."""

import os
import shutil
import types

import pytest

from tunekit.backends import triton_key


@pytest.fixture
def install(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "site" / "triton"
    for name, text in (("__init__.py", "v"), ("runtime/cache.py", "c"), ("compiler/compiler.py", "x"),
                       ("backends/nvidia/__init__.py", ""), ("backends/nvidia/driver.py", "d"),
                       ("backends/nvidia/include/cuda.h", "h"), ("language/core.py", "l"), ("_C/libtriton.so", "so"),
                       ("tools/unrelated.py", "u")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


KEY = "3.6.0-the-real-key"  # Triton's keys begin with its version


def _module(root, hashes, *, version="3.6.0", lru_cached=True):
    def original():
        hashes.append(1)
        return KEY
    if lru_cached:  # Triton's own function (functools.lru_cache); a stand-in has no cache_info
        original.cache_info = lambda: None
    return types.SimpleNamespace(__file__=str(root / "runtime" / "cache.py"), __version__=version, triton_key=original)


def test_the_fingerprint_follows_every_file_triton_hashes_and_only_those(install):
    before = triton_key.fingerprint(install)
    assert triton_key.fingerprint(install) == before
    (install / "tools" / "unrelated.py").write_text("changed, not hashed by Triton")
    (install / "backends" / "nvidia" / "include" / "cuda.h").write_text("headers: not modules, never stat-ed")
    assert triton_key.fingerprint(install) == before
    for name in ("_C/libtriton.so", "language/core.py", "runtime/cache.py", "backends/nvidia/driver.py"):
        path = install / name
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # rewritten in place: a new mtime
        changed = triton_key.fingerprint(install)
        assert changed != before
        before = changed
    (install / "compiler" / "new_pass.py").write_text("p")
    assert triton_key.fingerprint(install) != before


def test_the_first_process_hashes_and_stores_the_next_installs_without_hashing(install):
    hashes = []
    first = _module(install, hashes)
    assert triton_key.installed_key(first) == KEY and hashes == [1]
    second = _module(install, hashes)
    assert triton_key.installed_key(second) == KEY and hashes == [1]
    assert second.triton_key() == KEY and hashes == [1]
    assert triton_key.installed_key(second) == KEY  # installed already: nothing read again
    (install / "_C" / "libtriton.so").write_text("a new build")
    third = _module(install, hashes)
    assert triton_key.installed_key(third) == KEY and hashes == [1, 1]  # a new fingerprint


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_a_stored_key_that_others_could_have_written_is_not_used(install, tmp_path):
    hashes = []
    triton_key.installed_key(_module(install, hashes))
    (stored,) = (tmp_path / "cache" / "triton-key").glob("*.key")
    stored.write_text("planted")
    stored.chmod(0o666)
    module = _module(install, hashes)
    assert triton_key.installed_key(module) == KEY and hashes == [1, 1]
    assert module.triton_key is not None and module.triton_key() == KEY


def test_a_cache_setting_that_cannot_be_used_hashes_as_triton_would(install, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", "relative/path")
    hashes = []
    assert triton_key.installed_key(_module(install, hashes)) == KEY and hashes == [1]


def test_a_file_replaced_by_a_copy_with_its_mtime_kept_changes_the_fingerprint(install, tmp_path):
    before = triton_key.fingerprint(install)
    lib = install / "_C" / "libtriton.so"
    copy = tmp_path / "copy.so"
    copy.write_text("so")  # the same size and, below, the same mtime: another build copied with cp -a
    shutil.copystat(lib, copy)
    os.replace(copy, lib)
    assert triton_key.fingerprint(install) != before  # a new inode and change time


def test_a_symlinked_subpackage_is_followed_as_pkgutil_follows_it(install, tmp_path):
    source = tmp_path / "third_party" / "amd"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "compiler.py").write_text("a")
    (install / "backends" / "amd").symlink_to(source, target_is_directory=True)
    (source / "loop").symlink_to(source, target_is_directory=True)  # a cycle is walked once
    before = triton_key.fingerprint(install)
    (source / "compiler.py").write_text("an edited backend")
    assert triton_key.fingerprint(install) != before


def test_a_stand_in_key_function_is_never_stored(install):
    hashes = []
    assert triton_key.installed_key(_module(install, hashes, lru_cached=False)) == KEY
    assert triton_key.installed_key(_module(install, hashes)) == KEY and hashes == [1, 1]  # nothing stored


def test_a_stored_key_of_another_triton_version_is_not_installed(install):
    hashes = []
    triton_key.installed_key(_module(install, hashes))
    module = _module(install, hashes, version="3.7.0")
    assert triton_key.installed_key(module) == KEY and hashes == [1, 1]
    assert not hasattr(module.triton_key, "tunekit_key")


def test_every_file_the_installed_tritons_own_key_reads_is_fingerprinted():
    """Against the real Triton: the modules ``triton_key()`` hashes, found as it finds them."""
    triton = pytest.importorskip("triton")
    import pkgutil

    root = os.path.dirname(os.path.realpath(triton.__file__))
    covered = {os.path.realpath(p) for p in triton_key.fingerprinted(root)}
    hashed = []
    for package in ("compiler", "backends", "language"):
        for info in pkgutil.walk_packages([os.path.join(root, package)], prefix=f"triton.{package}."):
            hashed.append(os.path.realpath(info.module_finder.find_spec(info.name).origin))
    assert hashed and set(hashed) <= covered
    assert {os.path.join(root, "runtime", "cache.py"), os.path.join(root, "_C", "libtriton.so")} <= covered


def test_only_the_newest_stored_keys_are_kept(install, tmp_path):
    folder = tmp_path / "cache" / "triton-key"
    hashes = []
    for i in range(triton_key.KEPT + 3):  # as many builds: each a new fingerprint, each stored
        (install / "_C" / "libtriton.so").write_text("so" * (i + 2))
        triton_key.installed_key(_module(install, hashes))
    assert len(hashes) == triton_key.KEPT + 3 and len(list(folder.glob("*.key"))) == triton_key.KEPT
    assert (folder / (triton_key.fingerprint(install) + ".key")).is_file()  # the newest is among them
