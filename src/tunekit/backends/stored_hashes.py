"""Candidates' source hashes, remembered between processes.

A signature's first call in a process checks its stored or shipped entry against every candidate's source
hash (``tunable/validators.py``): the texts of the candidates' classes, modules and kernel files, found and
hashed once per op and process: 0.3-3.1 ms of each op's first call on the H100 host, kept 0.02-0.14 ms
(``benchmarks/results/stored_hashes_cost-*``; the process's first op also fingerprints and reads, 1.8 ms, and
with nothing kept yet fingerprints before computing, ~1 ms more).

The hashes change only when tunekit's own files do: every candidate tunekit defines hashes texts of files in
its ``ops``, ``kernels`` and ``backends`` folders (modules, CUDA C sources and headers, Triton kernels) and its
configuration, which tunekit's code sets. So they are kept in tunekit's private cache folder
(``backends/cache.py``: ``candidate-hashes``) under a fingerprint of those files' metadata, the way
``backends/triton_key.py`` keeps Triton's key (what that trusts: :func:`tunekit.backends.cache.files_fingerprint`),
and of tunekit's and Python's versions: the fingerprint is taken before the process computes any hash, and what
it computed is kept at exit only where the files still give that fingerprint (not across an edit or an install
while it ran). An op whose candidates are not all tunekit's (one added from another module) is hashed every
process, as is an op whose kept list of candidate names differs from its own. Whatever fails in the cache folder
(missing, not a folder, not readable, damaged, others could write it) falls back to computing.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import sys
import threading

from .. import _version
from ..tunable import validators
from . import cache
from .env import SettingError

__all__ = ["candidate_hashes", "fingerprinted"]

_PACKAGE = pathlib.Path(__file__).resolve().parent.parent
#: the folders of tunekit's package whose files candidates' hashes read (a test traces every file they read)
FOLDERS = ("ops", "kernels", "backends")
_SUFFIXES = (".py", ".cu", ".cuh", ".c", ".cpp")
KEPT = 4  # files kept (the newest): one per tunekit install or checkout in use on this machine
_lock = threading.Lock()
_table: dict[str, dict[str, str]] | None = None  # this process's view of the kept file
_taken: str | None = None  # the fingerprint taken when it was read
_computed: dict[str, dict[str, str]] = {}  # what this process computed and has not kept yet


def _after_fork_in_child() -> None:  # a forked worker (offline tuning) must not inherit a held lock
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fingerprinted(root: pathlib.Path = _PACKAGE) -> list[str]:
    """The files whose metadata the fingerprint reads (sources in :data:`FOLDERS`), in a stable order."""
    paths = []
    for folder in FOLDERS:
        for base, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += (os.path.join(base, f) for f in sorted(files) if f.endswith(_SUFFIXES))
    return paths


def _fingerprint() -> str | None:
    """The package files' fingerprint now, or None (a file that cannot be stat-ed)."""
    try:
        return cache.files_fingerprint(str(_PACKAGE), fingerprinted())
    except (OSError, ValueError):
        return None


def _file_name(fingerprint: str) -> str:
    return f"{fingerprint}-{_version.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}.json"


def _folder() -> pathlib.Path | None:
    try:
        return cache.cache_dir("candidate-hashes")
    except SettingError:  # TUNEKIT_CACHE set wrong: the runtime says so where it builds
        return None


def _valid(table) -> bool:
    return isinstance(table, dict) and all(
        isinstance(op, str) and isinstance(hashes, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()) for op, hashes in table.items())


def _read(folder: pathlib.Path, name: str) -> dict[str, dict[str, str]]:
    try:
        table = json.loads(cache.read_kept(folder, name) or "{}")
    except ValueError:  # not JSON: computed again
        return {}
    return table if _valid(table) else {}


def _kept(folder: pathlib.Path) -> dict[str, dict[str, str]]:
    """This process's view of the kept hashes, read once (call with ``_lock`` held), under the fingerprint taken
    then: before this process computes any hash, so what it keeps at exit describes the files it hashed."""
    global _table, _taken
    if _table is None:
        _taken = _fingerprint()
        _table = _read(folder, _file_name(_taken)) if _taken else {}
    return _table


def _keep_at_exit(folder: pathlib.Path) -> None:
    """Keep the hashes this process computed, merged with what other processes kept meanwhile (an op's hashes
    are the same in all of them), under the fingerprint taken before they were computed; nothing where the files
    changed since (an edit or an install while the process ran). At exit, not on the call that computed them: a
    thread writing beside the calls slowed those calls more than the write costs (the GIL)."""
    with _lock:
        taken, computed = _taken, dict(_computed)
        _computed.clear()
    if not taken or not computed or _fingerprint() != taken:
        return
    name = _file_name(taken)
    cache.write_kept(folder, name, json.dumps({**_read(folder, name), **computed}), KEPT)


def _ours(candidate) -> bool:
    """Whether what ``candidate``'s hash reads is tunekit's: its class's module, or a function candidate's."""
    parts = [type(candidate)]
    if hasattr(candidate, "_supports") and not isinstance(candidate, type):  # a FunctionCandidate
        parts += [candidate.run, candidate._supports]
    return all(p is None or str(getattr(p, "__module__", "")).startswith("tunekit.") for p in parts)


def candidate_hashes(op_name: str, candidates) -> dict[str, str]:
    """``validators.candidate_hashes(candidates)`` of the op ``op_name``: the kept hashes where this install
    kept them for these candidates, else computed, and kept at exit for the processes after this one."""
    folder = _folder()
    if folder is None or not all(_ours(c) for c in candidates):
        return validators.candidate_hashes(candidates)
    with _lock:
        kept = _kept(folder).get(op_name)
    if kept is not None and list(kept) == [f"candidate:{c.name}" for c in candidates]:
        return dict(kept)
    hashes = validators.candidate_hashes(candidates)
    with _lock:
        if not _computed:
            atexit.register(_keep_at_exit, folder)
        _computed[op_name] = _kept(folder)[op_name] = hashes
    return hashes
