"""Candidates' source hashes kept between processes (``backends/stored_hashes.py``): the kept hashes are the
computed ones for every op, every file a hash reads is fingerprinted, a change to one changes the
fingerprint, nothing is kept across a change while the process ran, and what is not tunekit's, another list
of names, or a cache folder that cannot be used (damaged, untrusted, unreadable) is computed; a failed write
leaves no temporary file."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import tunekit
from tunekit.backends import cache, stored_hashes
from tunekit.tunable import FunctionCandidate, validators
from tunekit.tunable.registry import all_ops, get_op


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A fresh cache folder and process view; returns the list of candidate lists hashed by computing."""
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(stored_hashes, "_table", None)
    monkeypatch.setattr(stored_hashes, "_computed", {})
    computed, compute = [], validators.candidate_hashes
    monkeypatch.setattr(validators, "candidate_hashes", lambda cs: computed.append(list(cs)) or compute(cs))
    return computed


def _folder(tmp_path) -> pathlib.Path:
    return tmp_path / "cache" / "candidate-hashes"


def _name() -> str:
    return stored_hashes._file_name(stored_hashes._fingerprint())


def _hashes(op_name: str, candidates) -> dict:
    """stored_hashes.candidate_hashes, then what the process's exit keeps, kept."""
    got = stored_hashes.candidate_hashes(op_name, candidates)
    stored_hashes._keep_at_exit(cache.cache_dir("candidate-hashes"))
    return got


def test_the_ops_use_them():
    assert validators._op_hashes is stored_hashes.candidate_hashes


def test_every_op_computes_once_then_reads_what_it_kept(kept, tmp_path, monkeypatch):
    first = {op.name: _hashes(op.name, op.candidates) for op in all_ops()}
    assert len(kept) == len(first)  # each op computed once
    monkeypatch.setattr(stored_hashes, "_table", None)  # as a new process
    again = {op.name: _hashes(op.name, op.candidates) for op in all_ops()}
    assert again == first and len(kept) == len(first)  # read, not computed
    for op in all_ops():
        assert again[op.name] == validators.candidate_hashes(op.candidates)  # and equal to computing them
    assert [p.name for p in _folder(tmp_path).iterdir()] == [_name()]


_TRACE = """
import builtins, io, json, linecache, os, pathlib, sys
read, real_open, real_getlines = set(), io.open, linecache.getlines
real_read_text, real_read_bytes = pathlib.Path.read_text, pathlib.Path.read_bytes
def opened(file, *args, **kwargs):
    if not isinstance(file, int):
        read.add(os.path.realpath(file))
    return real_open(file, *args, **kwargs)
builtins.open = io.open = opened
pathlib.Path.read_text = lambda self, *a, **k: read.add(os.path.realpath(self)) or real_read_text(self, *a, **k)
pathlib.Path.read_bytes = lambda self: read.add(os.path.realpath(self)) or real_read_bytes(self)
linecache.getlines = lambda f, *a, **k: read.add(os.path.realpath(f)) or real_getlines(f, *a, **k)
import tunekit
from tunekit.tunable import validators
from tunekit.tunable.registry import all_ops
read.clear()  # what importing read: no hash reads a file at import (each reads when first asked)
for op in all_ops():
    validators.candidate_hashes(op.candidates)
json.dump(sorted(read), sys.stdout)
"""


