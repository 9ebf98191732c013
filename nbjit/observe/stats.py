"""Dispatch statistics: what every nbjit function did with its calls.

The counters live with a cache namespace (`nbjit.core.cache.Counters`: a
function and its jit options; twins, two `jit` objects over the same
function with the same options, share one namespace and so one record). A
hit costs one attribute increment on the node it ran (``node.hits += 1``:
the node is already in a local, so this skips the ``self._counters`` load
that ``self._counters.hits += 1`` pays; docs/performance.md, "Measured
constants behind the code"); a node's hits move into the counters when it
leaves the cache. Misses, slow calls and evictions are counted on their own
(already slow) paths, and `calls` is derived: hits + misses + slow.

No counter takes a lock. Under the GIL of CPython 3.11-3.13, ``node.hits
+= 1`` on a ``__slots__`` object is not interrupted between its load and its
store (no eval-breaker check between LOAD_ATTR, BINARY_OP on ints and
STORE_ATTR), so hits from many threads add up exactly (tests/test_stats.py
checks it). The language does not promise it (a free-threaded build can
lose counts), and a slow reason counted for the first time runs
``Counter.__missing__`` in Python, where a race can lose one: counts are
statistics, not accounting (`nbjit.core.cache.Counters` says the same).

Public: `DispatchStats` (a frozen snapshot), `stats()` (every live
function), and the ``stats()`` / ``reset_stats()`` methods of a jitted
function.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbjit import _jax
from nbjit.core import live as _live
from nbjit.core.inputs.fallbacks import process_given_up
from nbjit.core.view import JitView, info
from nbjit.observe.names import defined_in_library, function_name, location_name, process_label
from nbjit.observe.table import Table

__all__ = ["RAISED", "TRACED", "DispatchStats", "SLOW_REASONS", "StatsTable", "library_names",
           "snapshot", "stats"]

# Why a call took JAX's own path instead of nbjit's (the keys of
# `DispatchStats.slow_reasons`). One per place the dispatcher gives up.
SLOW_REASONS: dict[str, str] = {
    "ref": "a jax.Ref argument (jax.new_ref, flax nnx ref mode): JAX's own path, as jax.jit",
    "effects": "the function has side effects (jax.debug.print, callbacks): no fast path",
    "debug_nans": "jax_debug_nans is on",
    "debug_infs": "jax_debug_infs is on",
    "unknown_leaf_type": "an argument leaf nbjit does not key (a string, an object, ...)",
    "deleted_or_donated": "an argument array was deleted or donated before the call",
    "layout": "the executable wants a non-default input layout",
    "no_fastpath": "JAX returned no fast-path data for this signature",
    "disable_jit": "jax.disable_jit() is on: the Python function ran as is",
    "static_arg_error": "a static argument's hash or == raised",
    "pytree_node_data": "a pytree node's data raised when compared: JAX's path decides",
    "input_refused": "preparing inputs failed (e.g. a transfer guard): JAX's path reports it",
    "execute_refused": "the executable refused the inputs",
    "compile_failed": "the signature's compile was interrupted (Ctrl-C), or another thread's "
                      "compile of it failed while this call waited",
}

# What the other columns of `DispatchStats` count, beside hits, misses and slow calls.
TRACED = ("calls under a JAX transformation (jit, grad, vmap, hessian, scan): staged into "
          "that trace, never cached, as jax.jit's are there; not slow")
RAISED = ("calls that raised in JAX's trace, lowering or compile (an error in the function or "
          "its arguments, as jax.jit raises it: a TracerBoolConversionError, a shape error); "
          "that signature's next call traces again")

def snapshot(counters: Any, name: str, entries: int, live_hits: int,
             host_inputs: dict[str, int] | None = None) -> DispatchStats:
    """A `DispatchStats` from a namespace's counters (`nbjit.core.cache.Counters`).

    `live_hits`: the hits counted on the namespace's live nodes; `entries`:
    how many nodes it holds; `host_inputs`: how many of them put their host
    inputs each way (`Namespace.host_paths`).
    """
    reasons = dict(counters.slow_reasons)  # one read: other threads may add keys
    slow = sum(reasons.values())
    hits, misses = counters.hits + live_hits, counters.misses
    traced, raised = counters.traced, counters.raised
    extensions: dict[str, Any] = {}  # the extensions' own fields (the host's: resident)
    for added in list(getattr(counters, "extension_counters", {}).values()):
        extensions.update(added.fields())
    return DispatchStats(
        name=name, calls=hits + misses + traced + raised + slow, hits=hits, misses=misses,
        traced=traced, raised=raised, slow=slow, slow_reasons=reasons,
        evictions=counters.evictions, entries=entries, miss_seconds=counters.miss_seconds,
        host_inputs=dict(host_inputs or {}), given_up=dict(getattr(counters, "given_up", {})),
        **extensions)


@dataclass(frozen=True)
class DispatchStats:
    """What one nbjit function (with its twins) did with its calls.

    calls = hits + misses + traced + raised + slow. `misses` counts the calls
    nbjit had no entry for and created one (JAX traced and compiled them, or
    found them in its own caches: a miss is not always a compile); `traced`
    the calls made under a JAX transformation (`TRACED`: staged into the
    outer trace, as jax.jit's are, never cached, not a problem); `raised` the
    calls whose trace, lowering or compile raised (`RAISED`: the function's
    own error, as jax.jit raises it); `slow` calls took JAX's own path for
    one of the reasons in `slow_reasons`; `entries` is how many signatures
    the cache holds now; `miss_seconds` the wall time spent in misses (those
    that raised too).
    """

    name: str
    calls: int
    hits: int
    misses: int
    slow: int
    slow_reasons: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    entries: int = 0
    miss_seconds: float = 0.0
    resident: int = 0  # signatures whose host inputs became resident (no compile)
    traced: int = 0
    raised: int = 0
    # How many entries put their host inputs each way ("per-leaf puts", "launch
    # record", "resident slots"), and input strategies given up: strategy ->
    # why (the exception's type and message, the first time).
    host_inputs: dict[str, int] = field(default_factory=dict)
    given_up: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return str(StatsTable({self.name: self}))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return StatsTable({self.name: self})._repr_html_()


_COLUMNS = ("calls", "hits", "misses", "slow", "evictions", "entries", "miss s")
# Shown where some row counts any (`TRACED`, `RAISED`), each with a line saying what it is.
_OPTIONAL = ("traced", "raised")


def _reasons_text(reasons: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items(), key=lambda r: -r[1]))


def host_inputs_line(name: str, resident: int) -> str:
    """What function `name`'s signatures with host inputs (numpy arrays,
    scalars) got instead of a transfer per value (nbjit/host/policy.py), in
    words; "" for none. Resident: new values on most calls, or arrays too big
    for a memo (the same ones every call included)."""
    def signatures(n: int, verb: str) -> str:
        return f"{n} signature{'s' if n != 1 else ''} {verb}{'s' if n == 1 else ''}"

    parts: list[str] = []
    if resident:
        parts.append(f"{signatures(resident, 'keep')} them in reused device buffers "
                     "(resident: no transfer, written when they change)")
    return f"host inputs of {name}: {'; '.join(parts)}" if parts else ""


def _host_lines(rows: dict[str, DispatchStats]) -> list[str]:
    """A line per function whose host inputs became resident, and the input
    strategies given up: per function, and the process's."""
    lines = [host_inputs_line(name, s.resident) for name, s in rows.items()]
    lines += [given_up_line(name, s.host_inputs, s.given_up) for name, s in rows.items()]
    lines.append(given_up_line("", {}, process_given_up()))
    return [line for line in lines if line]


