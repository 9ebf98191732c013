"""Explained misses: which field of a call differs from the closest cached one.

At every miss the dispatcher calls `describe_call` (per-leaf path, kind,
dtype, shape, weak type, sharding, committedness; static values; keyword
names; pytree structure; trace context) and the new entry keeps the
description: the cost is paid on misses only, never on hits. While
`jax.config.jax_explain_cache_misses` is on, or inside
``with nbjit.explain_misses():``, a miss of a function that already holds
entries logs one WARNING on the ``nbjit`` logger (`explain_miss`) naming
the function, the call site, and what differs from the closest cached
signature, whether the signature had been evicted by the LRU, and whether
JAX compiled anything new for it.

The closest entry among many (shape churn leaves thousands) is found over
packed int64 rows: by a Python loop for small caches, by one Numba kernel
call over all rows (`_kernels.description_distances`) from
`NUMBA_CLOSEST_MIN_WORDS` packed words on (the measured crossover,
benchmarks/benchmarks/bench_observe.py `ClosestEntry`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbjit import _jax

logger = logging.getLogger("nbjit")

__all__ = ["CallDescription", "LeafDescription", "describe_call", "explain",
           "explain_misses", "enabled"]

# Measured crossover (bench_observe.ClosestEntry's setup and timed method,
# min of 7 repeats in thread CPU time, 2-core machine at load ~9, 15:05
# 2026-11-30): the Numba call costs ~9 us fixed, the Python loop ~0.04-0.07 us
# per packed word. 1 leaf per entry: 30 entries (360 words) Python 24.6 vs
# Numba 27.3 us, 100 entries (1200) 82.6 vs 31.9; 10 leaves: 3 entries (225)
# 8.8 vs 9.9, 10 entries (750) 30.6 vs 12.5; 100 leaves: 1 entry (705) 35.6
# vs 9.7; 1000 x 100 leaves 42.8 ms vs 1.2 ms. Numba from this many words on.
NUMBA_CLOSEST_MIN_WORDS = 400

_HEADER = 5  # _kernels.DESCRIPTION_HEADER_WORDS (not imported: numba loads lazily)
_MAX_DIFFERENCES = 4  # differences named per message


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
# Descriptions


@dataclass(frozen=True, eq=False)
class LeafDescription:
    """One argument leaf as the key sees it. `kind`: 'jax.Array', 'numpy', or a type name."""

    path: str
    kind: str
    dtype: Any = None
    shape: tuple | None = None
    weak_type: bool | None = None
    sharding: Any = None
    committed: bool | None = None


@dataclass(frozen=True, eq=False)
class CallDescription:
    """Everything that enters one call's key, per argument path."""

    leaves: tuple[LeafDescription, ...]
    statics: tuple[tuple[str, type, Any], ...]  # (path, exact type, value)
    keyword_names: tuple[str, ...]  # sorted
    structure: tuple[tuple[str, str], ...]  # (argument path, its treedef) for pytrees
    context: tuple
    row: tuple[int, ...]  # packed (see _kernels: DESCRIPTION_*)
    array: np.ndarray  # the same row as int64, for the kernel


def _word(value: Any) -> int:
    """One packed word standing for `value`: its hash (-1 if unhashable).

    Equal values give equal words; a rare collision only makes the closest
    entry less sharp (the message compares the descriptions themselves). A
    hash, not an interning table, so that no value outlives its entry here.
    """
    try:
        return hash(value)
    except TypeError:
        return -1


def _describe_leaf(path: str, x: Any) -> LeafDescription:
    if isinstance(x, _jax.ArrayImpl) or isinstance(x, _jax.Tracer):
        aval = x.aval
        if isinstance(x, _jax.Tracer):
            return LeafDescription(path, type(x).__name__, getattr(aval, "dtype", None),
                                   getattr(aval, "shape", None), getattr(aval, "weak_type", None))
        return LeafDescription(path, "jax.Array", aval.dtype, aval.shape, aval.weak_type,
                               x.sharding, x._committed)
    if isinstance(x, np.ndarray | np.generic):
        return LeafDescription(path, "numpy", x.dtype, x.shape, False)
    if type(x) in _jax.python_scalar_types:
        return LeafDescription(path, type(x).__name__, None, (), True)
    return LeafDescription(path, type(x).__name__)


