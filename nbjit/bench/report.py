"""The compare run's outputs: the table and its summary, JSON, the plot.

A row is *within noise* when its own p10-p90 band of per-round ratios
contains 1: the paired rounds did not settle which side is faster. It is
*faster* when the whole band lies below 1 (p90 < 1) and *slower* when it lies
above (p10 > 1). The summary counts the three and gives the geometric mean
of the median ratios (a ratio's mean that treats 0.5x and 2x alike).

matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from nbjit.bench.runner import Row
from nbjit.observe.table import Table

SELF_CHECK_BAND = (0.9, 1.1)

FASTER, SLOWER, WITHIN_NOISE = "faster", "slower", "within noise"

def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The fixed-width table the CLI prints (and docs/compare.md shows)."""
    a = meta.get("a", "nbjit")
    a_col = "nbjit us" if a == "nbjit" else "A us"
    head = ("scenario", "n", "inputs", a_col, "jax.jit us", "floor us", "ratio", "p10-p90")
    body = []
    for r in rows:
        spread = "-" if r.ratio is None else f"{r.ratio_p10:.2f}-{r.ratio_p90:.2f}"
        body.append((r.name, str(r.n_args), r.kind, _fmt(r.a_us), _fmt(r.b_us),
                     _fmt(r.floor_us), _fmt(r.ratio, 2), spread))
    v = meta.get("versions", {})
    m = meta.get("machine", {})
    out = [
        f"{a} vs jax.jit, {meta.get('date', '')}: nbjit {v.get('nbjit_commit') or '?'}, "
        f"jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, numba {v.get('numba')}, "
        f"Python {v.get('python')}; {m.get('backend')} x{m.get('devices')} devices, "
        f"{m.get('cpus')} CPUs",
        f"ratio = {a} / jax.jit per call (median of paired rounds; < 1: {a} is faster); "
        "floor = execute + output handlers only",
        "",
        *Table(head, body, right=frozenset({1, 3, 4, 5, 6, 7}), rule=True).lines(),
    ]
    for r in rows:
        if r.note:
            out.append(f"  note: {r.name}: {r.note}")
    for note in meta.get("notes", ()):
        out.append(f"  note: {note}")
    out += ["", Summary.of(rows).line(a)]
    return "\n".join(out)


def verdict(row: Row) -> str | None:
    """`FASTER`, `SLOWER` or `WITHIN_NOISE` by the row's p10-p90 band; None when not timed."""
    if row.ratio is None or row.ratio_p10 is None or row.ratio_p90 is None:
        return None
    if row.ratio_p90 < 1:
        return FASTER
    if row.ratio_p10 > 1:
        return SLOWER
    return WITHIN_NOISE


@dataclass(frozen=True)
class Summary:
    """The timed rows at a glance: geomean of the median ratios and the verdicts' counts."""

    rows: int  # timed rows (skipped ones are not counted)
    geomean: float | None
    faster: int
    slower: int
    within_noise: int

    @classmethod
    def of(cls, rows: Sequence[Row]) -> Summary:
        verdicts = [v for v in map(verdict, rows) if v is not None]
        ratios = [r.ratio for r in rows if verdict(r) is not None and r.ratio is not None]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        return cls(len(verdicts), geomean, verdicts.count(FASTER), verdicts.count(SLOWER),
                   verdicts.count(WITHIN_NOISE))

    def line(self, a: str = "nbjit") -> str:
        geomean = "-" if self.geomean is None else f"{self.geomean:.3f}"
        rows = f"{self.rows} row" + ("" if self.rows == 1 else "s")
        return (f"summary: {rows}, geomean ratio {geomean}; {a} faster in "
                f"{self.faster} (p90 < 1), slower in {self.slower} (p10 > 1), within noise in "
                f"{self.within_noise} (p10-p90 spans 1)")


def self_check_failures(rows: Sequence[Row], band: tuple[float, float] = SELF_CHECK_BAND
                        ) -> list[Row]:
    """Rows whose median ratio lies outside ``band`` (skipped rows are not failures)."""
    return [r for r in rows if r.ratio is not None and not band[0] <= r.ratio <= band[1]]


def write_json(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "summary": asdict(Summary.of(rows)),
                   "rows": [asdict(r) for r in rows]}, f, indent=1)
        f.write("\n")


