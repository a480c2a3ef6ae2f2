"""Size sweeps for ``tunekit explore --sizes``: element counts, and the shapes that lay them out.

A sweep is given in elements, not shapes, because bandwidth against size is the question and an
elementwise op's cost depends on the count alone. Reductions care about the layout, so the counts
are laid out as rows of a given length (the last dim of ``--shape``): ``--shape 1x4096 --sizes
64K..64M`` sweeps 16 to 16384 rows of 4096.
"""

from __future__ import annotations

import argparse

__all__ = ["layout", "parse_count", "parse_sizes"]

EXAMPLES = "expected e.g. 64K..64M, 65536,1M or 2^16..2^26:4"


def parse_count(text: str) -> int:
    """``65536``, ``64K``, ``16M``, ``1G`` (powers of 1024) or ``2^20``."""
    t = text.strip().upper()
    if t.startswith("2^"):
        return 2 ** int(t[2:])
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    return int(t[:-1] if scale > 1 else t) * scale


def parse_sizes(text: str) -> list[int]:
    """Element counts, comma-separated; ``A..B`` is A, 2A, 4A, ... up to B (``A..B:4``: steps of x4)."""
    sizes = []
    try:
        for item in filter(None, (s.strip() for s in text.split(","))):
            if ".." not in item:
                sizes.append(parse_count(item))
                continue
            span, _, factor = item.partition(":")
            lo, hi = (parse_count(s) for s in span.split(".."))
            step = int(factor or 2)
            if lo < 1 or step < 2:
                raise ValueError(item)
            while lo <= hi:
                sizes.append(lo)
                lo *= step
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad sizes {text!r}: {EXAMPLES}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"bad sizes {text!r}: {EXAMPLES}")
    return sizes


def layout(sizes: list[int], row: int | None) -> list[tuple[int, ...]]:
    """Shapes for ``sizes``: ``(n // row, row)``, or ``(n,)`` when ``row`` is None. ValueError names
    a size that is not a whole number of rows."""
    if row is None:
        return [(n,) for n in sizes]
    bad = [n for n in sizes if n % row]
    if bad:
        raise ValueError(f"size {bad[0]} is not a multiple of the row length {row} (the last dim of --shape)")
    return [(n // row, row) for n in sizes]