def _flatten_argument(path: str, value: Any, leaves: list, structure: list) -> None:
    from jax import tree_util

    pairs, treedef = tree_util.tree_flatten_with_path(value)
    if treedef.num_nodes != 1 or treedef.num_leaves != 1:
        structure.append((path, str(treedef)))
    for key_path, leaf in pairs:
        leaves.append(_describe_leaf(path + tree_util.keystr(key_path), leaf))


def describe_call(args: tuple, kwargs: dict, static_positions: Sequence[int],
                  static_names: Sequence[str], context: tuple) -> CallDescription:
    """The description of one call (the original `args` and `kwargs`, statics included).

    Called on misses only: flattening with paths costs tens of microseconds.
    """
    static_positions = set(static_positions)
    leaves: list[LeafDescription] = []
    statics: list[tuple[str, type, Any]] = []
    structure: list[tuple[str, str]] = []
    for i, value in enumerate(args):
        if i in static_positions:
            statics.append((f"args[{i}]", type(value), value))
        else:
            _flatten_argument(f"args[{i}]", value, leaves, structure)
    for name in sorted(kwargs):
        if name in static_names:
            statics.append((f"kwargs[{name!r}]", type(kwargs[name]), kwargs[name]))
        else:
            _flatten_argument(f"kwargs[{name!r}]", kwargs[name], leaves, structure)
    names = tuple(sorted(kwargs))
    row = [len(leaves), _word((len(args), tuple(structure))), _word(names),
           _word(tuple(statics)), _word(context)]
    for leaf in leaves:
        row += (_word(leaf.kind), _word(leaf.dtype), _flag(leaf.weak_type),
                _flag(leaf.committed), _word(leaf.sharding),
                -1 if leaf.shape is None else len(leaf.shape), _word(leaf.shape))
    return CallDescription(tuple(leaves), tuple(statics), names, tuple(structure), context,
                           tuple(row), np.array(row, dtype=np.int64))


def _flag(value: bool | None) -> int:
    return -1 if value is None else int(value)


# ---------------------------------------------------------------------------
# The closest cached description


def closest(new: CallDescription, cached: Sequence[CallDescription]) -> tuple[int, int]:
    """(index, distance) of the cached description closest to `new`."""
    from nbjit import _kernels

    if len(cached) * len(new.row) < NUMBA_CLOSEST_MIN_WORDS:
        return _kernels.closest_python(new.row, [d.row for d in cached])
    return _kernels.closest_numba(new.array, [d.array for d in cached])


# ---------------------------------------------------------------------------
# What differs


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _aval_text(leaf: LeafDescription) -> str:
    if leaf.dtype is None:
        return leaf.kind
    shape = ",".join(str(d) for d in leaf.shape or ())
    return f"{np.dtype(leaf.dtype).name}[{shape}]"


def _leaf_differences(old: LeafDescription, new: LeafDescription) -> list[str]:
    p = new.path
    if old.kind != new.kind:
        return [f"{p}: kind {old.kind} -> {new.kind}"]
    out = []
    if old.dtype != new.dtype:
        out.append(f"{p}: dtype {_aval_text(old)} -> {_aval_text(new)}")
    if old.shape != new.shape:
        out.append(f"{p}: shape {_aval_text(old)} -> {_aval_text(new)}")
    if old.weak_type != new.weak_type:
        out.append(f"{p}: weak type {old.weak_type} -> {new.weak_type}")
    if old.committed != new.committed:
        out.append(f"{p}: committed {old.committed} -> {new.committed}")
    if old.sharding is not new.sharding and old.sharding != new.sharding:
        out.append(f"{p}: sharding {_show(old.sharding)} -> {_show(new.sharding)}")
    return out


def _context_differences(old: tuple, new: tuple) -> list[str]:
    try:
        names = _jax.trace_context_names()
    except Exception:  # a jax without names: positions only
        names = ()
    out = []
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            name = names[i] if i < len(names) else f"trace context position {i}"
            out.append(f"trace context {name}: {_show(a)} -> {_show(b)}")
    return out


