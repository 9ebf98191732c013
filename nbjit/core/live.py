"""The live jitted functions: every `PjitFunction` made and not yet collected.

Held weakly: registering keeps nothing alive. `nbjit.stats()` reads them
(`live_functions`), and listeners hear of each new one (`add_live_listener`:
the run report's counts of functions collected before exit,
`nbjit.observe.stats`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["add_live_listener", "live_functions", "register_live"]

LiveListener = Callable[[Any], None]

_live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # -> creation order
_lock = threading.Lock()
_registered = itertools.count()
_listeners: list[LiveListener] = []


def add_live_listener(listener: LiveListener) -> LiveListener:
    """Registers `listener` (once), called with each function registered from
    now on, outside the lock; it must not raise: a raise would reach the code
    that made the function."""
    if listener not in _listeners:
        _listeners.append(listener)
    return listener


def register_live(jitted: Any) -> None:
    """Called once per jitted function, at construction (`PjitFunction.__init__`)."""
    with _lock:
        _live[jitted] = next(_registered)
    for listener in _listeners:
        listener(jitted)


def live_functions() -> list[Any]:
    """The live jitted functions, oldest first."""
    with _lock:
        return sorted(_live, key=_live.__getitem__)
