"""Explained misses: which field of a call differs from the closest cached one.

At every miss the dispatcher calls `describe_call`
(`nbjit.observe.descriptions`: per-leaf path, kind, dtype, shape, weak
type, sharding, committedness; static values; keyword names; pytree
structure; trace context) and the new entry keeps the description: the
cost is paid on misses only, never on hits. While
`jax.config.jax_explain_cache_misses` is on, or inside
``with nbjit.explain_misses():``, a miss of a function that already holds
(or held) entries logs one WARNING on the ``nbjit`` logger (`miss_done`) naming
the function, the call site, and what differs from the closest cached
signature, whether the signature had been evicted by the LRU, and whether
JAX compiled anything new for it. Every field that differs is named: a
changed pytree structure by each node where the treedefs part
(``args[0].scale (static field): 1.0 -> 2.0``:
`nbjit.observe.names.node_differences`), in at most 120 characters each;
a leaf of another kind by its kind, and by its dtype and shape where those
changed too.

Every miss is explained and timed, logged or not: `ranked_misses()` groups
them by function, call site and differing fields, costliest first, and
``with nbjit.assert_max_misses(n):`` fails a block with more than `n`,
naming them.

The closest entry among many (shape churn leaves thousands) is the one
with the fewest differing fields, each static argument, leaf field and
structural change counted (leaves matched by path; ties: the newest),
found over packed int64 rows: by a Python loop for small caches
(`nbjit.observe.distance`, which loads no numba), by one Numba kernel call over
all rows (`_kernels.description_distances`) from `NUMBA_CLOSEST_MIN_WORDS`
packed words on (the measured crossover, benchmarks/benchmarks/
bench_observe.py `ClosestEntry`) once numba is loaded.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit.observe import distance as _distance
from nbjit.observe import stats as _stats
from nbjit.observe.descriptions import (
    CONTEXT_WORD,
    STRUCTURE_WORD,
    CallDescription,
    LeafDescription,
)
from nbjit.observe.names import (
    aval_text,
    call_site,
    process_label,
    structure_differences,
    value_text,
)
from nbjit.observe.table import Table

logger = logging.getLogger("nbjit")

__all__ = ["RankedMiss", "RankedMisses", "assert_max_misses", "enabled", "explain",
           "explain_misses", "ranked_misses", "reset_ranked_misses"]

# The crossover: the Numba call has a fixed cost that the Python loop, whose
# cost grows per packed word, overtakes from about this many words on.
# Measured by benchmarks/benchmarks/bench_observe.py ClosestEntry; the
# numbers are in docs/performance.md#measured-constants-behind-the-code.
NUMBA_CLOSEST_MIN_WORDS = 400
# Past this many words the Python loop costs so much per miss (every miss is
# explained) that loading numba soon pays for itself: Numba then, even if it
# must be loaded first.
PYTHON_CLOSEST_MAX_WORDS = 100_000

_MAX_DIFFERENCES = 4  # differences named per message
_MAX_TIED = 3  # equally close entries named per message


# ---------------------------------------------------------------------------
# On/off: nestable, thread-safe (a global depth, not per thread)

_depth = 0
_depth_lock = threading.Lock()


@contextlib.contextmanager
def explain_misses() -> Iterator[None]:
    """Explain every nbjit miss (of a function with entries) inside the block."""
    global _depth
    with _depth_lock:
        _depth += 1
    try:
        yield
    finally:
        with _depth_lock:
            _depth -= 1


def enabled() -> bool:
    return _depth > 0 or bool(_jax.explain_cache_misses.value)


# ---------------------------------------------------------------------------
# The closest cached description


def closest(new: CallDescription, cached: Sequence[CallDescription]) -> tuple[int, int]:
    """(index, distance) of the cached description closest to `new`: the fewest
    differing fields, leaves matched by path; on ties the last (pass `cached`
    oldest first, as `by_age` orders it, and the most recent wins).

    The Numba kernel past the crossover, once numba is loaded (or past
    `PYTHON_CLOSEST_MAX_WORDS`, where the Python loop is slow enough that
    loading numba pays off): every miss is explained for `ranked_misses`, and
    loading numba is slow, so small caches never pay for it.
    """
    if _in_python(new, cached):
        return _distance.closest_python(new.row, [d.row for d in cached])
    from nbjit import _kernels  # deferred: importing numba is slow (see above)

    return _kernels.closest_numba(new.array, [d.array for d in cached])


def _in_python(new: CallDescription, cached: Sequence[CallDescription]) -> bool:
    """Whether distances to `cached` are counted by the Python loop rather than
    the Numba kernel: below the crossover, or below `PYTHON_CLOSEST_MAX_WORDS`
    while numba is not loaded yet."""
    words = len(cached) * len(new.row)
    return words < NUMBA_CLOSEST_MIN_WORDS or (
        words < PYTHON_CLOSEST_MAX_WORDS and "nbjit._kernels" not in sys.modules)


def _distances(new: CallDescription, cached: Sequence[CallDescription]) -> np.ndarray:
    """The packed distance (`nbjit.observe.distance`) of `new` to each of `cached`."""
    if _in_python(new, cached):
        return np.array([_distance.description_distance_python(new.row, d.row)
                         for d in cached], dtype=np.int64)
    from nbjit import _kernels

    rows = [d.array for d in cached]
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([r.shape[0] for r in rows], out=offsets[1:])
    return _kernels.description_distances(new.array, np.concatenate(rows), offsets)


def by_age(descriptions: Sequence[CallDescription]) -> list[CallDescription]:
    """`descriptions` oldest first (the order `closest` breaks ties by)."""
    return sorted(descriptions, key=lambda d: d.serial)


def _show(value: Any) -> str:
    """A value in a message, in at most 60 characters: functions and classes by
    name (`nbjit.observe.names.value_text`), everything else by its repr."""
    text = value_text(value)
    return text if len(text) <= 60 else text[:57] + "..."


_WEAK_TYPE_FIX = ("a Python scalar (and what JAX computes from one alone) is weakly typed, "
                  "a numpy or typed jax value is not: pass the same kind every call, e.g. "
                  "jnp.float32(x) or np.float32(x) instead of a bare Python float")


def _weak_text(weak: bool | None) -> str:
    return "none" if weak is None else "weak" if weak else "strong"


def _leaf_differences(old: LeafDescription, new: LeafDescription) -> list[tuple[str, str]]:
    p = new.path
    if old.kind != new.kind:
        # Another kind: its committedness, sharding and weak type follow from
        # the kind; a dtype or shape that both have and that changed too is
        # named as well (numpy f32[8,8] -> jax.Array f32[16,8]: both fields).
        text = f"{p}: kind {old.kind} -> {new.kind}"
        if old.weak_type is not None and new.weak_type is not None \
                and old.weak_type != new.weak_type:
            text += (f" (the weak type changed: {_weak_text(old.weak_type)} -> "
                     f"{_weak_text(new.weak_type)}; {_WEAK_TYPE_FIX})")
        changed = [(f"{p}: kind", text)]
        if old.dtype is not None and new.dtype is not None and old.dtype != new.dtype:
            changed.append((f"{p}: dtype", f"{p}: dtype {aval_text(old)} -> {aval_text(new)}"))
        if old.shape is not None and new.shape is not None and old.shape != new.shape:
            changed.append((f"{p}: shape", f"{p}: shape {aval_text(old)} -> {aval_text(new)}"))
        return changed
    out = []
    if old.dtype != new.dtype:
        out.append((f"{p}: dtype", f"{p}: dtype {aval_text(old)} -> {aval_text(new)}"))
    if old.shape != new.shape:
        out.append((f"{p}: shape", f"{p}: shape {aval_text(old)} -> {aval_text(new)}"))
    if old.weak_type != new.weak_type:
        out.append((f"{p}: weak type", f"{p}: weak type {old.weak_type} -> {new.weak_type} "
                                       f"({_WEAK_TYPE_FIX})"))
    if old.committed != new.committed:
        out.append((f"{p}: committed", f"{p}: committed {old.committed} -> {new.committed}"))
    if old.sharding is not new.sharding and old.sharding != new.sharding:
        out.append((f"{p}: sharding",
                    f"{p}: sharding {_show(old.sharding)} -> {_show(new.sharding)}"))
    return out


def _context_differences(old: tuple, new: tuple) -> list[tuple[str, str]]:
    try:
        names = _jax.trace_context_names()
    except Exception:  # a jax without names: positions only
        names = ()
    out = []
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            name = names[i] if i < len(names) else f"trace context position {i}"
            out.append((f"trace context {name}",
                        f"trace context {name}: {_show(a)} -> {_show(b)}"))
    return out


def differences(old: CallDescription, new: CallDescription) -> list[str]:
    """Every field of `new` that differs from `old`, each naming its argument path."""
    return [text for _, text in field_differences(old, new)]


def field_differences(old: CallDescription, new: CallDescription) -> list[tuple[str, str]]:
    """(field, message) of every field of `new` that differs from `old`; the field
    (``"args[0]: shape"``) is what `ranked_misses` groups by."""
    out: list[tuple[str, str]] = []
    if old.keyword_names != new.keyword_names:
        out.append(("keyword names",
                    f"keyword names {old.keyword_names} -> {new.keyword_names}"))
    old_args, new_args = old.positional, new.positional
    if old_args != new_args:
        out.append(("positional argument count",
                    f"positional argument count {old_args} -> {new_args}"))
    out += structure_differences(old, new)
    old_statics = {p: (t, v) for p, t, v in old.statics}
    old_leaves = {leaf.path: leaf for leaf in old.leaves}
    for path, kind, value in new.statics:
        if path not in old_statics:
            if path in old_leaves:  # filter_jit: an array before, a static value now
                out.append((f"{path}: kind", f"{path}: kind {old_leaves[path].kind} -> "
                                             f"static {kind.__name__}"))
            continue
        old_kind, old_value = old_statics[path]
        if old_kind is not kind:  # the values too: jax.nn.relu (a custom_jvp) -> a function
            out.append((f"{path}: static argument type",
                        f"{path}: static argument {_show(old_value)} -> {_show(value)} "
                        f"(type {old_kind.__name__} -> {kind.__name__})"))
        elif not _equal(old_value, value):
            old_text, new_text = _show(old_value), _show(value)
            change = ("a new object, not equal" if old_text == new_text  # looks the same
                      else f"{old_text} -> {new_text}")
            out.append((f"{path}: static argument value",
                        f"{path}: static argument value {change}"))
    for leaf in new.leaves:
        before = old_leaves.get(leaf.path)
        if before is not None:
            out += _leaf_differences(before, leaf)
        elif leaf.path in old_statics:  # filter_jit: a static value before, an array now
            was = old_statics[leaf.path][0].__name__
            out.append((f"{leaf.path}: kind", f"{leaf.path}: kind static {was} -> {leaf.kind}"))
    out += _context_differences(old.context, new.context)
    return out


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def options_differences(old: Any, new: Any) -> list[str]:
    """The jit options (JAX's global cache keys: a dataclass, or dicts) that differ."""
    if dataclasses.is_dataclass(old):
        old = {f.name: getattr(old, f.name) for f in dataclasses.fields(old)}
        new = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)}
    out = []
    for name in sorted(set(old) | set(new)):
        if _equal(old.get(name), new.get(name)):
            continue
        out.append(f"option {name}: {_show(old.get(name))} -> {_show(new.get(name))}")
    return out


