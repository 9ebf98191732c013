"""The end-of-run report of ``python -m nbjit run``: per function, what dispatch did.

Per live nbjit function (the script's, routed from `jax.jit`): calls, hits,
misses, slow calls with their reasons (`nbjit.stats()`), and, when the run
was profiled (the default), where the time of its calls went: in nbjit's
dispatch (keying, lookup, inputs, outputs of hits), in `execute_sharded`,
and in misses and slow calls, timed whole (`nbjit.profile()`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from nbjit import _profile, _stats

__all__ = ["build", "format_text", "write_json"]

_DISPATCH_PHASES = [i for i, phase in enumerate(_profile.PHASES) if phase != "execute"]
_EXECUTE = _profile.PHASES.index("execute")


def build(profile: _profile.Profile | None) -> dict[str, Any]:
    """The report as plain data (what ``--json`` writes)."""
    timing: dict[str, dict[str, float]] = {}
    if profile is not None:
        for jitted in profile.functions():
            phases = profile.phases_ns(jitted)
            whole = profile.whole_ns(jitted)
            name = _stats.qualified_name(getattr(jitted, "_fun", jitted))
            row = timing.setdefault(name, {"dispatch_ms": 0.0, "execute_ms": 0.0,
                                           "miss_ms": 0.0, "slow_ms": 0.0})
            row["dispatch_ms"] += float(phases[:, _DISPATCH_PHASES].sum()) / 1e6
            row["execute_ms"] += float(phases[:, _EXECUTE].sum()) / 1e6
            for kind, ns in whole:
                row[f"{kind}_ms"] += ns / 1e6
    functions = []
    for name, s in _stats.stats().items():
        row = {"name": name, "calls": s.calls, "hits": s.hits, "misses": s.misses,
               "slow": s.slow, "slow_reasons": dict(s.slow_reasons),
               "evictions": s.evictions, "miss_seconds": s.miss_seconds}
        row.update(timing.get(name.split("#")[0], {}))
        functions.append(row)
    functions.sort(key=lambda r: -r["calls"])
    from nbjit._agreement import process_label  # multi-controller: whose report this is

    return {"process": process_label(), "profiled": profile is not None,
            "profile_overhead_us": profile.overhead_ns / 1e3 if profile is not None else None,
            "functions": functions}


def format_text(report: dict[str, Any]) -> str:
    rows = report["functions"]
    if not rows:
        return "nbjit run: no nbjit function was called (is jax.jit bound before the patch?)"
    timed = report["profiled"]
    header = ["function", "calls", "hits", "misses", "slow"]
    if timed:
        header += ["dispatch ms", "execute ms", "miss ms", "slow ms"]
    header.append("slow reasons")
    body = []
    for r in rows:
        cells = [r["name"], str(r["calls"]), str(r["hits"]), str(r["misses"]), str(r["slow"])]
        if timed:
            cells += [f"{r.get(k, 0.0):.2f}" for k in ("dispatch_ms", "execute_ms", "miss_ms",
                                                      "slow_ms")]
        cells.append(", ".join(f"{k} {v}" for k, v in sorted(r["slow_reasons"].items())) or "-")
        body.append(cells)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["nbjit run: dispatch report" + (f" ({report['process']})"
                                             if report.get("process") else "")]
    for row in [header, *body]:
        lines.append("  ".join(c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    if timed:
        lines.append(
            "dispatch = key + lookup + inputs + outputs of hits; execute = execute_sharded of "
            f"hits; misses and slow calls timed whole; profiling adds "
            f"~{report['profile_overhead_us']:.2f} us per call (--no-profile to skip timing)")
    return "\n".join(lines)


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=lambda o: float(o) if np.isscalar(o) else str(o))
