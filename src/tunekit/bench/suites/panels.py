"""A results JSON as plain series to plot: one :class:`Panel` per op (or case), direction and dtype,
one :class:`Point` per measured shape, GB/s per contender. No matplotlib here, so the extraction is
tested on any machine and the plotting code only draws.

Three sources are read: ``benchmarks/suites/activations.py`` / ``tunekit bench`` activations files
(``"results"``), logsumexp files (``"rows"``) and ``tunekit explore --json`` output (one dict or a
list of them, with ``"candidates"``). Bandwidth is bytes moved over time, so every contender of one
point is scaled by the same bytes; the same-size copy moves its own bytes (``copy_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .common import shape_text

__all__ = ["COMPILE", "EAGER", "HIGHLIGHTS", "SAME_SIZE_COPY", "TUNED", "Panel", "Point", "panels_from", "suite_of"]

TUNED, EAGER, COMPILE, SAME_SIZE_COPY = "tuned choice", "torch eager", "torch.compile", "same-size copy"
HIGHLIGHTS = (TUNED, EAGER, COMPILE, SAME_SIZE_COPY)
DIRECTION_WORDS = {"fwd": "forward", "bwd": "backward"}


def _gbps(nbytes, ms) -> float | None:
    return nbytes / (ms * 1e-3) / 1e9 if ms else None


@dataclass
class Point:
    label: str                   # the shape (and reduced dim), as the tables write it
    nbytes: int                  # bytes the op moves (reads + writes)
    gbps: dict[str, float] = field(default_factory=dict)  # contender -> GB/s; contenders not measured are absent
    tuned_name: str | None = None


@dataclass
class Panel:
    suite: str                   # "activations", "logsumexp" or "explore"
    key: str                     # file stem, e.g. "silu-float16", "fwd-bfloat16"
    what: str                    # the op and direction, e.g. "gelu forward (tanh)"
    dtype: str
    device: str
    copy_gbps: float             # the big copy measured in the same run (the ceiling the % are of)
    timing: str                  # how times were taken, for the subtitle
    points: list[Point] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.what}, {self.dtype}"

    def candidates(self) -> list[str]:
        """Candidates measured at some point, in the order the run listed them."""
        seen = {}
        for p in self.points:
            for name in p.gbps:
                if name not in HIGHLIGHTS:
                    seen.setdefault(name, None)
        return list(seen)

    def tuned_counts(self) -> dict[str, int]:
        """How many points each candidate was the tuned choice at."""
        counts: dict[str, int] = {}
        for p in self.points:
            if p.tuned_name:
                counts[p.tuned_name] = counts.get(p.tuned_name, 0) + 1
        return counts


def suite_of(raw) -> str:
    """Which writer made ``raw``: "activations", "logsumexp" or "explore"."""
    if isinstance(raw, list) or ("candidates" in raw and "op" in raw):
        return "explore"
    if "results" in raw:
        return "activations"
    if "rows" in raw:
        return "logsumexp"
    raise ValueError("not a tunekit results file: expected an activations ('results'), logsumexp ('rows') "
                     "or tunekit explore --json ('candidates') file")


def _timing(raw: dict, repeats) -> str:
    device_arg = str(raw.get("args", {}).get("device", "cuda"))
    how = raw.get("timing") or ("host timer" if device_arg.startswith("cpu") else "CUDA-graph replay, L2-cold inputs")
    return f"{how}, median of {repeats}" if repeats else how


def activations_panels(raw: dict) -> list[Panel]:
    from .activations import CASES  # the case's op and direction, for the title

    panels = []
    timing = _timing(raw, raw.get("args", {}).get("repeats"))
    for entry in raw["results"].values():
        case = CASES.get(entry["case"])
        words = f"{case.op} {DIRECTION_WORDS[case.direction]}" if case else entry["case"]
        if case and case.op_args.get("approximate") == "tanh":
            words += " (tanh)"
        panel = Panel("activations", f"{entry['case']}-{entry['dtype']}", words, entry["dtype"],
                      raw["device"], raw["copy_gbps_start"], timing)
        for r in sorted(entry["rows"], key=lambda r: r["bytes"]):  # stable: shapes of one size keep their order
            point = Point(shape_text(r["shape"]), r["bytes"], tuned_name=r["tuned"]["name"])
            for name, c in r["candidates"].items():
                if c["status"] == "ok":
                    point.gbps[name] = _gbps(r["bytes"], c["time_ms"])
            for name, ms in ((TUNED, r["tuned"].get("time_ms")), (EAGER, r.get("eager_ms")), (COMPILE, r.get("compile_ms"))):
                if ms:
                    point.gbps[name] = _gbps(r["bytes"], ms)
            if r.get("copy_ms"):
                point.gbps[SAME_SIZE_COPY] = _gbps(r["copy_bytes"], r["copy_ms"])
            panel.points.append(point)
        panels.append(panel)
    return panels


def logsumexp_panels(raw: dict) -> list[Panel]:
    """One panel per direction and dtype; points in the run's order (the suite's shapes go from short
    rows to long ones, which says more than sorting by size)."""
    groups: dict[tuple[str, str], Panel] = {}
    timing = _timing(raw, raw.get("args", {}).get("repeats"))
    for r in raw["rows"]:
        key = (r["direction"], r["dtype"])
        if key not in groups:
            what = "logsumexp forward" if r["direction"] == "fwd" else "logsumexp backward"
            groups[key] = Panel("logsumexp", f"{r['direction']}-{r['dtype']}", what, r["dtype"],
                                raw["device"], raw["copy_gbps_start"], timing)
        point = Point(f"{shape_text(r['shape'])} dim {r['dim']}", r["bytes"], tuned_name=(r.get("tuned") or {}).get("name"))
        for name, c in r["candidates"].items():
            if c.get("status") == "ok":
                point.gbps[name] = _gbps(r["bytes"], c["time_ms"])
        for name, ms in ((TUNED, r.get("tuned_ms")), (EAGER, r.get("eager_ms")), (COMPILE, r.get("compile_ms"))):
            if ms:
                point.gbps[name] = _gbps(r["bytes"], ms)
        groups[key].points.append(point)
    return list(groups.values())


def explore_panels(raw) -> list[Panel]:
    """``tunekit explore --json`` output (one shape or several) as one panel per op and dtype. The
    default candidate is torch's own kernel, so it is the "torch eager" line as well."""
    results = raw if isinstance(raw, list) else [raw]
    groups: dict[tuple[str, str], Panel] = {}
    for res in results:
        key = (res["op"], res["dtype"])
        if key not in groups:
            extra = "".join(f", {k}={v}" for k, v in res.get("arguments", {}).items())
            device = res["device"].removeprefix("device: ").split(" (")[0]
            timing = "CUDA-graph replay, L2-cold inputs" if not device.startswith("cpu") else "host timer"
            groups[key] = Panel("explore", f"{res['op']}-{res['dtype']}", f"{res['op']}{extra}",
                                res["dtype"], device, res["copy_gbps"], f"{timing}, median of {res.get('repeats', 20)}")
        point = Point(shape_text(res["shape"]), res["bytes"], tuned_name=res["tuned_choice"])
        for row in res["candidates"]:
            if row.get("gbps"):
                point.gbps[row["candidate"]] = row["gbps"]
                if row["tuned_choice"]:
                    point.gbps[TUNED] = row["gbps"]
        groups[key].points.append(point)
    for panel in groups.values():
        panel.points.sort(key=lambda p: p.nbytes)
    return list(groups.values())


def panels_from(raw) -> list[Panel]:
    """Every panel of a results file, whichever writer made it."""
    return {"activations": activations_panels, "logsumexp": logsumexp_panels, "explore": explore_panels}[suite_of(raw)](raw)