def read_json(path: str) -> tuple[list[Row], dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return [Row(**r) for r in data["rows"]], data["meta"]


def run_description(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """One line naming a run: its commit, date, rows and geomean. The plot
    carries it as PNG metadata (``Description``), so that docs/compare.png can
    be checked against the JSON it was drawn from (tests/test_docs.py)."""
    summary = Summary.of(rows)
    geomean = "-" if summary.geomean is None else f"{summary.geomean:.3f}"
    commit = meta.get("versions", {}).get("nbjit_commit") or "?"
    return (f"nbjit compare: nbjit {commit}, {meta.get('date', '')}, {summary.rows} rows, "
            f"geomean ratio {geomean}")


def format_markdown(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The table as ``compare --markdown`` writes it (docs/compare.md)."""
    return f"# nbjit compare ({meta.get('date', '')})\n\n```\n{format_table(rows, meta)}\n```\n"


def plot(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """Two panels: the ratio per scenario, and time against number of arguments."""
    import matplotlib.pyplot as plt

    fig = figure(rows, meta)
    fig.savefig(path, dpi=110, metadata={"Description": run_description(rows, meta)})
    plt.close(fig)


SUPTITLE_INCHES = 0.45  # kept above the panels for the run's title (its line and a margin)


def figure(rows: Sequence[Row], meta: dict[str, Any]) -> Any:
    """The figure `plot` saves (matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.ratio is not None]
    a = meta.get("a", "nbjit")
    fig, (ax0, ax1) = plt.subplots(
        1, 2, figsize=(14, max(4.5, 0.26 * len(timed) + 1.6)), width_ratios=(1.1, 1)
    )
    _plot_ratios(ax0, timed, a)
    _plot_families(ax1, timed, a)
    v = meta.get("versions", {})
    fig.suptitle(
        f"{a} {v.get('nbjit_commit') or ''} vs jax.jit, {meta.get('date', '')}; "
        f"jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, "
        f"numba {v.get('numba')}, Python {v.get('python')}; "
        f"{meta.get('machine', {}).get('cpus')} CPUs (shared)",
        fontsize=10,
    )
    # The panels' titles stay below the figure's: tight_layout alone lays the
    # panels out as if it were not there, and they overlapped it.
    fig.tight_layout(rect=(0, 0, 1, 1 - SUPTITLE_INCHES / fig.get_figheight()))
    return fig


# Dot colours of the ratio panel, by verdict.
VERDICT_COLORS = {FASTER: "tab:green", SLOWER: "tab:red", WITHIN_NOISE: "0.55"}


def _plot_ratios(ax: Any, timed: Sequence[Row], a: str) -> None:
    """The left panel: each scenario's median ratio with its p10-p90 bar, coloured by verdict."""
    import matplotlib.ticker
    from matplotlib.lines import Line2D

    y = np.arange(len(timed))
    med = np.array([r.ratio for r in timed])
    err = (med - np.array([r.ratio_p10 for r in timed]),
           np.array([r.ratio_p90 for r in timed]) - med)
    verdicts = [verdict(r) or WITHIN_NOISE for r in timed]  # (timed rows have one)
    ax.errorbar(med, y, xerr=err, fmt="none", ecolor="0.7", capsize=2, lw=1)
    ax.scatter(med, y, c=[VERDICT_COLORS[v] for v in verdicts], zorder=3, s=22)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8)
             if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_yticks(y, [r.name for r in timed], fontsize=7)
    ax.set_ylim(len(timed) - 0.5, -0.5)
    ax.set_xlabel(f"{a} / jax.jit per call: median of paired rounds, bar p10-p90 (< 1: faster)")
    ax.set_title("ratio per scenario")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    described = {FASTER: f"{a} faster (p90 < 1)", SLOWER: f"{a} slower (p10 > 1)",
                 WITHIN_NOISE: "within noise (p10-p90 spans 1)"}
    handles = [Line2D([], [], ls="none", marker="o", color=VERDICT_COLORS[v],
                      label=f"{described[v]}: {verdicts.count(v)}") for v in described]
    ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.9)


# Right panel: colour names the implementation, line style and marker the family.
IMPL_COLORS = {"a": "tab:blue", "b": "tab:orange", "floor": "0.35"}
FAMILY_STYLES = {  # (line style, marker, marker filled)
    "positional args dispatch": ("-", "o", True),
    "pruned args dispatch": ("--", "s", False),
    "many args (list) dispatch": (":", "^", True),
}


def _plot_families(ax: Any, timed: Sequence[Row], a: str) -> None:
    """The right panel: us per call against the number of arguments, per family."""
    from matplotlib.lines import Line2D

    labels = {"a": a, "b": "jax.jit", "floor": "floor"}
    impls_drawn: dict[str, None] = {}
    families_drawn: dict[str, None] = {}
    for fam, (ls, marker, filled) in FAMILY_STYLES.items():
        fr = sorted((r for r in timed if r.family == fam), key=lambda r: r.n_args)
        if not fr:
            continue
        n = [r.n_args for r in fr]
        for key, color in IMPL_COLORS.items():
            vals = [getattr(r, f"{key}_us") for r in fr]
            if any(v is None for v in vals):
                continue
            ax.plot(n, vals, ls=ls, lw=1.6, marker=marker, ms=6, color=color,
                    markerfacecolor=color if filled else "white", markeredgewidth=1.3)
            impls_drawn[key] = None
            families_drawn[fam] = None
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of arguments (leaves)")
    ax.set_ylabel("us per call (median)")
    ax.set_title("time against number of arguments (dispatch, no waiting)")
    ax.grid(True, which="both", alpha=0.3)
    if not ax.lines:
        return
    impl_handles = [Line2D([], [], color=IMPL_COLORS[k], lw=4, label=labels[k])
                    for k in impls_drawn]
    family_handles = []
    for fam in families_drawn:
        ls, marker, filled = FAMILY_STYLES[fam]
        family_handles.append(Line2D([], [], color="k", ls=ls, lw=1.6, marker=marker, ms=6,
                                     markerfacecolor="k" if filled else "white",
                                     label=fam.removesuffix(" dispatch")))
    first = ax.legend(handles=impl_handles, title="colour", fontsize=7, title_fontsize=7,
                      loc="upper left")
    ax.add_artist(first)
    ax.legend(handles=family_handles, title="line: scenario family", fontsize=7,
              title_fontsize=7, loc="lower right")
