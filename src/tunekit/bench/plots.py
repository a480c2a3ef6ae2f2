"""PNG plots of benchmark panels (:mod:`tunekit.bench.suites.panels`): bandwidth against size.

matplotlib is optional (the ``plot`` extra): it is imported when a plot is drawn, never when tunekit
is, and its absence gives :class:`MatplotlibMissing` with the install command instead of an
ImportError deep in a run. Figures are drawn with ``matplotlib.figure.Figure`` directly, not
pyplot: no global figure state, no GUI backend, safe in tests and threads.

Why the plots look as they do: the y axis is GB/s (bytes the op must move over its time) with the
copy bandwidth measured in the same run as a dashed ceiling and a right-hand axis in % of it, so a
reader sees both the absolute figure and how close to the memory system's limit each contender
gets. Sizes are evenly spaced categories in the run's order (the benchmarks' shapes are sweeps in
powers of two, and logsumexp's differ by layout more than by size). Every candidate is a thin line;
the tuned choice, torch eager, torch.compile and a same-size copy are thick and drawn on top.
"""

from __future__ import annotations

import math
from pathlib import Path

from .suites.panels import COMPILE, EAGER, SAME_SIZE_COPY, TUNED, Panel

__all__ = ["MISSING_MESSAGE", "MatplotlibMissing", "plot_overview", "plot_panel", "require_matplotlib"]

MISSING_MESSAGE = ("plots need matplotlib, which is not installed here: pip install 'tunekit[plot]' "
                   "(or pip install matplotlib)")
STYLE = {  # the contenders a reader compares against, on top of the candidates
    TUNED: {"color": "#d62728", "lw": 2.6, "marker": "o", "ms": 5, "zorder": 6},
    EAGER: {"color": "#1f4e9c", "lw": 2.0, "ls": "--", "marker": "s", "ms": 4, "zorder": 5},
    COMPILE: {"color": "#2ca02c", "lw": 2.0, "ls": "-.", "marker": "^", "ms": 4, "zorder": 5},
    SAME_SIZE_COPY: {"color": "#555555", "lw": 1.8, "ls": ":", "marker": "D", "ms": 3, "zorder": 4},
}


class MatplotlibMissing(RuntimeError):
    """matplotlib is needed for plots and is not installed."""


def require_matplotlib():
    """``matplotlib.figure.Figure``, or :class:`MatplotlibMissing` saying how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MatplotlibMissing(MISSING_MESSAGE) from exc
    return Figure


def save_png(fig, path, dpi: int) -> Path:
    """Write ``fig`` as a 256-colour PNG: a third of the size of matplotlib's RGBA file and, for line
    plots on white, the same picture (the README's images stay well under 200 KB)."""
    from io import BytesIO

    from PIL import Image  # a matplotlib dependency

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)
    return path


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def big_copy(panel: Panel) -> str:
    """What the dashed ceiling is: tunekit.bench.measure.copy_bandwidth copies 1 GiB on CUDA, 256 MiB on the CPU."""
    return "256 MiB" if panel.timing.startswith("host") else "1 GiB"


def _values(panel: Panel, name: str) -> list[float]:
    return [p.gbps.get(name, math.nan) for p in panel.points]


