"""The first-use benchmark's goals, their verdicts and its Markdown report.

Pure functions of the rows :mod:`tunekit.bench.suites.first_use` writes (plain dicts), so the
verdicts are tested on made-up rows without a GPU. A row is one signature met by a fresh process
("empty" or "warm" caches): the wall time of every call until the process's choice was final, the
choice in effect after call 1, after call 20 and at the end, what offline tuning chooses, and the
device time per call of each of those choices, torch eager, torch.compile and a same-size copy,
timed head to head.

Every limit is inclusive: a value exactly at the limit passes.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..._version import __version__
from .common import fmt, shape_text

__all__ = ["STATES", "ACTIVATIONS", "FIRST_CALL_S", "RESUME_MS", "CALLS", "SHARE_PCT", "RATIO", "COPY_MEDIAN_PCT",
           "ROW_GOALS", "device_ms", "tuning_share", "copy_pct", "copy_group", "evaluate", "summarize", "label",
           "progress_line", "new_results", "read_lines", "merge_child", "write_files", "render"]

STATES = ("empty", "warm")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
#: the first call of a new signature, wall time in s, by cache state
FIRST_CALL_S = {"empty": 0.5, "warm": 0.1}
#: any later call that resumes tuning, wall time in ms
RESUME_MS = 20.0
#: a program of CALLS calls spends at most SHARE_PCT % of its time tuning
CALLS, SHARE_PCT = 10_000, 1.0
#: device time of a choice against its reference (offline's choice; torch): at most RATIO x
RATIO = 1.02
#: median % of a same-size copy's device time, by group of signatures
COPY_MEDIAN_PCT = {"activations": 95.0, "logsumexp fwd": 90.0, "logsumexp bwd": 85.0}

#: goal key -> (what it asks, its limit in words); evaluated per row
ROW_GOALS = {
    "first_call": ("first call of a new signature, wall incl. compilation (s)",
                   f"<= {FIRST_CALL_S['empty']:g} s empty, <= {FIRST_CALL_S['warm']:g} s warm"),
    "resume_call": ("slowest later call that resumed tuning (ms)", f"<= {RESUME_MS:g} ms"),
    "tuning_share": (f"% of a {CALLS:,}-call program's time spent tuning (net of torch eager's own first call)",
                     f"<= {SHARE_PCT:g}%"),
    "choice_vs_offline": ("device time of the choice after call 20 / offline tuning's choice", f"<= {RATIO:g}"),
    "vs_eager": ("activations: device time after first use / torch eager", f"<= {RATIO:g}"),
    "vs_torch": ("device time after first use / the faster of torch eager and torch.compile", f"<= {RATIO:g}"),
}
VERDICTS = ("pass", "fail", "open", "missing", "n/a")


def device_ms(row: dict, which: str) -> float | None:
    """Device time per call (ms) of a choice: ``which`` is "call1", "call20", "final" or "offline"."""
    if which == "offline":
        name = (row.get("offline") or {}).get("choice")
    else:
        name = (row.get("choice") or {}).get(which)
    return ((row.get("device_ms") or {}).get("tunekit") or {}).get(name)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def torch_first_ms(row: dict) -> float:
    """What torch eager's first call of the signature cost beyond its steady call (ms; 0 unmeasured)."""
    first, steady = row.get("torch_first_call_ms"), row.get("torch_steady_call_ms")
    return max(0.0, first - steady) if first is not None and steady is not None else 0.0


def tuning_share(row: dict, net: bool = True) -> float | None:
    """% of a CALLS-call program's time spent tuning: the wall of the calls until the choice was final
    less what as many calls of the final choice take (never below 0: that is noise) and, with
    ``net``, less what torch eager's own first call costs beyond its steady call (a program without
    tunekit pays that too: torch's lazy kernel loading), against that overhead plus CALLS calls of
    the final choice. None when the choice never became final."""
    n, steady = row.get("calls_until_final"), row.get("steady_call_ms")
    if n is None or steady is None:
        return None
    walls = row.get("walls_sum_ms", sum(row["call_walls_ms"][:n]))  # the sum of every call's wall until final
    overhead = max(0.0, walls - n * steady - (torch_first_ms(row) if net else 0.0))
    total = overhead + CALLS * steady
    return 100.0 * overhead / total if total > 0 else 0.0


def copy_pct(row: dict) -> float | None:
    """The final choice's bandwidth (``bytes`` over its time) as % of the same-size copy's (``copy_bytes``,
    the op's bytes rounded down to whole elements, over the copy's time)."""
    t, copy = device_ms(row, "final"), (row.get("device_ms") or {}).get("copy")
    if not t or not copy:
        return None
    return 100.0 * copy * row["bytes"] / (t * row["copy_bytes"])


