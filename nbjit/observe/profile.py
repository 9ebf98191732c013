"""Per-phase timing of nbjit calls: ``with nbjit.profile() as prof:``.

Inside the block every nbjit call is timed: a hit in five phases (keying,
lookup, input preparation, execute, output wrapping), a miss or slow call
whole. Outside it the hit path pays nothing: the binders run the "timed"
flavour of the hit path only while a profile is active. This module
registers that flavour into the core (`nbjit.core.flavours`, `TIMED`) when
imported, and entering the first profile and leaving the last switch every
function to it and back (`use_flavour`; then the callbacks registered with
`on_switch`).

A hit's first and last stamps are taken by `PjitFunction.__call__` (the
flavour stamps the call's ends, `Flavour.entry_stamp`): as the call enters
and as the rest of the call returns to it. So the key phase runs from the
entry (freeing the buffers the runtime released, finding the binder,
keying) to the lookup, and the outputs phase to that return (recording the
hit, freeing the binder's locals). What the timed flavour's lines call:
  * `record(jitted, stamps, t_key, t_lookup, t_inputs, t_execute)`: one
    hit, as `time.perf_counter_ns` stamps: `stamps` is the call's list,
    begun with the entry's; the phases' ends and a provisional end of the
    call are added, and the list is stored (`__call__` sets its end);
  * `timed_call(jitted, t0, fn, *args)`: a miss or slow call, run and
    recorded whole (`record_whole(jitted, kind, nanoseconds)`);
  * `active()`: whether any profile is active.

Outside a hit's five phases lies only `__call__`'s own frame: entering it
up to its first clock read, and its return after the last. The profile
states its own overhead per call (`Profile.overhead_ns`): the time of a
probe call shaped like a profiled hit that does no work (`__call__` and its
stamped call, seven clock reads, the record), measured in a tight loop each
time a profile starts (a short calibration, paid once per profile, not per
call). It bounds what profiling adds to a call where the call's Python runs
as warm as the loop; the part of a call outside its phases is about half of
it then, and grows with the caller's cold caches as everything else does
(docs/profiler.md: a TPU's runtime leaves them cold).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit.core import flavours as _flavours
from nbjit.core.dispatch import PjitFunction
from nbjit.core.view import JitView, info
from nbjit.observe.stats import function_label
from nbjit.observe.table import Table

__all__ = ["PHASES", "TIMED", "Profile", "profile", "active", "record", "record_whole",
           "on_switch", "timed_call"]

PHASES = ("key", "lookup", "inputs", "execute", "outputs")

_clock = time.perf_counter_ns
_active: tuple[Profile, ...] = ()
_lock = threading.Lock()
_switches: list[Callable[[bool], None]] = []


def on_switch(callback: Callable[[bool], None]) -> None:
    """`callback(True)` when the first profile starts, `callback(False)` when the last ends."""
    _switches.append(callback)


def active() -> bool:
    return bool(_active)


def record(jitted: Any, stamps: list[int], t_key: int, t_lookup: int, t_inputs: int,
           t_execute: int) -> None:
    """One hit of `jitted`: `stamps` (the call's, begun as it entered) with the
    phases' ends and the call's end added, provisionally: `PjitFunction.__call__`
    sets it again as the binder returns (see the module docstring)."""
    stamps += (t_key, t_lookup, t_inputs, t_execute, _clock())
    for prof in _active:
        hits = prof._hits.get(jitted)
        if hits is None:
            hits = prof._hits[jitted] = []
        hits.append(stamps)


def record_whole(jitted: Any, kind: str, nanoseconds: int) -> None:
    """One miss (`kind` 'miss'; one whose trace raised too), slow call ('slow') or
    call staged into an outer trace ('traced') of `jitted`, timed whole."""
    for prof in _active:
        prof._whole.setdefault(jitted, []).append((kind, nanoseconds))


def timed_call(jitted: JitView, t0: int, fn: Callable, /, *args: Any) -> Any:
    """A slow or miss call under a profile: run it, record it whole."""
    misses = jitted.miss_count
    counters = info(jitted).counters
    traced, raised = counters.traced, counters.raised
    try:
        return fn(*args)
    finally:
        kind = ("miss" if jitted.miss_count != misses or counters.raised != raised
                else "traced" if counters.traced != traced else "slow")
        record_whole(jitted, kind, _clock() - t0)


# The timed flavour of the hit path (`nbjit.core.flavours`): the call's ends
# stamped by `PjitFunction.__call__` (with this clock; `start` stamps the
# entry of a call that came another way), a stamp after each phase, the hit
# recorded before the binder returns, a slow path timed whole.
TIMED = _flavours.add_flavour(_flavours.Flavour(
    "timed",
    start="stamps = [clock()]",
    stamps=("t_key = clock()", "t_lookup = clock()", "t_inputs = clock()", "t_execute = clock()"),
    finish="record_hit(self, stamps, t_key, t_lookup, t_inputs, t_execute)",
    leave="timed_call(self, stamps[0], {fn}, {args})",
    scope={"clock": _clock, "record_hit": record, "timed_call": timed_call},
    entry_stamp=True))


def probe_binder(jitted: Any, args: tuple, kwargs: dict, stamps: list[int] | None = None
                 ) -> Any:
    """The only binder of the overhead probe: the timed flavour's binder with
    no work between the stamps (four clock reads, the record with a fifth)."""
    clock = _clock
    if stamps is None:
        stamps = [clock()]
    t1 = clock()
    t2 = clock()
    t3 = clock()
    t4 = clock()
    record(jitted, stamps, t1, t2, t3, t4)
    return args


probe_binder.takes_entry_stamp = True  # type: ignore[attr-defined]  # as the timed flavour's


class _OverheadProbe(PjitFunction):
    """A jitted function for `nbjit.profile()`'s overhead: its call is
    `PjitFunction.__call__` itself (inherited, so it cannot drift from it:
    with the timed flavour on, its detour into the dispatcher's stamped
    call) and its one binder (call shape: one positional argument) stamps
    and records as the timed flavour's do, with no work (`probe_binder`)."""

    def __init__(self) -> None:  # no function, no cache: nothing of PjitFunction's own
        self._binders = _ProbeBinders({1: probe_binder})  # type: ignore[assignment]


class _ProbeBinders(dict):
    """The probe's binder table: every call shape gets the probe binder, and
    `__call__` stamps its ends (the timed flavour's `entry_stamp`)."""

    stamps_entry = True

    def __missing__(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        return self.setdefault(shape, probe_binder)


def _measure_overhead(n: int = 1000) -> float:
    """Nanoseconds per call of a probe shaped like a timed hit that does no work.

    The probe is the dispatcher's own call (`_OverheadProbe`: `__call__`,
    which stamps the entry and the end around its detour into the stamped
    call, which looks up the binder of the call shape and calls it) into
    `probe_binder`, which stamps the ends of four phases and records the
    hit. It bounds what profiling adds to a call, and holds the part of a
    call outside its five phases (`__call__`'s own frame). Measured with
    the timed flavour on (`Profile.__enter__` switches first), else the
    probe would take the plain call. Median of five batches, gc off.
    """
    global _active
    if _flavours.current_flavour() != TIMED.name:
        raise RuntimeError("the overhead is measured while a profile is active")
    probe = _OverheadProbe()
    saved, _active = _active, (Profile(),)
    try:
        estimates = []
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection would land in one batch only: the median skips it
        try:
            for _ in range(5):
                start = _clock()
                for _ in range(n):
                    probe(None)
                estimates.append((_clock() - start) / n)
                _active[0]._hits.clear()
        finally:
            if gc_was_enabled:
                gc.enable()
    finally:
        _active = saved
    return float(np.median(estimates))


class Profile:
    """The per-phase timings of nbjit calls made while it was active."""

    def __init__(self) -> None:
        self._hits: dict[Any, list[list[int]]] = {}  # stamps per hit (`record`)
        self._whole: dict[Any, list[tuple[str, int]]] = {}
        self.overhead_ns = 0.0

    # -- the context manager ---------------------------------------------------

    def __enter__(self) -> Profile:
        global _active
        with _lock:
            if not _active:
                _flavours.use_flavour("timed")
                for switch in _switches:
                    switch(True)
            self.overhead_ns = _measure_overhead()  # under the machine's current load
            _active = (*_active, self)
        return self

    def __exit__(self, *exc: Any) -> None:
        global _active
        with _lock:
            _active = tuple(p for p in _active if p is not self)
            if not _active:
                _flavours.use_flavour("plain")
                for switch in _switches:
                    switch(False)

    # -- results ---------------------------------------------------------------

    def phases_ns(self, jitted: Any) -> np.ndarray:
        """int64[hits, 5]: nanoseconds per phase of every profiled hit of `jitted`."""
        stamps = np.asarray(self._hits.get(jitted, []), dtype=np.int64).reshape(-1, 6)
        return np.diff(stamps, axis=1)

    def functions(self) -> list[Any]:
        """The jitted functions with a recorded call, in first-call order."""
        return list(dict.fromkeys([*self._hits, *self._whole]))

    def whole_ns(self, jitted: Any) -> list[tuple[str, int]]:
        """(kind, nanoseconds) of every miss ('miss'), slow call ('slow') and call
        under an outer trace ('traced') of `jitted`."""
        return list(self._whole.get(jitted, []))

    def by_name(self) -> dict[str, tuple[np.ndarray, list[tuple[str, int]]]]:
        """name -> (phases_ns, whole_ns) of every function, in first-call order; twins
        (two jits of one function with the same options) share their name and row,
        as in `nbjit.stats()`."""
        grouped: dict[str, tuple[list[np.ndarray], list[tuple[str, int]]]] = {}
        for jitted in self.functions():
            name = function_label(jitted) if hasattr(jitted, "_fun") else repr(jitted)
            phases, whole = grouped.setdefault(name, ([], []))
            phases.append(self.phases_ns(jitted))
            whole += self.whole_ns(jitted)
        return {name: (np.concatenate(phases), whole) for name, (phases, whole) in grouped.items()}

    def summary(self) -> list[dict[str, Any]]:
        """One dict per function: name, hits, misses, slow, per-phase median/p90/mean (us),
        total ms. Hits have heavy tails (a collection, a preemption): the median
        says what a typical hit costs, the p90 how far the tail reaches."""
        rows = []
        for name, (phases_ns, whole) in self.by_name().items():
            phases = phases_ns / 1e3
            miss_us = [ns / 1e3 for kind, ns in whole if kind == "miss"]
            slow_us = [ns / 1e3 for kind, ns in whole if kind != "miss"]  # traced ones too
            traced = sum(kind == "traced" for kind, _ in whole)
            row: dict[str, Any] = {
                "name": name, "calls": len(phases) + len(whole), "hits": len(phases),
                "misses": len(miss_us), "slow": len(slow_us) - traced, "traced": traced,
            }
            for i, phase in enumerate(PHASES):
                column = phases[:, i] if len(phases) else np.zeros(1)
                row[f"{phase}_median_us"] = float(np.median(column))
                row[f"{phase}_p90_us"] = float(np.percentile(column, 90))
                row[f"{phase}_mean_us"] = float(column.mean())
            hit_us = phases.sum(axis=1) if len(phases) else np.zeros(1)
            row["hit_median_us"] = float(np.median(hit_us))
            row["hit_p90_us"] = float(np.percentile(hit_us, 90))
            row["hit_mean_us"] = float(hit_us.mean())
            row["miss_mean_us"] = float(np.mean(miss_us)) if miss_us else 0.0
            row["slow_mean_us"] = float(np.mean(slow_us)) if slow_us else 0.0
            row["total_ms"] = (float(phases.sum()) + sum(miss_us) + sum(slow_us)) / 1e3
            rows.append(row)
        return rows

    def _table(self) -> Table:
        rows = self.summary()
        traced = any(r["traced"] for r in rows)  # a column only where some call was staged
        header = ["function", "calls", "hits", "misses", "slow", *(["traced"] if traced else [])]
        header += [f"{p} us" for p in PHASES] + ["hit us", "miss/slow us", "total ms"]
        body = []
        for r in rows:
            cells = [r["name"], str(r["calls"]), str(r["hits"]), str(r["misses"]), str(r["slow"])]
            cells += [str(r["traced"])] if traced else []
            cells += [f"{r[f'{p}_median_us']:.2f} ({r[f'{p}_p90_us']:.2f})"
                      for p in (*PHASES, "hit")]
            whole = [v for v in (r["miss_mean_us"], r["slow_mean_us"]) if v]
            cells += [
                      "/".join(f"{v:.0f}" for v in whole) or "-", f"{r['total_ms']:.2f}"]
            body.append(cells)
        return Table(header, body, right=frozenset(range(1, len(header))))

    def __str__(self) -> str:
        return "\n".join([*self._table().lines(), self._note()])

    __repr__ = __str__  # the table, as pandas shows a DataFrame

    def _note(self) -> str:
        return (f"phase and hit cells: median (p90) us per hit; miss/slow: mean us; "
                f"profiler overhead ~{self.overhead_ns / 1e3:.2f} us per call, not subtracted")

    def _repr_html_(self) -> str:
        return self._table().html([self._note()])

    def plot(self, path: str | None = None) -> Any:
        """A stacked bar per function: median us per phase of its hits. Saves to `path` if given.

        Returns the matplotlib Figure (imported here, not at nbjit's import).
        """
        import matplotlib

        if path is not None and matplotlib.get_backend().lower() not in (
                "agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.summary() if r["hits"]]
        # Wide enough for the two-line title whatever the number of bars.
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4.0))
        names = [_short_name(r["name"]) for r in rows]
        bottom = np.zeros(len(rows))
        for phase in PHASES:
            values = np.array([r[f"{phase}_median_us"] for r in rows])
            ax.bar(names, values, bottom=bottom, label=phase)
            bottom += values
        ax.set_ylabel("median us per hit")
        ax.set_title(f"nbjit per-phase time of hits\n"
                     f"(profiler overhead ~{self.overhead_ns / 1e3:.2f} us per call)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=100)
        return fig


def _short_name(name: str) -> str:
    """A bar's label: the qualified name without its module, the site below it."""
    base, _, rest = name.partition(" (")
    return base.rsplit(".", 1)[-1] + (f"\n({rest}" if rest else "")


def profile() -> Profile:
    """``with nbjit.profile() as prof:`` times every nbjit call inside; print `prof`."""
    return Profile()
