"""The end-of-run report of ``python -m nbjit run``: per function, what dispatch did.

Per nbjit function that ran (the script's, routed from `jax.jit`; also one
collected before exit, `nbjit.observe.stats.retired`): calls, hits,
misses, slow calls with their reasons (`nbjit.stats()`), and, when the run
was profiled (the default), where the time of its calls went: in nbjit's
dispatch (keying, lookup, inputs, outputs of hits), in `execute_sharded`,
and in misses and slow calls, timed whole (`nbjit.profile()`); signatures
whose host inputs became resident; then the misses ranked by the time they took
(`nbjit.ranked_misses()`).
Every row is one function, named as `nbjit.stats()` names it. A call with
tracers inside another trace is not a slow call: it is counted as traced
(staged into that trace); an installed library's function whose calls all
were (optax's helpers inside the user's jitted step) is named on one line
apart from the table of the user's own functions.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from nbjit.observe import explain as _explain
from nbjit.observe import profile as _profile
from nbjit.observe import stats as _stats
from nbjit.observe.names import process_label
from nbjit.observe.table import Table

__all__ = ["build", "format_text", "merge", "read_json", "write_json"]

_DISPATCH_PHASES = [i for i, phase in enumerate(_profile.PHASES) if phase != "execute"]
_EXECUTE = _profile.PHASES.index("execute")


def build(profile: _profile.Profile | None) -> dict[str, Any]:
    """The report as plain data (what ``--json`` writes).

    A call made with tracers inside another trace (jit inside jit, grad,
    vmap, scan) is staged into that trace, as jax.jit's are: it counts as
    "traced", never as slow. `library` marks a function an installed
    library defines (`nbjit.observe.names.defined_in_library`)."""
    timing: dict[str, dict[str, float]] = {}
    if profile is not None:
        for name, (phases, whole) in profile.by_name().items():
            times = timing[name] = {"dispatch_ms": float(phases[:, _DISPATCH_PHASES].sum()) / 1e6,
                                  "execute_ms": float(phases[:, _EXECUTE].sum()) / 1e6,
                                  "miss_ms": 0.0, "slow_ms": 0.0, "traced_ms": 0.0}
            for kind, ns in whole:
                times[f"{kind}_ms"] += ns / 1e6
    functions = []
    libraries = _stats.library_names()
    # The live functions and those gone by exit (a step made inside main()):
    # the names profile.by_name() gives (function_label)
    for name, s in [*_stats.stats().items(), *_stats.retired().items()]:
        if not s.calls:
            continue  # made, never called: nothing ran
        row: dict[str, Any] = {"name": name, "calls": s.calls, "hits": s.hits, "misses": s.misses,
               "slow": s.slow, "traced": s.traced, "raised": s.raised,
               "slow_reasons": dict(s.slow_reasons),
               "library": name in libraries,
               "evictions": s.evictions, "miss_seconds": s.miss_seconds,
               "resident": s.resident}
        row.update(timing.get(name, {}))
        functions.append(row)
    functions.sort(key=lambda r: -r["calls"])
    # "process": multi-controller, whose report this is
    return {"process": process_label(), "profiled": profile is not None,
            "profile_overhead_us": profile.overhead_ns / 1e3 if profile is not None else None,
            "functions": functions,
            "ranked_misses": _explain.ranked_misses().to_dicts()}


def _inside_traces_only(row: dict[str, Any]) -> bool:
    """A library's function whose every call was staged into another trace
    (optax's helpers inside the user's jitted step): not the user's dispatch."""
    return bool(row.get("library")) and row.get("traced", 0) == row["calls"]


