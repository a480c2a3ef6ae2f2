"""Triton's key of its own install, stored between processes (``backends/triton_key.py``): the
fingerprint follows every file Triton hashes, a known fingerprint installs the stored key without
hashing, an unknown one hashes and stores, and a stored key others could have written is not used.
A fake Triton package (a folder tree and a module-like object) stands for the real one."""

import os
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


def _module(root, hashes):
    def original():
        hashes.append(1)
        return "the-real-key"
    return types.SimpleNamespace(__file__=str(root / "runtime" / "cache.py"), triton_key=original)


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
    assert triton_key.installed_key(first) == "the-real-key" and hashes == [1]
    second = _module(install, hashes)
    assert triton_key.installed_key(second) == "the-real-key" and hashes == [1]
    assert second.triton_key() == "the-real-key" and hashes == [1]
    assert triton_key.installed_key(second) == "the-real-key"  # installed already: nothing read again
    (install / "_C" / "libtriton.so").write_text("a new build")
    third = _module(install, hashes)
    assert triton_key.installed_key(third) == "the-real-key" and hashes == [1, 1]  # a new fingerprint


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_a_stored_key_that_others_could_have_written_is_not_used(install, tmp_path):
    hashes = []
    triton_key.installed_key(_module(install, hashes))
    (stored,) = (tmp_path / "cache" / "triton-key").glob("*.key")
    stored.write_text("planted")
    stored.chmod(0o666)
    module = _module(install, hashes)
    assert triton_key.installed_key(module) == "the-real-key" and hashes == [1, 1]
    assert module.triton_key is not None and module.triton_key() == "the-real-key"


def test_a_cache_setting_that_cannot_be_used_hashes_as_triton_would(install, monkeypatch):
    monkeypatch.setenv("TUNEKIT_CACHE", "relative/path")
    hashes = []
    assert triton_key.installed_key(_module(install, hashes)) == "the-real-key" and hashes == [1]