def copy_group(row: dict) -> str:
    return "activations" if row["family"] in ACTIVATIONS else f"{row['family']} {row['direction']}"


def _at_most(value: float | None, limit: float) -> tuple[float | None, str]:
    return value, "missing" if value is None else "pass" if value <= limit else "fail"


def evaluate(row: dict) -> dict[str, tuple[float | None, str]]:
    """{goal key: (value, verdict)} for ROW_GOALS. Verdicts: "pass", "fail", "open" (the choice
    never became final, so the share is unknown), "missing" (not measured), "n/a" (does not apply)."""
    first = row.get("first_call_ms")
    out = {"first_call": _at_most(None if first is None else first / 1e3, FIRST_CALL_S[row["state"]])}
    if row.get("calls_until_final") == 1:
        out["resume_call"] = (None, "n/a")  # final on the first call: no later call resumed tuning
    else:
        out["resume_call"] = _at_most(row.get("max_later_call_ms"), RESUME_MS)
    out["tuning_share"] = (None, "open") if not row.get("final_reached") else _at_most(tuning_share(row), SHARE_PCT)
    out["choice_vs_offline"] = _at_most(_ratio(device_ms(row, "call20"), device_ms(row, "offline")), RATIO)
    final, times = device_ms(row, "final"), row.get("device_ms") or {}
    if row["family"] in ACTIVATIONS:
        out["vs_eager"] = _at_most(_ratio(final, times.get("eager")), RATIO)
    else:
        out["vs_eager"] = (None, "n/a")
    torch_times = [t for t in (times.get("eager"), times.get("compile")) if t]
    out["vs_torch"] = _at_most(_ratio(final, min(torch_times) if torch_times else None), RATIO)
    return out


def _verdict(counts: dict[str, int]) -> str:
    if counts["fail"]:
        return "FAIL"
    if counts["pass"]:
        return "PASS"
    return "OPEN" if counts["open"] else "n/a" if not counts["missing"] else "not measured"


def summarize(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{state: {goal: {verdict counts, "median", "verdict"}}} for every state with rows: ROW_GOALS
    counted row by row, and the COPY_MEDIAN_PCT goals ("copy:<group>") on the median of the group."""
    out = {}
    for state in STATES:
        sub = [r for r in rows if r["state"] == state]
        if not sub:
            continue
        goals = {}
        evaluated = [evaluate(r) for r in sub]
        for key in ROW_GOALS:
            counts = {v: 0 for v in VERDICTS}
            values = []
            for e in evaluated:
                value, verdict = e[key]
                counts[verdict] += 1
                if value is not None and verdict != "n/a":
                    values.append(value)
            goals[key] = {**counts, "median": statistics.median(values) if values else None,
                          "verdict": _verdict(counts)}
        for group, limit in COPY_MEDIAN_PCT.items():
            values = [p for p in (copy_pct(r) for r in sub if copy_group(r) == group) if p is not None]
            median = statistics.median(values) if values else None
            goals[f"copy:{group}"] = {"n": len(values), "median": median,
                                      "verdict": "n/a" if median is None else "PASS" if median >= limit else "FAIL"}
        out[state] = goals
    return out


def label(family: str, direction: str, shape, dim, dtype: str) -> str:
    return f"{family} {direction} {shape_text(shape)}{'' if dim is None else f':{dim}'} {dtype}"


def progress_line(row: dict) -> str:
    """One line per measured signature, for the log."""
    e, final = evaluate(row), device_ms(row, "final")
    calls = row["calls_until_final"] or f">{len(row['call_walls_ms'])}"
    what = label(row["family"], row["direction"], row["shape"], row["dim"], row["dtype"])
    return (f"[{row['family']} {row['state']}] {what}: first call {row['first_call_ms']:.1f} ms, final after {calls} "
            f"calls (slowest later {fmt(row['max_later_call_ms'], '.1f')} ms) -> {row['choice']['final']} | offline "
            f"{(row.get('offline') or {}).get('choice')} | call-20 choice/offline {fmt(e['choice_vs_offline'][0], '.3f')}"
            f" | final/best torch {fmt(e['vs_torch'][0], '.3f')} | final {fmt(final and final * 1e3, '.1f')} us")


def new_results(command: str, args: dict | None, options: dict) -> dict:
    """The run's results before any child: what ran it and how (``options``: :func:`first_use.run`'s)."""
    cpu_bytes = options.get("copy_nbytes") or 2**28
    return {"suite": "first_use", "device": "unknown", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "tunekit": __version__, "versions": {}, "command": command, "args": args, "options": options,
            "copy_label": "1 GiB" if options.get("copy_nbytes") is None and options["device"].startswith("cuda")
            else f"{cpu_bytes / 2**20:.0f} MiB", "settings": {}, "children": [], "rows": [], "not_measured": [],
            "elapsed_s": 0.0, "final": False}


def read_lines(path: Path) -> list[dict]:
    """A child's rows file: one JSON object a line (the last line of a killed child may be cut: skipped)."""
    lines = []
    for text in path.read_text().splitlines() if path.exists() else []:
        try:
            lines.append(json.loads(text))
        except ValueError:
            pass
    return lines


