"""One open :class:`ResultsStore` per results location, shared by every op in the process."""

from __future__ import annotations

import os
import threading

from .context import current
from .entries import default_results_path
from .results import ResultsStore

__all__ = ["results_store", "close_all"]

_stores: dict[str, ResultsStore] = {}
_lock = threading.Lock()


def results_store(results: str | os.PathLike | None = None) -> ResultsStore:
    """The store at ``results``; by default, the one the current settings name
    (``tuning(results=...)``, else ``TUNEKIT_RESULTS``, else the per-user cache path)."""
    location = os.fspath(results) if results is not None else current().results
    if not location:
        location = str(default_results_path())
    store = _stores.get(location)
    if store is None:
        with _lock:
            store = _stores.get(location)
            if store is None:
                store = _stores[location] = ResultsStore(location)
    return store


def close_all() -> None:
    """Close every open store (tests; a process that switches results files many times)."""
    with _lock:
        for store in _stores.values():
            store.close()
        _stores.clear()