# ---------------------------------------------------------------------------
# The message


@dataclass(frozen=True)
class MissContext:
    """What the dispatcher knows about a miss beyond the call's description."""

    name: str  # the function's name (`nbjit.observe.names.function_name`, with its options)
    cached: Sequence[CallDescription]  # descriptions of its entries now
    evicted: Sequence[CallDescription] = ()  # of its recently evicted entries
    twin_options: Sequence[tuple[Any, Any]] = ()  # (other global key, own) with entries
    capacity: int = 0
    jax_misses: tuple[tuple[int, int], tuple[int, int]] | None = None  # before, after
    # The function's name without the #N of re-definitions (`ranked_misses` groups by it).
    location: str = ""


FIRST_CALL = "first call"  # the field of a miss with nothing to compare against
EVICTED = "evicted by the LRU"
OPTIONS = "jit options"


def _closest_entries(new: CallDescription, cached: Sequence[CallDescription]
                     ) -> tuple[list[int], int]:
    """(up to `_MAX_TIED` indices into `cached` (oldest first) of descriptions as
    close to `new` as the closest, how many are): those with `new`'s shardings
    first (the same placement, so the fields that differ are what the caller
    changed), then the most recent first, as `closest` picks.

    Close means the fewest differing fields, as `field_differences` names
    them. The packed distance counts each exactly but for two header words,
    the pytree structure and the trace context, which count one however many
    of their fields differ: for an entry where one of those differs, the
    fields are counted (`field_differences`) while its packed distance could
    still make it the closest (a packed distance never exceeds the count).
    """
    distances = _distances(new, cached)
    counted = np.zeros(len(cached), dtype=bool)
    row = new.row
    while True:
        best = int(distances.min())
        refine = [i for i in np.flatnonzero((distances == best) & ~counted).tolist()
                  if cached[i].row[STRUCTURE_WORD] != row[STRUCTURE_WORD]
                  or cached[i].row[CONTEXT_WORD] != row[CONTEXT_WORD]]
        if not refine:
            break
        for i in refine:
            counted[i] = True
            distances[i] = max(int(distances[i]), len(field_differences(cached[i], new)))
    tied = np.flatnonzero(distances == best)[::-1].tolist()  # the most recent first
    shardings = [leaf.sharding for leaf in new.leaves]
    same: list[int] = []
    other: list[int] = []
    for i in tied:  # shape churn ties thousands, most with the same shardings: stop early
        (same if [leaf.sharding for leaf in cached[i].leaves] == shardings else other).append(i)
        if len(same) == _MAX_TIED:
            break
    return (same + other)[:_MAX_TIED], len(tied)


