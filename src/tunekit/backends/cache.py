"""Where tunekit keeps what it builds, and whether what is there may be used.

Location: ``$TUNEKIT_CACHE`` (``~`` expanded; it must then be an absolute path, else
:class:`~tunekit.backends.env.SettingError`: a relative one would scatter folders over whatever
the working directory is, and a value such as ``-1`` would reach a compiler's command line as an
option), an empty value meaning unset; else ``$XDG_CACHE_HOME/tunekit`` (when absolute, as the XDG
specification requires), else ``~/.cache/tunekit``. One folder per kind: ``cubin`` (NVRTC output),
``launch`` (the C and C++ extensions).

Trust: a cached extension is loaded into the process, so whoever can write the cache can run code
in it (a cubin only runs on the GPU, but can still compute wrong answers). A folder is used only if
it is owned by this user and writable by nobody else (created ``0o700`` here), and its parent (the
cache root) cannot be used to swap it (owned by this user or root, and not writable by others unless
sticky, as ``/tmp`` is); an entry only if it is a regular file owned by this user and writable by
nobody else. Otherwise the callers build without the cache (cubins) or fall back to the slower path
(extensions), with one :class:`~tunekit.tunable.errors.TunekitWarning` per folder saying how to fix
it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import stat
import tempfile
import threading
import warnings

from ..tunable.errors import TunekitWarning
from .env import SettingError

__all__ = ["UntrustedCache", "cache_root", "cache_dir", "private_dir", "folder_problem", "entry_problem",
           "warn_once", "files_fingerprint", "read_kept", "write_kept"]


class UntrustedCache(RuntimeError):
    """A cache folder or entry others could have written: not used."""


def cache_root() -> pathlib.Path:
    """The cache root (not created here); SettingError for a ``TUNEKIT_CACHE`` that is not absolute."""
    raw = os.environ.get("TUNEKIT_CACHE")
    if raw:
        path = os.path.expanduser(raw.strip())
        if not os.path.isabs(path):
            raise SettingError(f"TUNEKIT_CACHE={raw!r}: expected an absolute path (or one starting with ~), "
                               f"or unset for the per-user cache")
        return pathlib.Path(os.path.normpath(path))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tunekit"


def cache_dir(kind: str) -> pathlib.Path:
    """The folder for one kind of build output (not created here)."""
    return cache_root() / kind


_owner = os.geteuid if hasattr(os, "geteuid") else None


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` (an existing folder holding entries) must not be trusted, or None."""
    if _owner is None:  # not POSIX: no owners or modes to check
        return None
    folder = os.path.abspath(folder)
    try:
        st = os.stat(folder)
        parent = os.stat(os.path.dirname(folder))
    except OSError as exc:
        return f"cannot inspect {folder}: {exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != _owner():
        return f"{folder} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}; chmod go-w it)"
    if parent.st_uid not in (_owner(), 0):
        return f"{os.path.dirname(folder)} belongs to another user (uid {parent.st_uid}), who could replace {folder}"
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        return (f"{os.path.dirname(folder)} is writable by others (mode {stat.S_IMODE(parent.st_mode):o}), who "
                f"could replace {folder}")
    return None


def entry_problem(st: os.stat_result, path: str | os.PathLike) -> str | None:
    """Why the file ``path`` (``st``: its stat, ideally of the descriptor that reads it) must not be
    used, or None."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if _owner is None:
        return None
    if st.st_uid != _owner():
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(folder: str | os.PathLike) -> pathlib.Path:
    """``folder`` (absolute), created with mode 0o700 where missing (its missing parents too), and
    checked (:func:`folder_problem`): UntrustedCache when others could write it."""
    folder = pathlib.Path(os.path.abspath(folder))
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # made by a concurrent process: checked below like any other
            pass
    problem = folder_problem(folder)
    if problem:
        raise UntrustedCache(f"tunekit's cache folder is not private: {problem}")
    return folder


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """One TunekitWarning per ``key`` and process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, TunekitWarning, stacklevel=3)


# -- small values kept between processes under a fingerprint of the files they were computed from --
def files_fingerprint(root: str, paths) -> str:
    """A hash of ``root`` and of the path (relative to it), size, modification and change times and inode of
    each of ``paths``: it changes when a file is rewritten in place (new times) or replaced (pip, conda, a
    rebuilt editable install: a new inode). A copy that keeps the modification time keeps neither the inode
    nor the change time. OSError when a file cannot be stat-ed."""
    h, prefix = hashlib.sha256(os.fsencode(root)), os.path.join(root, "")
    lines = []
    for path in paths:
        st = os.stat(path)
        rel = path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)  # relpath: 10 us a file
        lines.append(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n")
    h.update(os.fsencode("".join(lines)))  # the bytes of a UTF-8 path, and any other path's own
    return h.hexdigest()[:32]


def read_kept(folder: pathlib.Path, name: str) -> str | None:
    """The text kept as ``name`` in ``folder``, or None (none, or a file or folder others could have written)."""
    try:
        with open(folder / name) as f:
            if entry_problem(os.fstat(f.fileno()), folder / name) or folder_problem(folder):
                return None
            return f.read().strip() or None
    except (OSError, ValueError):  # ValueError: not UTF-8 text
        return None


def write_kept(folder: pathlib.Path, name: str, text: str, keep: int) -> None:
    """Keep ``text`` as ``name`` in ``folder`` (written atomically), and only the ``keep`` newest files of
    ``name``'s suffix there. Nothing is kept where that fails: the next process computes the value again."""
    temporary = None
    try:
        folder = private_dir(folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, prefix=".tmp-") as f:
            temporary = f.name
            f.write(text)
        os.replace(temporary, folder / name)
        temporary = None
        kept = sorted(folder.glob("*" + pathlib.Path(name).suffix), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[keep:]:
            old.unlink(missing_ok=True)
    except (OSError, UntrustedCache):
        if temporary is not None:  # written but not in place: not left behind
            with contextlib.suppress(OSError):
                os.unlink(temporary)
