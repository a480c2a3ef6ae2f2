"""Candidate: one calling interface for every implementation of an op (ONNX Runtime TunableOp's
type-erased ``Op``).

A candidate has a ``name``, ``supports(params) -> None | str`` (None when it can run these inputs,
otherwise the reason it cannot: dtype, alignment, size, missing backend, no GPU), ``run(params)``
returning the op's result, and ``source_hash()`` so stored results go stale when its code changes.
Optionally ``fast_runner(params)``: a function of the op's input tensors alone (positionally, as
``params.inputs`` names them) with everything else bound, computing what ``run`` computes for any
params of the same cache key in fast form (``params.fast_form()``), or None. The public functions
call it instead of ``run`` on the cached path (see ``tunable_op``).

``run`` writes into the output buffers that ``params`` carries when they are given (``params.out``
not None); when they are None it may allocate its own. While tuning, outputs are always given and
pre-filled with NaN, and a candidate that returns some other tensor is rejected.

Plain functions and closures adapt with :func:`candidate` / :func:`as_candidate`; classes adapt by
having the three methods (subclassing :class:`Candidate` gives defaults for two of them).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import linecache
import re
import sys
from typing import Any, Callable

__all__ = ["Candidate", "FunctionCandidate", "candidate", "as_candidate", "hash_source", "class_source_hash",
           "class_source"]


#: a first part at least this long is hashed once per process (:func:`_fed`)
_LONG_PART = 4096


def _feed(h, part: Any) -> None:
    if isinstance(part, str):
        part = part.encode()
    elif not isinstance(part, bytes):
        part = repr(part).encode()
    h.update(len(part).to_bytes(8, "little"))
    h.update(part)


@functools.lru_cache(maxsize=32)
def _fed(first: str | bytes):
    """A sha256 fed ``first``: a family of candidates hashes one long text (its modules' sources)
    before each one's configuration; encoding and hashing it again per candidate took 3-4 ms of a
    GEMM op's first call (78 candidates)."""
    h = hashlib.sha256()
    _feed(h, first)
    return h


def hash_source(*parts: Any) -> str:
    """A short stable hash of source texts / bytes / other reprs."""
    long_first = parts and isinstance(parts[0], (str, bytes)) and len(parts[0]) >= _LONG_PART
    h = _fed(parts[0]).copy() if long_first else hashlib.sha256()
    for part in parts[1:] if long_first else parts:
        _feed(h, part)
    return h.hexdigest()[:16]


def _function_source_hash(fn: Callable) -> str:
    try:
        return hash_source(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return hash_source(code.co_code, code.co_consts, code.co_names)
        return hash_source(getattr(fn, "__qualname__", repr(fn)))


@functools.lru_cache(maxsize=None)
def class_source_hash(cls: type) -> str:
    """``hash_source(inspect.getsource(cls))``, once per class and process (an op's first call
    hashes every candidate), read through :func:`class_source`."""
    return hash_source(class_source(cls))


def class_source(cls: type) -> str:
    """``inspect.getsource(cls)``, found faster for a top-level class: Python 3.12's ``getsource``
    parses the class's whole module to find it (1.4-7.7 ms per class; 4 ms of a logsumexp gradient
    signature's 11 ms first call, H100 host). Here: the one ``class <name>`` line at column 0, its
    one-line decorators above it (the line before them blank or a comment, with no decorator above
    that), then ``inspect.getblock`` from there, as ``getsource`` does from the line it finds;
    anything else (a nested class, a name defined twice, a multi-line decorator, a decorator parted
    from its class by a blank or comment line, a ``__wrapped__`` class) takes ``inspect.getsource``.
    The tests hold both equal for every candidate class and those layouts."""
    module = sys.modules.get(cls.__module__)
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        path = None
    lines = linecache.getlines(path, module.__dict__) if path and module is not None else []
    line = re.compile(rf"class {re.escape(cls.__name__)}\b")
    starts = [i for i, text in enumerate(lines) if line.match(text)]
    if cls.__qualname__ != cls.__name__ or len(starts) != 1 or "__wrapped__" in vars(cls):
        return inspect.getsource(cls)  # getsource unwraps a __wrapped__ first
    first = starts[0]
    while first > 0 and lines[first - 1].startswith("@"):
        first -= 1
    above = next((text for text in reversed(lines[:first]) if text.strip() and not text.lstrip().startswith("#")), "")
    previous = lines[first - 1] if first > 0 else ""
    if first > 0 and (above.startswith("@") or (previous.strip() and not previous.lstrip().startswith("#"))):
        return inspect.getsource(cls)  # a decorator above a blank or comment line, or an unusual layout
    return "".join(inspect.getblock(lines[first:]))


class Candidate:
    """Base class for implementations written as classes. Subclasses define ``name`` and ``run``."""

    name: str = ""

    def supports(self, params) -> str | None:
        return None

    def run(self, params):  # pragma: no cover - abstract
        raise NotImplementedError

    def source_hash(self) -> str:
        return class_source_hash(type(self))

    def fast_runner(self, params):
        """None: this candidate has no runner (the fast path falls back to ``run``)."""
        return None

    def __repr__(self) -> str:
        return f"<candidate {self.name}>"


class FunctionCandidate:
    """A function (or closure) ``fn(params) -> result`` seen as a candidate.

    ``run`` is the function itself, stored on the instance, so calling a candidate costs no extra frame.
    ``fast_runner``: None, or a function ``params -> runner`` (see the module docstring).
    """

    __slots__ = ("name", "run", "_supports", "_hash", "fast_runner")

    def __init__(self, fn: Callable, name: str | None = None, supports: Callable | None = None,
                 source_hash: str | None = None,
                 fast_runner: Callable | None = None):
        if not callable(fn):
            raise TypeError(f"a candidate must be callable, got {fn!r}")
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.run = fn
        self._supports = supports
        self._hash = source_hash
        self.fast_runner = fast_runner

    def supports(self, params) -> str | None:
        return None if self._supports is None else self._supports(params)

    def source_hash(self) -> str:
        if self._hash is None:
            parts = [_function_source_hash(self.run)]
            if self._supports is not None:
                parts.append(_function_source_hash(self._supports))
            self._hash = hash_source(*parts)
        return self._hash

    def __repr__(self) -> str:
        return f"<candidate {self.name}>"


def as_candidate(obj, name: str | None = None, supports: Callable | None = None, fast_runner: Callable | None = None):
    """Adapt ``obj`` to the candidate interface: objects that have it pass through; callables wrap."""
    if hasattr(obj, "run") and hasattr(obj, "supports") and hasattr(obj, "name"):
        if name is not None and name != obj.name:
            raise ValueError(f"candidate {obj.name!r} cannot be renamed to {name!r}")
        if supports is not None or fast_runner is not None:
            raise ValueError("supports= and fast_runner= only apply to plain functions")
        if not hasattr(obj, "source_hash"):
            raise TypeError(f"candidate {obj.name!r} has no source_hash()")
        return obj
    return FunctionCandidate(obj, name=name, supports=supports, fast_runner=fast_runner)


def candidate(fn: Callable | None = None, *, name: str | None = None, supports: Callable | None = None):
    """Decorator: ``@candidate(name="x_sigmoid", supports=...)`` or bare ``@candidate``."""
    if fn is None:
        return lambda f: FunctionCandidate(f, name=name, supports=supports)
    return FunctionCandidate(fn, name=name, supports=supports)