def given_up_line(name: str, host_inputs: dict[str, int], given_up: dict[str, str]) -> str:
    """How function `name`'s signatures put their host inputs, where a
    strategy was given up (and why); "" where none was. No name: the
    process's own fallbacks."""
    if not given_up:
        return ""
    why = "; ".join(f"{strategy} given up: {text}" for strategy, text in given_up.items())
    if not name:
        return f"this process: {why}"
    ways = ", ".join(f"{way} {n}" for way, n in sorted(host_inputs.items()))
    return f"host inputs of {name}: {why}" + (f" (signatures: {ways})" if ways else "")


def _row(s: DispatchStats, optional: tuple[str, ...]) -> tuple[str, ...]:
    return (str(s.calls), str(s.hits), str(s.misses), *(str(getattr(s, c)) for c in optional),
            str(s.slow), str(s.evictions), str(s.entries), f"{s.miss_seconds:.3f}")


def _optional_columns(rows: dict[str, DispatchStats]) -> tuple[str, ...]:
    return tuple(c for c in _OPTIONAL if any(getattr(s, c) for s in rows.values()))


def _column_notes(optional: tuple[str, ...]) -> list[str]:
    """What the optional columns count, in words (a user reads "slow" as a problem)."""
    said = {"traced": TRACED, "raised": RAISED}
    return [f"{c} = {said[c]}" for c in optional]


class StatsTable(Mapping[str, DispatchStats]):
    """name -> DispatchStats; prints as a table (text and notebook HTML)."""

    def __init__(self, rows: dict[str, DispatchStats]) -> None:
        self._rows = dict(rows)

    def __getitem__(self, name: str) -> DispatchStats:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:  # the table, as pandas shows a DataFrame
        return str(self)

    def _table(self, optional: tuple[str, ...]) -> Table:
        header = ("function", *_COLUMNS[:3], *optional, *_COLUMNS[3:], "slow reasons")
        body = [(name, *_row(s, optional), _reasons_text(s.slow_reasons))
                for name, s in self._rows.items()]
        last = len(header) - 1
        return Table(header, body, right=frozenset(range(1, last)), left=frozenset({0, last}),
                     code=frozenset({0}))

    def _notes(self, optional: tuple[str, ...]) -> list[str]:
        return _column_notes(optional) + _host_lines(self._rows)

    def __str__(self) -> str:
        optional = _optional_columns(self._rows)
        lines = self._table(optional).lines() + self._notes(optional)
        label = process_label()  # multi-controller: whose counts
        return "\n".join([f"({label})", *lines] if label else lines)

    def _repr_html_(self) -> str:
        optional = _optional_columns(self._rows)
        return self._table(optional).html(self._notes(optional))


