"""The hit path's registries: its flavours, the switch between them, and the
live functions. The core owns them; the rooms above fill them when imported.

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
  * `use_flavour(name)` switches the hit path of every live function, and of
    every function made later, to flavour `name` ("plain" or "timed": a
    `nbjit.profile()` starting and ending).
  * `traced_call` is what a call runs while a profiler session collects
    (registered by `nbjit.observe.spans`; `set_traced_call`).
  * `register_live` / `live_functions`: every live jitted function (weak:
    registering keeps nothing alive), for `nbjit.stats()`; `live_listeners`
    hear of each new one (the run report's retired counts).
  * `SPANS`: the spans the miss and slow paths open in a profiler trace
    (`nbjit.observe.spans` fills them in; by default none).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["KEY_ONLY", "PLAIN", "SPANS", "Flavour", "SpanHooks", "add_flavour", "current_flavour",
           "flavour", "live_functions", "live_listeners", "register_live", "set_traced_call",
           "traced_call", "use_flavour", "watch_table"]


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
    """

    name: str
    start: str = ""
    stamps: tuple[str, str, str, str] = ("", "", "", "")
    finish: str = ""
    leave: str = "{fn}({args})"
    scope: Mapping[str, Any] = field(default_factory=dict)
    keys_only: bool = False


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
    profiler session, `traced_call`) and "key_only" runs nothing: neither can be
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


# ---------------------------------------------------------------------------
# The call while a profiler session collects


def _untraced(jitted: Any, args: tuple, kwargs: dict) -> Any:
    raise LookupError("no traced call registered (import nbjit: nbjit.observe registers it)")


_traced_call: Callable[[Any, tuple, dict], Any] = _untraced


def set_traced_call(call: Callable[[Any, tuple, dict], Any]) -> None:
    """Sets what a call runs while a profiler session collects (`nbjit.observe.spans`)."""
    global _traced_call
    _traced_call = call


def traced_call(jitted: Any, args: tuple, kwargs: dict) -> Any:
    """The call of `jitted` while a profiler session collects (see `set_traced_call`)."""
    return _traced_call(jitted, args, kwargs)


# ---------------------------------------------------------------------------
# The live functions (weak: registering keeps nothing alive)

_live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # -> creation order
_live_lock = threading.Lock()
_registered = itertools.count()


# Listeners called with each newly registered function (observe's retired
# counts join here); they run outside the lock and must not raise.
live_listeners: list[Callable[[Any], None]] = []


def register_live(jitted: Any) -> None:
    """Called once per jitted function, at construction."""
    with _live_lock:
        _live[jitted] = next(_registered)
    for listener in live_listeners:
        listener(jitted)


def live_functions() -> list[Any]:
    """The live jitted functions, oldest first."""
    with _live_lock:
        return sorted(_live, key=_live.__getitem__)


# ---------------------------------------------------------------------------
# The spans of the miss and slow paths, while a profiler session collects
# (`nbjit.observe.spans` fills these in when imported; by default: none)

_NO_SPAN = contextlib.nullcontext()


def _no_span(*_args: Any) -> Any:
    return _NO_SPAN


class SpanHooks:
    """What the miss and slow paths open around their work in a profiler trace.

    `slow_span(reason)`, `miss_span(description, explaining)` and
    `compile_span()` return context managers; `slow_call(jitted, reason, args,
    kwargs)` is a slow call's run of JAX's path while a session collects."""

    def __init__(self) -> None:
        self.slow_span: Callable[[str], Any] = _no_span
        self.miss_span: Callable[[Any, Callable[[Any], Any]], Any] = _no_span
        self.compile_span: Callable[[], Any] = _no_span
        self.slow_call: Callable[[Any, str, tuple, dict], Any] | None = None


SPANS = SpanHooks()