def format_text(report: dict[str, Any]) -> str:
    """The report as the text ``run`` prints: the functions nbjit dispatched
    (the user's own, and libraries' called outside any trace) in a table,
    with a "traced" column when some calls were staged into another trace;
    library functions that only ran inside the user's traces in one line."""
    all_rows = [r for r in report["functions"] if r["calls"]]
    if not all_rows:
        return "nbjit run: no nbjit function was called"
    rows = [r for r in all_rows if not _inside_traces_only(r)]
    staged = [r for r in all_rows if _inside_traces_only(r)]
    timed = report["profiled"]
    traced_column = any(r.get("traced", 0) for r in rows)
    raised_column = any(r.get("raised", 0) for r in rows)
    header = ["function", "calls", "hits", "misses", "slow"]
    if traced_column:
        header.append("traced")
    if raised_column:
        header.append("raised")
    if timed:
        header += ["dispatch ms", "execute ms", "miss ms", "slow ms"]
    header.append("slow reasons")
    body = []
    for r in rows:
        name = r["name"] if r.get("process") is None else f"{r['name']} [{_rank(r['process'])}]"
        cells = [name, str(r["calls"]), str(r["hits"]), str(r["misses"]), str(r["slow"])]
        if traced_column:
            cells.append(str(r.get("traced", 0)))
        if raised_column:
            cells.append(str(r.get("raised", 0)))
        if timed:
            cells += [f"{r.get(k, 0.0):.2f}" for k in ("dispatch_ms", "execute_ms", "miss_ms",
                                                      "slow_ms")]
        cells.append(", ".join(f"{k} {v}" for k, v in sorted(r["slow_reasons"].items())) or "-")
        body.append(cells)
    lines = ["nbjit run: dispatch report" + (f" ({report['process']})"
                                             if report.get("process") else "")]
    if body:
        lines += Table(header, body, right=frozenset(range(1, len(header) - 1))).lines()
    if traced_column:
        lines.append("traced = calls with tracers inside another trace (jit, grad, vmap, scan): "
                     "staged into that trace, as jax.jit's are; not slow")
    if raised_column:
        lines.append(f"raised = {_stats.RAISED}")
    if staged:
        names = "; ".join(f"{r['name']}: {r['calls']} call{'s' if r['calls'] != 1 else ''}"
                          for r in staged)
        lines.append(f"library functions run only inside your traces (staged into them, as "
                     f"under jax.jit): {names}")
    for r in rows:
        line = _stats.host_inputs_line(r["name"], r.get("resident", 0))
        if line:
            lines.append(line)
    if timed:
        lines.append(
            "dispatch = key + lookup + inputs + outputs of hits; execute = execute_sharded of "
            f"hits; misses and slow calls timed whole; profiling adds "
            f"~{report['profile_overhead_us']:.2f} us per call (--no-profile to skip timing)")
    lines += _ranked_text(report.get("ranked_misses", []))
    return "\n".join(lines)


RANKED_SHOWN = 10  # rows of the ranked misses the text report prints (--json has all)


def _ranked_text(ranked: list[dict[str, Any]]) -> list[str]:
    if not ranked:
        return []
    shown = _explain.RankedMisses([_explain.RankedMiss(
        r["function"], r["site"], tuple(r["fields"]), r["count"], r["seconds"], r["example"])
        for r in ranked[:RANKED_SHOWN]])
    lines = ["", "nbjit run: misses by the time they took (grouped by function, call site and "
             "the fields that differed from the closest cached entry)", str(shown)]
    if len(ranked) > RANKED_SHOWN:
        lines.append(f"... and {len(ranked) - RANKED_SHOWN} more groups (--json has them all)")
    return lines


def _rank(process: str) -> str:
    """"p0" for "process 0 of 2"."""
    return "p" + process.split()[1]


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the per-process reports of a multi-controller run
    (``python -m nbjit run --json F`` writes ``F.0``, ``F.1``, ...): every row
    keeps its process, rows of one function sit together, misses are ranked
    over all processes."""
    functions = [{**row, "process": r.get("process")} for r in reports for row in r["functions"]]
    functions.sort(key=lambda row: (row["name"], row["process"] or ""))
    ranked = [{**m, "function": m["function"] + (f" [{_rank(r['process'])}]"
                                                 if r.get("process") else "")}
              for r in reports for m in r.get("ranked_misses", [])]
    ranked.sort(key=lambda m: -m["seconds"])
    overheads = [r["profile_overhead_us"] for r in reports if r.get("profile_overhead_us")]
    processes = [r["process"] for r in reports if r.get("process")]
    return {"process": f"merged from {len(reports)} reports" + (
                f": {', '.join(processes)}" if processes else ""),
            "profiled": bool(reports) and all(r["profiled"] for r in reports),
            "profile_overhead_us": max(overheads) if overheads else None,
            "functions": functions, "ranked_misses": ranked}


def read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=_json_value)


def _json_value(o: Any) -> Any:
    """What json cannot write itself: numpy scalars as floats, the rest as text."""
    scalar: Any = o  # (np.isscalar narrows to types float() does not take)
    return float(scalar) if np.isscalar(o) else str(o)
