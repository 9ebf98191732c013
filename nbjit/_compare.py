"""`python -m nbjit compare`: nbjit.jit against jax.jit, side by side, in one process.

The scenario matrix (`nbjit._scenarios`) is a list of `Scenario` records,
each building a `Case` (the function, its arguments, the jit options); the
runner here wraps the same function with both dispatchers, checks that they
agree on the outputs, and times them interleaved (see `nbjit._measure`)
together with the *floor*: the executable's own execute + output handling,
called from Python, which no Python dispatcher can beat. `compare` runs the
same machinery on a user's own function and inputs (``nbjit.compare``); the
asv suite builds its benchmarks from `scenarios` too.

matplotlib is imported only when a plot is asked for, so `import nbjit` never
imports it. Multi-device scenarios need 8 devices: the CLI asks for them
(`nbjit._devices.request_host_devices`) before JAX's backend starts; where
fewer devices exist they are skipped with a note.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
import json
import os
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import jax
import numpy as np

from nbjit import _measure

# Upstream's own jit, captured where JAX defines it: users rebind the public
# name (`jax.jit = nbjit.jit`), and a comparison against that would compare
# nbjit with itself.
from nbjit._jax import jax_jit
from nbjit._scenarios import (  # noqa: F401  (also read as _compare.X: tests, asv)
    HOST_OFFSET,
    POOL,
    Case,
    Scenario,
    _host,
    scenarios,
    select,
)

SELF_CHECK_BAND = (0.9, 1.1)

# ---------------------------------------------------------------------------
# Running


@dataclass
class Row:
    name: str
    n_args: int
    kind: str
    block: bool
    family: str | None
    origin: str
    a_us: float | None = None  # nbjit (or jax.jit "A" in the self-check)
    b_us: float | None = None  # jax.jit
    floor_us: float | None = None
    ratio: float | None = None  # median of per-round a/b
    ratio_p10: float | None = None
    ratio_p90: float | None = None
    rounds: int = 0
    calls_per_batch: int = 0
    seconds: float = 0.0
    note: str = ""


Jit = Callable[..., Callable[..., Any]]


def _fresh_copy(fun: Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(fun, types.FunctionType):
        return types.FunctionType(
            fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, fun.__closure__
        )
    return functools.partial(fun)


def _blocker(out: Any) -> Callable[[Any], Any]:
    if isinstance(out, jax.Array):
        return type(out).block_until_ready  # the concrete class's method: no lookup per call
    return jax.block_until_ready


def _caller(jitted: Callable[..., Any], case: Case, block: bool) -> Callable[[], Any]:
    """A zero-argument call of ``jitted`` with the case's inputs, as cheap as Python allows."""
    args, kwargs = case.args, case.kwargs
    if case.arg_pool:
        take = itertools.cycle(case.arg_pool).__next__
        call = (lambda: jitted(*take(), **kwargs)) if kwargs else (lambda: jitted(*take()))
    else:
        call = (lambda: jitted(*args, **kwargs)) if kwargs else (lambda: jitted(*args))
    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def _fresh_caller(jit: Jit, case: Case, block: bool) -> Callable[[], Any]:
    fun, opts, args, kwargs = case.fun, case.jit_options, case.args, case.kwargs

    def call():
        return jit(_fresh_copy(fun), **opts)(*args, **kwargs)

    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def output_difference(x: Any, y: Any) -> str | None:
    """Why two call results differ (structure, dtype, weak type, sharding, values), or None."""
    lx, tx = jax.tree.flatten(x)
    ly, ty = jax.tree.flatten(y)
    if tx != ty:
        return f"tree structure {tx} != {ty}"
    for i, (u, v) in enumerate(zip(lx, ly, strict=True)):
        for attr in ("dtype", "weak_type", "sharding"):
            if getattr(u, attr, None) != getattr(v, attr, None):
                return f"leaf {i}: {attr} {getattr(u, attr, None)} != {getattr(v, attr, None)}"
        if not np.array_equal(np.asarray(u), np.asarray(v)):
            return f"leaf {i}: values differ"
    return None


def first_difference(f_a: Callable[..., Any], f_b: Callable[..., Any], case: Case
                     ) -> str | None:
    """How the two sides' outputs differ on the case's inputs, or None.

    A new-values case is checked on its first three argument tuples, so a
    side that reuses an earlier call's values shows.
    """
    for args in case.arg_pool[:3] or (case.args,):
        diff = output_difference(f_a(*args, **case.kwargs), f_b(*args, **case.kwargs))
        if diff:
            return diff
    return None