def plot_panel(panel: Panel, path, *, dpi: int = 100) -> Path:
    """Every candidate, the tuned choice, torch eager, torch.compile and the same-size copy of one
    panel, GB/s against size, with the copy bandwidth as the ceiling."""
    Figure = require_matplotlib()
    from matplotlib import colormaps

    fig = Figure(figsize=(10.5, 5.2), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(panel.points)))
    palette = colormaps["tab20"]
    counts, n = panel.tuned_counts(), len(panel.points)
    for i, name in enumerate(panel.candidates()):
        label = name + (f"  [tuned choice at {counts[name]}/{n}]" if counts.get(name) else "")
        ax.plot(xs, _values(panel, name), lw=1.0, alpha=0.65, marker=".", ms=4, color=palette(i % 20), label=label)
    for name, style in STYLE.items():
        ys = _values(panel, name)
        if any(not math.isnan(y) for y in ys):
            ax.plot(xs, ys, label=name + (" (head to head)" if panel.suite == "activations" and name != SAME_SIZE_COPY
                                          else ""), **style)
    ax.axhline(panel.copy_gbps, color="black", ls="--", lw=1.2, zorder=3,
               label=f"copy, {big_copy(panel)} (same run): {panel.copy_gbps:.0f} GB/s")
    top = max([panel.copy_gbps] + [v for p in panel.points for v in p.gbps.values() if v and not math.isnan(v)])
    ax.set_ylim(0, top * 1.08)
    ax.set_xlim(-0.3, max(n - 0.7, 0.3))
    ax.set_xticks(xs, [f"{p.label}\n{human_bytes(p.nbytes)}" for p in panel.points], fontsize=7,
                  rotation=30 if n > 8 else 0)
    ax.set_xlabel("shape (bytes moved: reads + writes)", fontsize=8)
    ax.set_ylabel("GB/s (bytes moved / time)", fontsize=9)
    copy = panel.copy_gbps
    right = ax.secondary_yaxis("right", functions=(lambda g: 100 * g / copy, lambda q: q * copy / 100))
    right.set_ylabel(f"% of the {big_copy(panel)} copy", fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_title(f"{panel.title} on {panel.device}\n{panel.timing}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=6.5, frameon=False,
              ncol=2 if len(panel.candidates()) > 24 else 1)
    return save_png(fig, path, dpi)


def plot_overview(panels: list[Panel], path, *, title: str, dpi: int = 100) -> Path:
    """One subplot per dtype: the tuned choice (solid), torch eager (dashed) and torch.compile (dotted)
    of every panel, as % of the copy bandwidth, so a whole suite fits one picture."""
    Figure = require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    dtypes = list(dict.fromkeys(p.dtype for p in panels))
    fig = Figure(figsize=(4.2 * len(dtypes) + 2.2, 4.6), layout="constrained")
    axes = fig.subplots(1, len(dtypes), sharey=True, squeeze=False)[0]
    whats = list(dict.fromkeys(p.what for p in panels))
    palette = colormaps["tab10"]
    top = 100.0
    for ax, dtype in zip(axes, dtypes):
        group = [p for p in panels if p.dtype == dtype]
        labels = list(dict.fromkeys(pt.label for p in group for pt in p.points))
        for panel in group:
            color = palette(whats.index(panel.what) % 10)
            xs = [labels.index(pt.label) for pt in panel.points]
            for name, ls, lw in ((TUNED, "-", 2.0), (EAGER, "--", 1.2), (COMPILE, ":", 1.4)):
                ys = [100 * pt.gbps[name] / panel.copy_gbps if name in pt.gbps else math.nan for pt in panel.points]
                top = max([top] + [y for y in ys if not math.isnan(y)])
                ax.plot(xs, ys, ls=ls, lw=lw, color=color, marker="o" if name == TUNED else None, ms=3)
        ax.axhline(100, color="#888888", lw=1)
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_title(dtype, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"% of the {big_copy(panels[0])} copy bandwidth (same run)", fontsize=9)
    axes[0].set_ylim(0, top * 1.05)
    handles = [Line2D([], [], color=palette(i % 10), lw=2, label=w) for i, w in enumerate(whats)]
    handles += [Line2D([], [], color="black", lw=2, marker="o", ms=3, label="tuned choice"),
                Line2D([], [], color="black", lw=1.2, ls="--", label="torch eager"),
                Line2D([], [], color="black", lw=1.4, ls=":", label="torch.compile"),
                Line2D([], [], color="#888888", lw=1, label="100%: the copy")]
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.suptitle(f"{title} on {panels[0].device}: {panels[0].timing}", fontsize=10)
    return save_png(fig, path, dpi)