def merge_child(raw: dict, family: str, state: str, expected: list[str], result: dict) -> None:
    """A child's rows file (``result["rows"]``) into the run's results ``raw``; ``expected``: the labels
    of the signatures it was given, so those it never reached are listed as not measured."""
    lines = read_lines(Path(result["rows"]))
    meta = next((x for x in lines if x["kind"] == "meta"), {})
    for key in ("device", "versions", "timing", "settings"):
        if meta.get(key) is not None and raw.get(key) in (None, "unknown", {}):
            raw[key] = meta[key]
    rows = [{k: v for k, v in x.items() if k != "kind"} for x in lines if x["kind"] == "row"]
    raw["rows"] += rows
    seen = {label(r["family"], r["direction"], r["shape"], r["dim"], r["dtype"]) for r in rows}
    skipped = [x["label"] for x in lines if x["kind"] == "not_measured"]
    seen |= {s.split(" (")[0] for s in skipped}
    raw["not_measured"] += [f"{state}: {s}" for s in skipped + [e + " (process ended)" for e in expected if e not in seen]]
    ended = any(x["kind"] == "end" for x in lines)
    raw["children"].append({"family": family, "state": state, "rc": result["rc"], "seconds": result["seconds"],
                            "ready_s": meta.get("ready_s"), "copy_gbps": meta.get("copy_gbps"), "signatures": len(rows),
                            "error": None if result["rc"] == 0 and ended else " | ".join(result["tail"][-6:])})


def write_files(raw: dict, out) -> list[Path]:
    """``first_use-<device>.json`` (every raw number) and ``.md`` (the report) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if raw["options"].get("shipped", True) else "-no_shipped"
    stem = out / f"first_use-{raw['device'].replace(' ', '_')}{suffix}"
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(raw, indent=1, default=str) + "\n")
    paths[1].write_text(render(raw))
    return paths


# -- Markdown -----------------------------------------------------------------------------------
def _goal_lines(rows: list[dict]) -> list[str]:
    summary = summarize(rows)
    states = [s for s in STATES if s in summary]
    lines = ["## Goals", "", ("Per signature: how many pass and fail (open: the choice was not final within the "
                              "calls allowed; missing: not measured) and the median. Limits are inclusive."), "",
             "| goal | limit | " + " | ".join(f"{s} cache" for s in states) + " |",
             "|---|---|" + "---|" * len(states)]
    specs = {"first_call": ".3f", "resume_call": ".1f", "tuning_share": ".2f"}
    for key, (what, limit) in ROW_GOALS.items():
        cells = []
        for s in states:
            g = summary[s][key]
            extra = "".join(f", {g[v]} {v}" for v in ("open", "missing") if g[v])
            cells.append(f"**{g['verdict']}**: {g['pass']} pass, {g['fail']} fail{extra} (median "
                         f"{fmt(g['median'], specs.get(key, '.3f'))})")
        lines.append(f"| {what} | {limit} | " + " | ".join(cells) + " |")
    lines += [_first_call_cells(rows), _call1_cells(rows)]
    for group, limit in COPY_MEDIAN_PCT.items():
        goals = [summary[s][f"copy:{group}"] for s in states]
        cells = [f"**{g['verdict']}**: median {fmt(g['median'])}% of {g['n']} signatures" if g["n"] else "no signature"
                 for g in goals]
        lines.append(f"| {group}: median % of a same-size copy, after first use | >= {limit:g}% | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def _first_call_cells(rows: list[dict]) -> str:
    """A table line splitting the first calls: each process's first signature (which pays the process's
    one-off costs: extension builds, Triton's import) and the others."""
    cells = []
    for state in STATES:
        sub = [r for r in rows if r["state"] == state]
        if not sub:
            continue
        firsts = [r["first_call_ms"] / 1e3 for r in sub if r.get("first_in_process")]
        others = [r["first_call_ms"] / 1e3 for r in sub if not r.get("first_in_process")]
        cells.append(f"processes' first: {', '.join(f'{v:.2f}' for v in firsts) or '–'}; the others: median "
                     f"{fmt(statistics.median(others) if others else None, '.3f')}, max {fmt(max(others, default=None), '.3f')}")
    return "| first call (s), split: each process's first signature, and the others | – | " + " | ".join(cells) + " |"


