"""Candidates' source hashes kept between processes (``backends/stored_hashes.py``): the kept hashes are the
computed ones for every op, every file a hash reads is fingerprinted, a change to one changes the
fingerprint, and what is not tunekit's, another list of names, or a damaged or untrusted file is computed."""

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
    computed, compute = [], validators.candidate_hashes
    monkeypatch.setattr(validators, "candidate_hashes", lambda cs: computed.append(list(cs)) or compute(cs))
    return computed


def _folder(tmp_path) -> pathlib.Path:
    return tmp_path / "cache" / "candidate-hashes"


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
    assert [p.name for p in _folder(tmp_path).iterdir()] == [stored_hashes._kept_name()]


_TRACE = """
import builtins, io, json, linecache, os, pathlib, sys
read, real_open, real_read_text, real_getlines = set(), io.open, pathlib.Path.read_text, linecache.getlines
def opened(file, *args, **kwargs):
    read.add(os.path.realpath(file))
    return real_open(file, *args, **kwargs)
builtins.open = opened
pathlib.Path.read_text = lambda self, *a, **k: read.add(os.path.realpath(self)) or real_read_text(self, *a, **k)
linecache.getlines = lambda f, *a, **k: read.add(os.path.realpath(f)) or real_getlines(f, *a, **k)
import tunekit
from tunekit.tunable import validators
from tunekit.tunable.registry import all_ops
read.clear()
for op in all_ops():
    validators.candidate_hashes(op.candidates)
json.dump(sorted(read), sys.stdout)
"""


def test_every_file_a_hash_reads_is_fingerprinted():
    """In a fresh process (nothing read before, no text kept), every file that hashing every op's candidates
    opens, reads or looks up in linecache within tunekit's package is one the fingerprint covers."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _TRACE], capture_output=True, text=True, env=env, check=True).stdout
    package = os.path.dirname(os.path.realpath(tunekit.__file__))
    ours = {p for p in json.loads(out) if p.startswith(package + os.sep)}
    assert len(ours) > 20  # modules, CUDA C sources and headers, Triton kernels
    assert ours <= {os.path.realpath(p) for p in stored_hashes.fingerprinted()}


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
    path = _folder(tmp_path) / stored_hashes._kept_name()
    wrong = {"silu": {key: "0" * 16 for key in validators.candidate_hashes(op.candidates)}}
    path.write_text("{not json" if damage == "not json" else json.dumps(wrong))
    if damage == "untrusted":
        path.chmod(0o666)  # others could have written it
    monkeypatch.setattr(stored_hashes, "_table", None)
    assert _hashes("silu", op.candidates) == validators.candidate_hashes(op.candidates)
    assert len(kept) == 4  # computed again (and compared twice here)


def test_nothing_is_fingerprinted_or_written_on_the_call_that_computes(kept, tmp_path, monkeypatch):
    taken, name = [], stored_hashes._kept_name
    monkeypatch.setattr(stored_hashes, "_kept_name", lambda: taken.append(1) or name())
    monkeypatch.setattr(stored_hashes, "_computed", {})
    registered = []
    monkeypatch.setattr(stored_hashes.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    op, gelu = get_op("silu"), get_op("gelu")
    stored_hashes.candidate_hashes("silu", op.candidates)  # no folder yet: computed only
    stored_hashes.candidate_hashes("gelu", gelu.candidates)
    assert taken == [] and not _folder(tmp_path).exists() and len(kept) == 2
    assert registered == [(stored_hashes._keep_at_exit, (_folder(tmp_path),))]  # once for the process
    fn, args = registered[0]
    fn(*args)  # the exit
    assert taken == [1] and set(json.loads((_folder(tmp_path) / name()).read_text())) == {"silu", "gelu"}
    monkeypatch.setattr(stored_hashes, "_table", None)  # the next process: read on the calling thread
    assert stored_hashes.candidate_hashes("silu", op.candidates) == validators.candidate_hashes(op.candidates)
    assert taken == [1, 1] and len(kept) == 3  # 3: the comparison just above