def _floor_contender(target: Any, floor_call: Callable[..., Callable[[], Any]], case: Case,
                     block: bool) -> Callable[[], Any]:
    """The floor of `target` on this case (execute + outputs only), waited for if `block`."""
    target(*case.args, **case.kwargs)
    floor = floor_call(target, *case.args, **case.kwargs)
    if not block:
        return floor
    blk = _blocker(floor())
    return lambda: blk(floor())


def run_scenario(
    scenario: Scenario,
    jit_a: Jit,
    jit_b: Jit,
    settings: _measure.Settings,
    floor_jit: Jit | None = None,
    floor_call: Callable[..., Callable[[], Any]] | None = None,
) -> Row:
    """Build, check and time one scenario: A = ``jit_a``, B = ``jit_b``, plus the floor."""
    row = Row(scenario.name, scenario.n_args, scenario.kind, scenario.block, scenario.family,
              scenario.origin)
    if len(jax.devices()) < scenario.min_devices:
        row.note = f"skipped: needs {scenario.min_devices} devices, have {len(jax.devices())}"
        return row
    case = scenario.build()
    notes = []
    if case.fresh_function:
        call_a = _fresh_caller(jit_a, case, scenario.block)
        call_b = _fresh_caller(jit_b, case, scenario.block)
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
    else:
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
        call_a = _caller(f_a, case, scenario.block)
        call_b = _caller(f_b, case, scenario.block)
    diff = first_difference(f_a, f_b, case)
    if diff:
        notes.append(f"OUTPUTS DIFFER: {diff}"[:160])
    contenders = [("a", call_a), ("b", call_b)]
    if floor_call is not None and floor_jit is not None and not case.fresh_function:
        try:
            target = f_a if floor_jit is jit_a else floor_jit(case.fun, **case.jit_options)
            contenders.append(("floor", _floor_contender(target, floor_call, case,
                                                         scenario.block)))
        except Exception as exc:  # the floor is best effort; the comparison is not
            notes.append(f"no floor: {type(exc).__name__}: {exc}"[:120])
    result = _measure.interleave(contenders, settings, sync=jax.block_until_ready,
                                 sync_each=scenario.sync_each)
    ratio = result.ratio("a", "b")
    row.a_us = result.median_us("a")
    row.b_us = result.median_us("b")
    if "floor" in result.names:
        row.floor_us = result.median_us("floor")
    row.ratio, row.ratio_p10, row.ratio_p90 = ratio.median, ratio.p10, ratio.p90
    row.rounds = result.per_call_s.shape[0]
    row.calls_per_batch = result.calls_per_batch
    row.seconds = result.seconds
    row.note = "; ".join(notes)
    return row


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 28) -> None:
        self.total, self.width = total, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def update(self, done: int, label: str) -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        eta_s = f"eta {eta:4.0f}s" if done else "eta    ?"
        line = f"[{bar}] {done:>3}/{self.total} {elapsed:5.0f}s {eta_s}  {label}"
        if self.tty:
            self.stream.write("\r" + line[:118].ljust(118))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run(
    matrix: Sequence[Scenario],
    settings: _measure.Settings,
    self_check: bool = False,
    progress: bool = True,
    stream: TextIO | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """Run the matrix; return the rows and the run's metadata."""
    import nbjit
    from nbjit.dispatch import floor_call

    jit_a, label_a = (jax_jit, "jax.jit (A)") if self_check else (nbjit.jit, "nbjit")
    bar = Progress(len(matrix), stream) if progress else None
    rows = []
    t0 = time.perf_counter()
    for i, scenario in enumerate(matrix):
        if bar:
            bar.update(i, scenario.name)
        rows.append(run_scenario(scenario, jit_a, jax_jit, settings, nbjit.jit, floor_call))
    if bar:
        bar.update(len(matrix), "done")
        bar.close()
    meta = metadata(settings, self_check, label_a)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return rows, meta


def _git_commit() -> str | None:
    """HEAD's short hash, with ``+dirty`` when nbjit/ has uncommitted changes."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", here)
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def metadata(settings: _measure.Settings, self_check: bool, label_a: str,
             notes: Sequence[str] = ()) -> dict[str, Any]:
    import jaxlib
    import numba

    import nbjit

    devices = jax.devices()
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "a": label_a,
        "b": "jax.jit",
        "self_check": self_check,
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "numba": numba.__version__,
            "numpy": np.__version__,
            "nbjit": getattr(nbjit, "__version__", None),
            "nbjit_commit": _git_commit(),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
            "backend": devices[0].platform,
            "devices": len(devices),
        },
        "settings": asdict(settings),
        "notes": list(notes),
    }


# ---------------------------------------------------------------------------
# Reporting


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
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    right = {1, 3, 4, 5, 6, 7}

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

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
        line(head),
        line(tuple("-" * w for w in widths)),
    ]
    out += [line(b) for b in body]
    for r in rows:
        if r.note:
            out.append(f"  note: {r.name}: {r.note}")
    for note in meta.get("notes", ()):
        out.append(f"  note: {note}")
    return "\n".join(out)


def self_check_failures(rows: Sequence[Row], band: tuple[float, float] = SELF_CHECK_BAND
                        ) -> list[Row]:
    """Rows whose median ratio lies outside ``band`` (skipped rows are not failures)."""
    return [r for r in rows if r.ratio is not None and not band[0] <= r.ratio <= band[1]]


def write_json(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
        f.write("\n")


def read_json(path: str) -> tuple[list[Row], dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return [Row(**r) for r in data["rows"]], data["meta"]


PLOT_FAMILIES = ("positional args dispatch", "pruned args dispatch", "many args (list) dispatch")


def plot(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """Two panels: the ratio per scenario, and time against number of arguments."""
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
        f"{a} vs jax.jit, {meta.get('date', '')}; jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, "
        f"numba {v.get('numba')}, Python {v.get('python')}; "
        f"{meta.get('machine', {}).get('cpus')} CPUs (shared)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_ratios(ax: Any, timed: Sequence[Row], a: str) -> None:
    """The left panel: each scenario's median ratio with its p10-p90 bar."""
    import matplotlib.ticker

    y = np.arange(len(timed))
    med = np.array([r.ratio for r in timed])
    err = (med - np.array([r.ratio_p10 for r in timed]),
           np.array([r.ratio_p90 for r in timed]) - med)
    colors = ["tab:green" if m < 1 else "tab:red" for m in med]
    ax.errorbar(med, y, xerr=err, fmt="none", ecolor="0.55", capsize=2, lw=1)
    ax.scatter(med, y, c=colors, zorder=3, s=22)
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


def _plot_families(ax: Any, timed: Sequence[Row], a: str) -> None:
    """The right panel: us per call against the number of arguments, per family."""
    impl_style = {"a": ("tab:blue", "o", a), "b": ("tab:orange", "s", "jax.jit"),
                  "floor": ("0.45", "^", "floor")}
    family_style = dict(zip(PLOT_FAMILIES, ("-", "--", ":"), strict=True))
    for fam, ls in family_style.items():
        fr = sorted((r for r in timed if r.family == fam), key=lambda r: r.n_args)
        if not fr:
            continue
        n = [r.n_args for r in fr]
        for key, (color, marker, label) in impl_style.items():
            vals = [getattr(r, f"{key}_us") for r in fr]
            if any(v is None for v in vals):
                continue
            ax.plot(n, vals, ls=ls, marker=marker, color=color, label=f"{label}: {fam}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of arguments (leaves)")
    ax.set_ylabel("us per call (median)")
    ax.set_title("time against number of arguments (dispatch, no waiting)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)


# ---------------------------------------------------------------------------
# nbjit.compare: the same measurement on the user's own function and inputs

#: How `compare` measures: 101 paired rounds of ~10 ms batches, at most ~3 s.
USER_SETTINGS = _measure.Settings(rounds=101, min_rounds=5, max_seconds=3.0)


class OutputsDiffer(AssertionError):
    """nbjit.jit(fun) and jax.jit(fun) returned different outputs for the same call."""


@dataclass(frozen=True)
class CompareResult:
    """nbjit.jit(fun) against jax.jit(fun) on one call, timed by `nbjit.compare`.

    ``ratio`` is the median of the per-round ratios nbjit/jax.jit (< 1: nbjit
    is faster) and ``p10``-``p90`` their spread. ``jax_us`` is jax.jit's
    median time per call and ``nbjit_us`` is ``ratio * jax_us``: the paired
    ratio is the measurement (absolute times drift between rounds on a busy
    machine), and the three numbers agree. ``floor_us`` is the executable's
    own execute + output handling called from Python (None when the call has
    no fast path), which no Python dispatcher can beat.
    """

    name: str
    ratio: float
    nbjit_us: float
    jax_us: float
    floor_us: float | None
    p10: float
    p90: float
    rounds: int
    calls_per_batch: int

    def __str__(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g} us"
        return (f"{self.name}: nbjit {self.nbjit_us:.3g} us, jax.jit {self.jax_us:.3g} us, "
                f"floor {floor}; ratio {self.ratio:.3g} (p10-p90 {self.p10:.3g}-{self.p90:.3g}, "
                f"{self.rounds} paired rounds of {self.calls_per_batch} calls)")

    def _repr_html_(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g}"
        cells = (self.name, f"{self.nbjit_us:.3g}", f"{self.jax_us:.3g}", floor,
                 f"{self.ratio:.3g}", f"{self.p10:.3g}-{self.p90:.3g}", str(self.rounds))
        head = ("function", "nbjit us", "jax.jit us", "floor us", "ratio", "p10-p90", "rounds")
        import html

        row = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
                + f"</tr></thead><tbody><tr>{row}</tr></tbody></table>"
                "<p>ratio = nbjit / jax.jit per call, median of paired rounds (&lt; 1: nbjit "
                "is faster); floor = execute + output handlers only</p>")

    def plot(self, path: str) -> None:
        """A PNG: microseconds per call of nbjit, jax.jit and the floor, with the ratio."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["nbjit", "jax.jit"] + ([] if self.floor_us is None else ["floor"])
        values = [self.nbjit_us, self.jax_us] + ([] if self.floor_us is None else
                                                 [self.floor_us])
        fig, ax = plt.subplots(figsize=(6, 2.6))
        ax.barh(labels, values, color=["tab:blue", "tab:orange", "0.6"][:len(values)])
        low, high = self.p10 * self.jax_us, self.p90 * self.jax_us
        ax.errorbar([self.nbjit_us], [0], xerr=[[self.nbjit_us - low], [high - self.nbjit_us]],
                    fmt="none", ecolor="k", capsize=3, lw=1)
        ax.invert_yaxis()
        ax.set_xlabel("us per call (nbjit bar: p10-p90 of the paired ratio)")
        ax.set_title(f"{self.name}: nbjit / jax.jit = {self.ratio:.3g} "
                     f"(p10-p90 {self.p10:.3g}-{self.p90:.3g})", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def compare(fun: Callable[..., Any], *args: Any, jit_kwargs: dict[str, Any] | None = None,
            **kwargs: Any) -> CompareResult:
    """Time ``nbjit.jit(fun, **jit_kwargs)`` against ``jax.jit(fun, **jit_kwargs)`` on ``args``.

    The method of ``python -m nbjit compare``: both are called once and their
    outputs must agree (values, dtype, weak type, sharding, tree structure),
    else `OutputsDiffer` is raised; then they run in interleaved paired
    rounds with the floor, and the result holds the median ratio and its
    spread. Each call is timed until it is dispatched, not until its outputs
    are ready (as a loop that does not wait sees it). Takes about 3 s.
    """
    import nbjit
    from nbjit.dispatch import floor_call

    options = dict(jit_kwargs or {})
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    case = Case(fun, args, kwargs, options)
    diff = first_difference(nbjit.jit(fun, **options), jax_jit(fun, **options), case)
    if diff:
        raise OutputsDiffer(f"nbjit.jit({name}) and jax.jit({name}) return different outputs "
                            f"for these inputs ({diff}); nothing was timed. Please report it "
                            "with the inputs: nbjit must give jax.jit's outputs.")
    scenario = Scenario(name, len(jax.tree.leaves((args, kwargs))), "user", lambda: case,
                        block=False)
    row = run_scenario(scenario, nbjit.jit, jax_jit, USER_SETTINGS, nbjit.jit, floor_call)
    assert row.ratio is not None and row.b_us is not None
    return CompareResult(name, row.ratio, row.ratio * row.b_us, row.b_us, row.floor_us,
                         row.ratio_p10, row.ratio_p90, row.rounds, row.calls_per_batch)