def _call1_cells(rows: list[dict]) -> str:
    """A table line, for information: the choice after the first call against offline tuning's (the goal
    allows up to 20 calls)."""
    cells = []
    for state in STATES:
        ratios = [x for x in (_ratio(device_ms(r, "call1"), device_ms(r, "offline")) for r in rows
                              if r["state"] == state) if x is not None]
        if any(r["state"] == state for r in rows):
            cells.append(f"{sum(x <= RATIO for x in ratios)} within, {sum(x > RATIO for x in ratios)} not (median "
                         f"{fmt(statistics.median(ratios) if ratios else None, '.3f')})")
    return f"| for information: the choice after call 1 / offline tuning's | <= {RATIO:g} | " + " | ".join(cells) + " |"


def _choices(row: dict) -> str:
    c = row.get("choice") or {}
    names = [c.get("call1"), c.get("call20"), c.get("final")]
    if len(set(names)) == 1:
        return f"{names[0]}"
    return " / ".join(str(n) for n in names)


def _row_line(r: dict) -> str:
    e, dm = evaluate(r), r.get("device_ms") or {}
    us = lambda ms: fmt(ms and ms * 1e3, ".1f")  # noqa: E731
    shape = shape_text(r["shape"]) + (f":{r['dim']}" if r.get("dim") is not None else "")
    calls = (str(r["calls_until_final"]) + (f" ({r['s_until_final']:.1f} s)" if r.get("s_until_final", 0) > 0.1 else "")
             if r.get("final_reached") else f"> {r.get('calls_made') or len(r.get('call_walls_ms') or [])}")
    compile_cell = us(dm.get("compile")) + (f" ({r['compile_s']:.1f} s)" if r.get("compile_s") else "")
    mark = lambda key, spec: fmt(e[key][0], spec) + (" ✗" if e[key][1] == "fail" else "")  # noqa: E731
    first = mark("first_call", ".3f") + (" (process's first)" if r.get("first_in_process") else "")
    return (f"| {r['direction']} | {shape} | {r['dtype']} | {first} | {calls} | "
            f"{mark('resume_call', '.1f')} | {_choices(r)} | {(r.get('offline') or {}).get('choice', '–')} | "
            f"{us(device_ms(r, 'final'))} | {us(device_ms(r, 'offline'))} | "
            f"{fmt(_ratio(device_ms(r, 'call1'), device_ms(r, 'offline')), '.3f')} / {mark('choice_vs_offline', '.3f')} | "
            f"{us(dm.get('eager'))} | {compile_cell} | {mark('vs_torch', '.3f')} | {fmt(copy_pct(r))} | "
            f"{mark('tuning_share', '.2f')} ({fmt(tuning_share(r, net=False), '.2f')}; torch "
            f"{fmt(r.get('torch_first_call_ms'), '.1f')}) |")


