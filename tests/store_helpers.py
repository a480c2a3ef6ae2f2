"""Helpers shared by the results-store tests."""

import warnings

from tunekit.tunable.errors import TunekitWarning
from tunekit.tunable.results import CandidateRecord, Entry, ResultsStore


def make_entry(op="matmul", signature="f16[64,64]@f16[64,64]", device="cpu", **kw):
    fields = dict(
        choice="tiled",
        complete=True,
        validators={"torch": "2.13.0", "src:tiled": "ab12cd", "gpu": "NVIDIA H100 80GB HBM3"},
        candidates={
            "tiled": CandidateRecord("chosen", 0.1 + 0.2, None),
            "naive": CandidateRecord("slower", 1e-300, "3.2x slower than tiled"),
            "fancy": CandidateRecord("numerics", None, "max abs err 0.5 > 1e-3 (Ünïcødé 漢字 🚀)"),
            "blocked": CandidateRecord("unsupported"),
        },
        tuned_at=1_700_000_000.123456789,
        tuning_ms=1234.5678901234,
    )
    fields.update(kw)
    return Entry(op, signature, device, **fields)


def open_quietly(path):
    """Open a store, returning it and the TunekitWarnings raised while opening."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = ResultsStore(path)
    return store, [w for w in caught if issubclass(w.category, TunekitWarning)]


def assert_usable_empty_memory_store(store):
    assert store.in_memory and store.problem
    assert len(store) == 0 and store.entries() == []
    entry = make_entry()
    store.put(entry)
    assert store.get(entry.op, entry.signature, entry.device) == entry


# --- basic behaviour ---------------------------------------------------------------------------