def test_every_file_a_hash_reads_is_fingerprinted():
    """In a fresh process (no text read for a hash before), every file that hashing every op's candidates opens,
    reads or looks up in linecache, inside tunekit's package or not, is one the fingerprint covers."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _TRACE], capture_output=True, text=True, env=env, check=True).stdout
    read = set(json.loads(out))
    package = os.path.dirname(os.path.realpath(tunekit.__file__))
    assert len({p for p in read if p.startswith(package + os.sep)}) > 20  # modules, CUDA C, Triton kernels
    assert read <= {os.path.realpath(p) for p in stored_hashes.fingerprinted()}


def test_a_file_rewritten_or_replaced_changes_the_fingerprint(tmp_path):
    root = tmp_path / "tunekit"
    for folder in stored_hashes.FOLDERS:
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text("x = 1\n")
    (root / "kernels" / "k.cu").write_text("// kernel\n")
    (root / "bench").mkdir()
    (root / "bench" / "b.py").write_text("")  # outside the folders: not read
    paths = stored_hashes.fingerprinted(root)
    assert [os.path.relpath(p, root) for p in paths] == ["ops/a.py", "kernels/a.py", "kernels/k.cu", "backends/a.py"]
    before = cache.files_fingerprint(str(root), paths)
    assert cache.files_fingerprint(str(root), paths) == before
    cu = root / "kernels" / "k.cu"
    os.utime(cu, ns=(cu.stat().st_atime_ns, cu.stat().st_mtime_ns + 1000))  # same size, rewritten in place
    rewritten = cache.files_fingerprint(str(root), paths)
    (tmp_path / "new").write_text("// kernel\n")
    os.replace(tmp_path / "new", cu)  # replaced: a new inode
    assert len({before, rewritten, cache.files_fingerprint(str(root), paths)}) == 3


def test_an_op_with_a_candidate_from_elsewhere_is_computed_and_not_kept(kept, tmp_path):
    op = get_op("silu")
    mine = FunctionCandidate(lambda p: None, name="mine")  # this test module's function
    for _ in range(2):
        got = _hashes("silu", [*op.candidates, mine])
    assert len(kept) == 2 and "candidate:mine" in got
    assert not _folder(tmp_path).exists()


def test_a_kept_list_of_other_names_is_computed_again(kept, monkeypatch):
    op = get_op("silu")
    _hashes("silu", op.candidates[:3])
    monkeypatch.setattr(stored_hashes, "_table", None)
    got = _hashes("silu", op.candidates)
    assert len(kept) == 2 and got == validators.candidate_hashes(op.candidates)


@pytest.mark.parametrize("damage", ["not json", "untrusted"])
def test_a_damaged_or_untrusted_file_is_not_used(kept, tmp_path, monkeypatch, damage):
    op = get_op("silu")
    _hashes("silu", op.candidates)
    path = _folder(tmp_path) / _name()
    wrong = {"silu": {key: "0" * 16 for key in validators.candidate_hashes(op.candidates)}}
    path.write_text("{not json" if damage == "not json" else json.dumps(wrong))
    if damage == "untrusted":
        path.chmod(0o666)  # others could have written it
    monkeypatch.setattr(stored_hashes, "_table", None)
    assert _hashes("silu", op.candidates) == validators.candidate_hashes(op.candidates)
    assert len(kept) == 4  # computed again (and compared twice here)


def test_kept_at_exit_under_the_fingerprint_taken_before_computing(kept, tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(stored_hashes.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    op, gelu = get_op("silu"), get_op("gelu")
    stored_hashes.candidate_hashes("silu", op.candidates)
    stored_hashes.candidate_hashes("gelu", gelu.candidates)
    assert not _folder(tmp_path).exists() and len(kept) == 2  # nothing written on the calls
    assert registered == [(stored_hashes._keep_at_exit, (_folder(tmp_path),))]  # once for the process
    fn, args = registered[0]
    fn(*args)  # the exit
    assert set(json.loads((_folder(tmp_path) / _name()).read_text())) == {"silu", "gelu"}


def test_nothing_is_kept_when_the_files_change_before_exit(kept, tmp_path, monkeypatch):
    """Hashes computed from the files as they were must not be kept under the fingerprint of files edited or
    reinstalled while the process ran."""
    fingerprints = iter(["before", "after"])
    monkeypatch.setattr(stored_hashes, "_fingerprint", lambda: next(fingerprints))
    monkeypatch.setattr(stored_hashes.atexit, "register", lambda fn, *args: None)
    stored_hashes.candidate_hashes("silu", get_op("silu").candidates)  # reads under "before", then computes
    stored_hashes._keep_at_exit(cache.cache_dir("candidate-hashes"))  # "after": not kept
    assert not _folder(tmp_path).exists()


@pytest.mark.parametrize("trouble", ["cache is a file", "unreadable", "wrong shape"])
def test_a_cache_that_cannot_be_used_falls_back_to_computing(kept, tmp_path, monkeypatch, trouble):
    op = get_op("silu")
    if trouble == "cache is a file":
        (tmp_path / "plain").write_text("")
        monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "plain"))  # its folders cannot exist
    elif trouble == "unreadable":
        real = cache.read_kept
        monkeypatch.setattr(cache, "read_kept", lambda folder, name: real(tmp_path / "denied", name))
        (tmp_path / "denied").mkdir(mode=0o000)  # a folder that cannot be entered (not for root: see the next line)
        monkeypatch.setattr("builtins.open", _denied(open, str(tmp_path / "denied")))
    else:
        _folder(tmp_path).mkdir(parents=True)
        (_folder(tmp_path) / _name()).write_text(json.dumps({"silu": 5}))
    assert _hashes("silu", op.candidates) == validators.candidate_hashes(op.candidates)


def _denied(real_open, prefix: str):
    def opened(file, *args, **kwargs):
        if str(file).startswith(prefix):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    return opened


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def refused(src, dst):
        raise OSError("the rename failed")
    monkeypatch.setattr(os, "replace", refused)
    cache.write_kept(tmp_path / "kept", "x.json", "{}", keep=2)
    assert list((tmp_path / "kept").iterdir()) == []