def _family_lines(family: str, state: str, rows: list[dict]) -> list[str]:
    lines = [f"## {family}, {state} cache", "",
             ("| dir | shape | dtype | first call s | calls until final | max later call ms | choice after call "
              "1 / 20 / final | offline choice | final µs | offline µs | choice after call 1 / call 20 over offline | eager µs | "
              "compile µs (compile time) | final / best torch | % same-size copy | tuning % of 10k calls (raw; torch's first call ms) |"),
             "|---|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [_row_line(r) for r in rows]
    errors = [f"- {r['direction']} {shape_text(r['shape'])} {r['dtype']}, {what}: `{text}`"
              for r in rows for what, text in (r.get("errors") or {}).items()]
    return lines + (["", "Errors:", ""] + errors if errors else []) + [""]


def _head(raw: dict) -> list[str]:
    v, s = raw.get("versions") or {}, raw.get("settings") or {}
    gbps = [c["copy_gbps"] for c in raw.get("children", []) if c.get("copy_gbps")]
    bw = (f"**{statistics.median(gbps):.0f} GB/s** (median of the {len(gbps)} processes, "
          f"{min(gbps):.0f}-{max(gbps):.0f})" if gbps else "not measured")
    return [f"# First use: {raw['device']} ({raw['date'][:10]})", "",
            (f"tunekit {raw.get('tunekit', '?')}, torch {v.get('torch')}, CUDA {v.get('cuda')}, triton {v.get('triton')}; "
             f"`{raw['command']}`; run took {raw['elapsed_s']:.0f} s. Every process ran with "
             f"tunekit's default settings (max_tuning_ms {s.get('max_tuning_ms')}, tuning_step_ms "
             f"{s.get('tuning_step_ms')}, margin {s.get('margin')}) and a fresh results file."), "",
            f"{raw.get('copy_label', '1 GiB')} copy bandwidth (read + write, eager): {bw}.", "", _shipped_line(raw), "",
            ("One fresh process per op family and cache state: 'empty' (fresh tunekit, Triton and Inductor cache "
             "folders), then 'warm' (the same folders again). First call: the public function's wall time, "
             "synchronized, tuning and compilation included; a process's first signature also pays what any "
             "program's first call of that kernel pays (torch's lazy loading of its own kernel: ~8 ms for "
             "torch's silu, `benchmarks/experiments/first_call_profile.py`). The device times (µs per call) are timed head to head "
             f"({raw.get('timing', '?')}). Offline: `tune_params` (every candidate warmed, then "
             "find_fastest) with the same default settings, an incomplete attempt retried with twice the "
             "budget. The method: the docstring of "
             "`src/tunekit/bench/suites/first_use.py`."), "",
            ("Columns: 'calls until final': calls until `op.decision` gave the final choice ('> N': not final after N "
             "calls); 'max later call': the slowest of calls 2 to final (each resumed tuning); the choices in effect "
             "after call 1 / call 20 / at the end (one name when all agree); 'final / best torch': the final choice's "
             "device time over the faster of torch eager and torch.compile; 'tuning % of 10k calls': the wall of the "
             "calls until final less as many calls of the final choice and less what torch eager's own first call "
             "of the signature cost beyond its steady call (a program without tunekit pays that too; measured after "
             "tunekit's calls, a process's first signature in a fresh process of its own), over that plus 10,000 "
             "calls of the final choice (walls synchronized after each call); in brackets the share without that "
             "deduction, and torch's first call (ms); ✗: misses its goal."), ""]


def _shipped_line(raw: dict) -> str:
    """Whether the processes used shipped pre-tuned results, and how many signatures they decided."""
    if not raw["options"].get("shipped", True):
        return ("Shipped pre-tuned results: **off** (`TUNEKIT_USE_SHIPPED=0`): every signature is tuned online, as on "
                "a GPU model, driver or torch release that tunekit ships no results for.")
    by_shipped = sum("shipped" in (r.get("why") or "") for r in raw["rows"])
    return (f"Shipped pre-tuned results: **on** (the default): {by_shipped} of {len(raw['rows'])} signatures were "
            "decided by them at their first call (`src/tunekit/pretuned/`: offline tuning of these suites' "
            "signatures on this GPU model); the rest were tuned online. The shipped builds of the chosen kernels "
            "(`<GPU>.kernels.zip`: NVRTC cubins, Triton cache entries) came with them: an 'empty' cache is the "
            "user's cache folders, empty; a chosen kernel whose build matches loads instead of compiling.")


def render(raw: dict) -> str:
    """The Markdown report: head (device, versions, copy bandwidth), the goals, a table per family and state."""
    rows = raw["rows"]
    lines = _head(raw) + (_goal_lines(rows) if rows else ["No signature was measured.", ""])
    for family in dict.fromkeys(r["family"] for r in rows):
        for state in STATES:
            sub = [r for r in rows if r["family"] == family and r["state"] == state]
            if sub:
                lines += _family_lines(family, state, sub)
    lines += ["## Processes", "", "| family | cache | exit | start s | ran s | copy GB/s | signatures |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for c in raw.get("children", []):
        lines.append(f"| {c['family']} | {c['state']} | {c['rc']} | {fmt(c.get('ready_s'), '.1f')} | "
                     f"{c['seconds']:.0f} | {fmt(c.get('copy_gbps'), '.0f')} | {c['signatures']} |")
    problems = [f"- {c['family']} {c['state']}: exit {c['rc']}: `{c['error']}`" for c in raw.get("children", [])
                if c.get("error")]
    if raw.get("not_measured"):
        lines += ["", "Not measured (the run's time limit): " + ", ".join(raw["not_measured"])]
    if problems:
        lines += ["", "Processes that failed:", ""] + problems
    return "\n".join(lines) + "\n"