# ---------------------------------------------------------------------------
# The functions collected since `keep_retired()`: the core's live functions
# (`nbjit.core.live`) tell `_watch` of each new one

_retired_lock = threading.Lock()

# While `keep_retired()` is on (a ``python -m nbjit run``), the counters of every
# function collected since, by their identity: (name, counters, its namespace,
# weakly, whether a library defines it). The run report names every function
# that ran, also one gone by exit.
_retired: dict[int, tuple[str, Any, Any, bool]] | None = None


def _watch(jitted: JitView) -> None:
    """A live-function listener: while `keep_retired()` is on, a function's counts
    outlive it."""
    if _retired is not None:
        facts = info(jitted)
        weakref.finalize(jitted, _retire, function_label(jitted), facts.counters,
                         weakref.ref(facts.namespace), defined_in_library(facts.fun))


_live.add_live_listener(_watch)


def _retire(name: str, counters: Any, namespace: Any, library: bool) -> None:
    with _retired_lock:
        if _retired is not None:
            _retired.setdefault(id(counters), (name, counters, namespace, library))


def keep_retired() -> None:
    """From now on, `retired()` keeps the counts of functions that are collected."""
    global _retired
    with _retired_lock:
        if _retired is None:
            _retired = {}


def retired() -> StatsTable:
    """The `DispatchStats` of the functions that ran and were collected since
    `keep_retired()`, unless a live function shares their counters (a twin:
    `stats()` has them)."""
    with _retired_lock:
        gone = list((_retired or {}).values())
    live = {id(info(jitted).counters) for jitted in live_functions()}
    rows: dict[str, DispatchStats] = {}
    for name, counters, namespace_ref, _ in gone:
        if id(counters) in live:
            continue
        namespace = namespace_ref()  # its function may live on (and its entries with it)
        entries, live_hits = namespace.usage() if namespace is not None else (0, 0)
        s = snapshot(counters, name, entries, live_hits)
        if s.calls:
            rows[name] = s
    return StatsTable(rows)


def library_names() -> set[str]:
    """The names (as `stats()` and `retired()` give them) of the functions that
    an installed library defines (`nbjit.observe.names.defined_in_library`):
    optax's, equinox's, ... rather than the user's own."""
    with _retired_lock:
        gone = {name for name, _, _, library in (_retired or {}).values() if library}
    return gone | {function_label(jitted) for jitted in live_functions()
                   if defined_in_library(info(jitted).fun)}


def live_functions() -> list[JitView]:
    """The live jitted functions, oldest first."""
    return _live.live_functions()


def function_label(jitted: JitView) -> str:
    """How every report names a jitted function: `nbjit.observe.names.function_name` of
    its Python function, plus the jit options that key its executables
    (JAX's global cache key: donation, shardings, device, ...) where they are
    not the defaults. Twins, which share one cache namespace, share the
    label; two jits of one function with other such options are two rows."""
    facts = info(jitted)
    name = function_name(facts.fun)
    options = _keyed_options(facts.global_key)
    return f"{name} [{options}]" if options else name


def function_location(jitted: JitView) -> str:
    """`function_label` without the ``#N`` of re-definitions: one label for every
    function object the same code defines (a notebook cell run again)."""
    facts = info(jitted)
    options = _keyed_options(facts.global_key)
    name = location_name(facts.fun)
    return f"{name} [{options}]" if options else name


_default_key: Any = None


def _keyed_options(key: Any) -> str:
    """``"donate_argnums=(0,)"``: the fields of a global cache key that differ from
    a plain jit's ("" for none)."""
    global _default_key
    if key is None or not dataclasses.is_dataclass(key):
        return ""
    if _default_key is None:
        _default_key = _jax.jit_global_cache_key(_jax.jit_info(_jax.jax_jit(lambda x: x)))
    differing = {f.name: getattr(key, f.name) for f in dataclasses.fields(key)
                 if not f.name.endswith("_treedef")
                 and getattr(key, f.name) != getattr(_default_key, f.name)}
    if "donate_argnums" in differing:
        differing.pop("donate_argnames", None)  # derived from the numbers
    return ", ".join(f"{k}={_short(v)}" for k, v in differing.items())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def stats() -> StatsTable:
    """The `DispatchStats` of every live nbjit function, keyed by its name
    (`function_label`: ``"qualname (file.py:LINE)"``, ``#N`` for the N-th
    function of that name and site, its jit options if any), oldest first.

    Twins (same function, same options) share one row.
    """
    rows: dict[str, DispatchStats] = {}
    seen: set[int] = set()
    for jitted in live_functions():
        namespace = info(jitted).namespace
        if id(namespace) in seen:
            continue
        seen.add(id(namespace))
        s = jitted.stats()
        name, n = s.name, 1
        while name in rows:  # same function and options in another PjitFunctionCache
            n += 1
            name = f"{s.name} [cache {n}]"
        rows[name] = s if name == s.name else dataclasses.replace(s, name=name)
    return StatsTable(rows)
