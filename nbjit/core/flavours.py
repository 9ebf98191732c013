"""The hit path's flavours and the switch between them. The core owns the
registry; the rooms above fill it when imported.

As JAX's `monitoring.py` keeps its listener lists at the bottom and lets
higher layers register into them, and Numba's `core/event.py` lets any
module listen, the binders (`nbjit.core.binders`) import nothing of
`nbjit.observe`: observability registers what its flavours add to a hit.

  * A `Flavour` is what a flavour adds to the one hit path the binders emit:
    lines run first, after each phase (key, lookup, inputs, execute) and
    before returning, how the hit path leaves for a slow path, and the names
    those lines read. "plain" (nothing added) and "key_only" (keys a call,
    runs nothing) are the core's; `nbjit.observe.profile` registers "timed",
    `nbjit.observe.spans` "traced" (`add_flavour`).
  * `use_flavour(name)` switches the binder table of every live function,
    and of every function made later, to flavour `name` ("plain" or
    "timed": a `nbjit.profile()` starting and ending): its binders, and
    whether `PjitFunction.__call__` stamps a call's ends
    (`Flavour.entry_stamp`, the table's `stamps_entry`).

What a call does in a profiler session outside its hit path (the traced
call, the spans of the miss and slow paths) is in `nbjit.core.profiler`;
the live functions are in `nbjit.core.live`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["KEY_ONLY", "PLAIN", "Flavour", "add_flavour", "current_flavour", "flavour",
           "flavour_names", "use_flavour", "watch_table"]


@dataclass(frozen=True)
class Flavour:
    """What one flavour adds to the hit path (each piece is one statement of
    source, without indentation: the binder's emitter places it; "" for none).

    `start`: run first; `stamps`: after the key, lookup, inputs and execute
    phases; `finish`: after the outputs are in `out`, before it is returned;
    `leave`: how the hit path calls a slow path, with ``{fn}`` (the path) and
    ``{args}`` (its arguments); `scope`: the names these pieces read.
    `keys_only`: the binder returns ``(leaves, key, shardings)`` after keying
    and runs nothing.

    `entry_stamp`: `PjitFunction.__call__` stamps the call's ends, with
    `time.perf_counter_ns` (the flavour's own stamps read the same clock):
    while such a flavour is on it reads the clock first, runs the call
    through the dispatcher's stamped call, which hands the binder `stamps`
    (a list holding that first reading), and sets the list's last item to
    the clock as it returns. The binder adds its own stamps to the list (a
    last item at least, which `__call__` then overwrites), so that they
    span the whole call but `__call__`'s own frame. The binders take
    ``stamps=None`` and run `start` (which sets `stamps`) only for a call
    that came another way (a profiler session's traced call). Otherwise
    `__call__` reads no clock.
    """

    name: str
    start: str = ""
    stamps: tuple[str, str, str, str] = ("", "", "", "")
    finish: str = ""
    leave: str = "{fn}({args})"
    scope: Mapping[str, Any] = field(default_factory=dict)
    keys_only: bool = False
    entry_stamp: bool = False


PLAIN = Flavour("plain")
KEY_ONLY = Flavour("key_only", leave="refuse({args})", keys_only=True)

_flavours: dict[str, Flavour] = {"plain": PLAIN, "key_only": KEY_ONLY}
_lock = threading.Lock()
_current = "plain"  # the flavour new binder tables start in (under _lock)


def add_flavour(f: Flavour) -> Flavour:
    """Registers flavour `f` under its name (a room does, when imported)."""
    _flavours[f.name] = f
    return f


def flavour(name: str) -> Flavour:
    """The registered flavour `name` (KeyError if no room registered it)."""
    return _flavours[name]


def flavour_names() -> list[str]:
    """The names of the registered flavours, in order of registration."""
    return list(_flavours)


def current_flavour() -> str:
    """The flavour every binder table uses now ("plain" unless switched)."""
    return _current


class _Table(Protocol):
    def set_flavour(self, name: str) -> None: ...


# id -> binder table (a table is a dict: unhashable, and equal to any other empty one)
_tables: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def watch_table(table: _Table) -> str:
    """Registers a binder table for `use_flavour` (weakly) and returns the flavour it starts in."""
    with _lock:
        _tables[id(table)] = table
        return _current


def use_flavour(name: str) -> None:
    """Every binder table, live and future, switches to flavour `name`: "plain",
    or one that times the hit path ("timed"). "traced" is chosen per call (a
    profiler session: `nbjit.core.profiler`) and "key_only" runs nothing: neither can be
    every call's."""
    global _current
    flavour(name)  # registered
    if name in ("traced", "key_only"):
        raise ValueError(f"flavour {name!r} cannot be switched on for every call")
    with _lock:
        _current = name
        tables = list(_tables.values())
    for table in tables:
        table.set_flavour(name)