def _why(new: CallDescription | None, miss: MissContext) -> tuple[tuple[str, ...], str]:
    """(the fields the miss is grouped by, the sentence that explains it)."""
    if new is None:
        return ("not described",), "the call could not be described"
    if any(d.row == new.row and not differences(d, new) for d in miss.evicted):
        return (EVICTED,), ("this signature was compiled before; the LRU evicted its entry "
                            f"(cache capacity {miss.capacity})")
    if miss.cached:
        cached = by_age(miss.cached)
        named, n_tied = _closest_entries(new, cached)
        tied = [field_differences(cached[i], new) for i in named]
        shown: list[str] = []
        for found in tied:
            text = "; ".join(text for _, text in found[:_MAX_DIFFERENCES])
            if len(found) > _MAX_DIFFERENCES:
                text += f"; and {len(found) - _MAX_DIFFERENCES} more"
            text = text or "no described field differs"
            if text not in shown:  # two entries that read alike are one alternative
                shown.append(text)
        fields = tuple(field for field, _ in tied[0]) or ("no described field",)
        if n_tied == 1:
            return fields, f"against the closest of {len(cached)} cached signatures: {shown[0]}"
        more = f"; or {n_tied - len(named)} more" if n_tied > len(named) else ""
        return fields, (f"{n_tied} of {len(cached)} cached signatures are equally close: "
                        + "; or ".join(f"({text})" for text in shown) + more)
    if miss.twin_options:
        other, own = miss.twin_options[0]
        return (OPTIONS,), ("no entries with these options; another jit of the same "
                            "function has entries: " + "; ".join(options_differences(other, own)))
    return (FIRST_CALL,), "no entry to compare with (the first compile of this function)"