def differences(old: CallDescription, new: CallDescription) -> list[str]:
    """Every field of `new` that differs from `old`, each naming its argument path."""
    out: list[str] = []
    if old.keyword_names != new.keyword_names:
        out.append(f"keyword names {old.keyword_names} -> {new.keyword_names}")
    old_structure, new_structure = dict(old.structure), dict(new.structure)
    for path in dict.fromkeys([*old_structure, *new_structure]):
        if old_structure.get(path) != new_structure.get(path):
            out.append(f"{path}: pytree structure {old_structure.get(path, '(a leaf)')} -> "
                       f"{new_structure.get(path, '(a leaf)')}")
    old_statics = {p: (t, v) for p, t, v in old.statics}
    for path, kind, value in new.statics:
        if path not in old_statics:
            continue
        old_kind, old_value = old_statics[path]
        if old_kind is not kind:
            out.append(f"{path}: static argument type {old_kind.__name__} -> {kind.__name__}")
        elif not _equal(old_value, value):
            out.append(f"{path}: static argument value {_show(old_value)} -> {_show(value)}")
    old_leaves = {leaf.path: leaf for leaf in old.leaves}
    for leaf in new.leaves:
        before = old_leaves.get(leaf.path)
        if before is not None:
            out += _leaf_differences(before, leaf)
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


_SITE_PACKAGES = os.path.dirname(os.path.dirname(_jax.jax.__file__))
_NOT_CALL_SITES = (os.path.dirname(__file__) + os.sep,
                   os.path.join(_SITE_PACKAGES, "jax") + os.sep,
                   os.path.join(_SITE_PACKAGES, "jaxlib") + os.sep)


def call_site() -> str:
    """file:line of the first frame outside nbjit and jax."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_CALL_SITES):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@dataclass(frozen=True)
class MissContext:
    """What the dispatcher knows about a miss beyond the call's description."""

    name: str  # qualified name of the function
    cached: Sequence[CallDescription]  # descriptions of its entries now
    evicted: Sequence[CallDescription] = ()  # of its recently evicted entries
    twin_options: Sequence[tuple[Any, Any]] = ()  # (other global key, own) with entries
    capacity: int = 0
    jax_misses: tuple[tuple[int, int], tuple[int, int]] | None = None  # before, after


def explain(new: CallDescription, miss: MissContext) -> str:
    """One message saying why `new` missed."""
    from nbjit._agreement import process_label  # multi-controller: whose miss

    label = process_label()
    where = f" ({label})" if label else ""
    parts = [f"nbjit cache miss of {miss.name}{where} at {call_site()}"]
    evicted = [d for d in miss.evicted if d.row == new.row and not differences(d, new)]
    if evicted:
        parts.append("this signature was compiled before; the LRU evicted its entry "
                     f"(cache capacity {miss.capacity})")
    elif miss.cached:
        index, distance = closest(new, miss.cached)
        found = differences(miss.cached[index], new)
        shown = "; ".join(found[:_MAX_DIFFERENCES])
        if len(found) > _MAX_DIFFERENCES:
            shown += f"; and {len(found) - _MAX_DIFFERENCES} more"
        parts.append(f"against the closest of {len(miss.cached)} cached signatures: "
                     + (shown or "no described field differs"))
    elif miss.twin_options:
        other, own = miss.twin_options[0]
        parts.append("no entries with these options; another jit of the same function "
                     "has entries: " + "; ".join(options_differences(other, own)))
    if miss.jax_misses is not None:
        (trace0, compile0), (trace1, compile1) = miss.jax_misses
        if trace1 == trace0 and compile1 == compile0:
            parts.append("JAX compiled nothing new (its trace and compile caches held it)")
        elif compile1 == compile0:
            parts.append("JAX traced again but compiled nothing new")
        else:
            parts.append("JAX traced and compiled")
    return ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


def log_miss(new: CallDescription, miss: MissContext) -> None:
    try:
        message = explain(new, miss)
    except Exception as error:  # explaining must never break a call
        message = f"nbjit cache miss of {miss.name} (not explained: {error!r})"
    logger.warning(message)
