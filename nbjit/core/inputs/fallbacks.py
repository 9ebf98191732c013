"""Input strategies given up, and why: what `f.stats()` and the explain log name.

An input strategy that fails falls back, and no call breaks for it: the
per-leaf puts go on, numpy copies, the worker is not woken. Each such
fallback says why, here, once: `gave_up(strategy, error, counters)` keeps
the exception's type and message (`why`) under the strategy's name, for
the function whose namespace counters it is given
(`nbjit.core.cache.Counters.given_up`, which ``f.stats().given_up`` shows)
or, given none, for the whole process (`process_given_up`: a copy that
cannot be compiled here). The first time, the input listeners
(`nbjit.core.hooks.add_input_listener`) are told; so are they when a
node's record moves its host inputs another way (`moved`: per-leaf puts to
resident slots, say). `nbjit.observe` logs both while misses are explained.
"""

from __future__ import annotations

import threading
from typing import Any

from nbjit.core import hooks as _hooks

__all__ = ["gave_up", "moved", "process_given_up", "why"]

_process: dict[str, str] = {}  # strategy -> why, for fallbacks of the whole process
_lock = threading.Lock()


def why(error: BaseException | str) -> str:
    """What the reports say of a fallback's cause: an exception's type and
    message (``"MemoryError: ..."``), or `error` itself if it is text."""
    if isinstance(error, str):
        return error
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def gave_up(strategy: str, error: BaseException | str, counters: Any = None) -> None:
    """Records that `strategy` was given up because of `error`: the first time
    per strategy, for `counters`'s function (a `nbjit.core.cache.Counters`),
    or for the process with none; the input listeners hear of it then. Never
    raises (it is called from the handlers that fall back)."""
    given = _process if counters is None else counters.given_up
    text = why(error)
    with _lock:
        if strategy in given:
            return
        given[strategy] = text
    _tell(_hooks.InputNote(counters, strategy, text))


def moved(counters: Any, was: str | None, now: str | None) -> None:
    """A node's record now moves its host inputs `now` (`FastPath.host_path`),
    where it moved them `was`: the input listeners hear of it."""
    if now != was and now is not None:
        _tell(_hooks.InputNote(counters, now, None, was))


def process_given_up() -> dict[str, str]:
    """Strategy -> why, for the fallbacks of the whole process."""
    with _lock:
        return dict(_process)


def _tell(note: _hooks.InputNote) -> None:
    for listener in list(_hooks.input_listeners):
        try:
            listener(note)
        except Exception as error:  # a listener must not break a call: kept as the process's
            with _lock:
                _process.setdefault("input listener", why(error))