def what_changed(new: CallDescription | None, miss: MissContext) -> str:
    """The sentence that explains why `new` missed (`miss.jax_misses` unread):
    what the explained-miss log says after the function and call site."""
    return _why(new, miss)[1]


def _message(name: str, site: str, why: str, miss: MissContext) -> str:
    label = process_label()  # multi-controller: whose miss
    where = f" ({label})" if label else ""
    parts = [f"nbjit cache miss of {name}{where} at {site}", why]
    if miss.jax_misses is not None:
        (trace0, compile0), (trace1, compile1) = miss.jax_misses
        if trace1 == trace0 and compile1 == compile0:
            parts.append("JAX compiled nothing new (its trace and compile caches held it)")
        elif compile1 == compile0:
            parts.append("JAX traced again but compiled nothing new")
        else:
            parts.append("JAX traced and compiled")
    return ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


def explain(new: CallDescription, miss: MissContext) -> str:
    """One message saying why `new` missed."""
    return _message(miss.name, call_site(), _why(new, miss)[1], miss)


# ---------------------------------------------------------------------------
# Every miss, explained and timed: `ranked_misses()` and `assert_max_misses`


@dataclass(frozen=True)
class MissRecord:
    """One miss: which function, where it was called, why, what its compile cost."""

    serial: int
    name: str
    site: str
    fields: tuple[str, ...]
    message: str
    seconds: float


RECENT_MISSES = 1024  # records kept for `assert_max_misses`' message
_recent: collections.deque[MissRecord] = collections.deque(maxlen=RECENT_MISSES)
# (function location, call site, fields) -> [count, seconds, message]
_groups: dict[tuple[str, str, tuple[str, ...]], list] = {}
# Groups `ranked_misses` keeps: past it, the cheapest goes (its misses are
# counted in `_dropped`), so a process that keeps making new functions (shape
# churn at many sites) holds a bounded table.
MAX_GROUPS = 500
_dropped: list[Any] = [0, 0, 0.0]  # groups, misses, seconds dropped past MAX_GROUPS
_record_lock = threading.Lock()
_miss_serials = itertools.count(1)
_last_serial = 0


def miss_done(new: CallDescription | None, miss: MissContext, seconds: float,
              host_inputs: str | None = None) -> None:
    """Called by the dispatcher after every compile it caches: groups the miss
    for `ranked_misses`, keeps it for `assert_max_misses`, and logs it when
    explaining is on (and the function had something to compare against).
    `host_inputs`: how the new signature's host leaves reach their device
    (`FastPath.host_path`), said at the message's end."""
    global _last_serial
    site = call_site()
    try:
        fields, why = _why(new, miss)
    except Exception as error:  # explaining must never break a call
        fields, why = ("not explained",), f"not explained: {error!r}"
    message = _message(miss.name, site, why, miss)
    if host_inputs is not None:
        message += f"; host inputs: {host_inputs}"
    # Re-definitions of one function (a notebook cell run again) are one group:
    # each new function object's first miss adds to its "first call" row.
    key = (miss.location or miss.name, site, fields)
    with _record_lock:
        serial = _last_serial = next(_miss_serials)
        _recent.append(MissRecord(serial, miss.name, site, fields, message, seconds))
        group = _groups.get(key)
        if group is None:
            _groups[key] = [1, seconds, message]
            if len(_groups) > MAX_GROUPS:
                _drop_cheapest(key)
        else:
            group[0] += 1
            group[1] += seconds
            group[2] = message  # the latest example
    if enabled() and fields != (FIRST_CALL,):
        logger.warning(message)


def _drop_cheapest(kept: tuple) -> None:
    """Forgets the group whose misses took the least time (not `kept`, just made)."""
    cheapest = min((k for k in _groups if k != kept), key=lambda k: (_groups[k][1], _groups[k][0]))
    count, seconds, _ = _groups.pop(cheapest)
    _dropped[0] += 1
    _dropped[1] += count
    _dropped[2] += seconds


def input_note_done(name: str | None, strategy: str, why: str | None, was: str | None
                    ) -> None:
    """Logs, while explaining is on, what happened to host inputs of function
    `name` (None: of the process): `strategy` given up for `why`, or a
    signature's host inputs going by `strategy` from now on (`was` before)."""
    if not enabled():
        return
    if why is not None:
        where = f"for {name}" if name else "in this process"
        logger.warning(f"nbjit: {strategy} given up {where}: {why}")
    else:
        logger.warning(f"nbjit: the host inputs of a signature of {name} now go by {strategy}"
                       + (f" (were: {was})" if was else ""))


def misses_since(serial: int) -> list[MissRecord]:
    """The kept records of misses after `serial` (`last_serial()` read earlier)."""
    with _record_lock:
        return [r for r in _recent if r.serial > serial]


def last_serial() -> int:
    return _last_serial


@dataclass(frozen=True)
class RankedMiss:
    """Misses of one function at one call site for the same reason."""

    function: str
    site: str
    fields: tuple[str, ...]  # what differed from the closest entry (or FIRST_CALL, ...)
    count: int
    seconds: float  # wall time of their traces, lowerings and compiles
    example: str  # the latest one's explanation


class RankedMisses(Sequence[RankedMiss]):
    """Misses grouped by function, call site and differing fields, costliest
    first; prints as a table (text and notebook HTML). `dropped`: (groups,
    misses, seconds) forgotten past `MAX_GROUPS`, the cheapest ones."""

    def __init__(self, rows: Sequence[RankedMiss],
                 dropped: tuple[int, int, float] = (0, 0, 0.0)) -> None:
        self._rows = list(rows)
        self.dropped = dropped

    def __getitem__(self, i: Any) -> Any:
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [{"function": r.function, "site": r.site, "fields": list(r.fields),
                 "count": r.count, "seconds": r.seconds, "example": r.example}
                for r in self._rows]

    def _table(self) -> Table:
        header = ["miss s", "misses", "function", "call site", "differs"]
        body = [[f"{r.seconds:.3f}", str(r.count), r.function, r.site, ", ".join(r.fields)]
                for r in self._rows]
        text_columns = frozenset({2, 3, 4})
        return Table(header, body, right=frozenset({0, 1}), left=text_columns,
                     code=text_columns)

    def _notes(self) -> list[str]:
        groups, misses, seconds = self.dropped
        if not groups:
            return []
        return [f"and {misses} cheaper misses ({seconds:.3f} s) in {groups} groups, forgotten: "
                f"at most {MAX_GROUPS} groups are kept (nbjit.reset_ranked_misses() starts over)"]

    def __str__(self) -> str:
        if not self._rows:
            return "no nbjit misses"
        return "\n".join([self._table().text(), *self._notes()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self._table().html(self._notes())


def ranked_misses(top: int | None = None) -> RankedMisses:
    """Every nbjit miss of this process so far, grouped by function, call site and
    the fields that differed from the closest cached entry, with how many and
    the time they took (JAX's trace, lowering and compile, or its cache
    lookups when it held the signature already), costliest first (`top`: only
    the first rows).

    Misses of functions that already had entries say which field to fix;
    ``first call`` rows are each function's unavoidable first miss. A
    function defined again by the same code (a notebook cell run again) is
    the same row's function: its name without the ``#N`` that `stats()`
    gives each function object, so that ``first call`` counts them. At most
    `MAX_GROUPS` groups are kept (the cheapest go first, and the table says
    how many); `reset_ranked_misses()` forgets them all.
    """
    with _record_lock:
        rows = [RankedMiss(name, site, fields, count, seconds, message)
                for (name, site, fields), (count, seconds, message) in _groups.items()]
        dropped = (int(_dropped[0]), int(_dropped[1]), float(_dropped[2]))
    rows.sort(key=lambda r: (-r.seconds, -r.count))
    return RankedMisses(rows[:top] if top is not None else rows, dropped)


def reset_ranked_misses() -> None:
    """Forgets the misses `ranked_misses` groups (``nbjit.reset_ranked_misses()``;
    the records for `assert_max_misses` stay)."""
    with _record_lock:
        _groups.clear()
        _dropped[:] = [0, 0, 0.0]


class _MissBudget:
    def __init__(self, misses: int, slow: int | None) -> None:
        self.misses, self.slow = misses, slow

    def __enter__(self) -> _MissBudget:
        self._serial = last_serial()
        self._slow_before = {name: s.slow_reasons for name, s in _stats.stats().items()} \
            if self.slow is not None else {}
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if kind is not None:
            return  # the block's own exception goes first
        problems = []
        records = misses_since(self._serial)
        count = last_serial() - self._serial
        if count > self.misses:
            lines = [f"  {r.message}" for r in records[:20]]
            if len(records) > 20:
                lines.append(f"  ... and {len(records) - 20} more")
            problems.append(f"{count} nbjit cache misses, at most {self.misses} allowed:\n"
                            + "\n".join(lines))
        if self.slow is not None:
            slow_lines, slow = [], 0
            for name, s in _stats.stats().items():
                before = self._slow_before.get(name, {})
                new = {r: n - before.get(r, 0) for r, n in s.slow_reasons.items()
                       if n > before.get(r, 0)}
                if new:
                    slow += sum(new.values())
                    slow_lines.append(f"  {name}: " + ", ".join(
                        f"{reason} {n} ({_stats.SLOW_REASONS.get(reason, reason)})"
                        for reason, n in sorted(new.items())))
            if slow > self.slow:
                problems.append(f"{slow} nbjit slow calls (JAX's own path), at most "
                                f"{self.slow} allowed:\n" + "\n".join(slow_lines))
        if problems:
            raise AssertionError("\n".join(problems))


def assert_max_misses(misses: int = 0, slow: int | None = None) -> _MissBudget:
    """``with nbjit.assert_max_misses(n, slow=0):`` fails the block with an
    AssertionError, naming each explained miss, when more than `misses` calls
    missed nbjit's cache inside it (whether or not JAX compiled anything new
    for them), or (with `slow`) when more than `slow` calls took JAX's own
    path, with their reasons.

    Counts are process-wide (every thread's calls count), as JAX's own
    compile caches are; a block that raises keeps its own exception.
    """
    return _MissBudget(misses, slow)
