"""What observability plugs into the core (`nbjit.core.hooks`), registered when
`nbjit.observe` is imported: the miss's description before it compiles and
its explanation after (`explain`), what happens to host inputs (logged
while misses are explained), and what `PjitFunction.stats()` returns
(`stats`). The core imports nothing of this room."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbjit import _jax
from nbjit.core import hooks as _hooks
from nbjit.core.cache import Counters
from nbjit.core.view import JitView, info
from nbjit.observe import explain as _explain
from nbjit.observe import stats as _stats
from nbjit.observe.descriptions import describe_call

__all__ = ["register"]


def describe(jitted: JitView, args: tuple, kwargs: dict, static_positions: Sequence[int],
             static_names: Sequence[str], context: tuple, facts: _hooks.MissFacts
             ) -> tuple[Any, Callable[[Any], Any]]:
    """(this call's description or None, and a function (JAX's cache misses after
    the compile) -> `explain.MissContext`)."""
    try:
        description = describe_call(args, kwargs, static_positions, static_names, context,
                                    info(jitted).signature)
    except Exception:  # describing must never break a call
        description = None
    return description, lambda after: _explain.MissContext(
        _stats.function_label(jitted), facts.cached, facts.evicted, facts.twins,
        facts.capacity, (facts.jax_misses_before, after), _stats.function_location(jitted))


def explain_miss(outcome: _hooks.MissOutcome) -> None:
    """Explained misses: why it missed, grouped for `nbjit.ranked_misses()`,
    and how the new signature's host inputs go (its node's record now)."""
    record = None if outcome.node is None else outcome.node.record
    _explain.miss_done(outcome.description, outcome.explaining(_jax.jax_cache_misses()),
                       outcome.seconds, None if record is None else record.host_path)


def explain_input(note: _hooks.InputNote) -> None:
    """An input strategy given up, or a record's host inputs going another way:
    logged while misses are explained, naming the function."""
    name = None
    if note.counters is not None:
        name = next((_stats.function_label(j) for j in _stats.live_functions()
                     if info(j).counters is note.counters), "a collected function")
    _explain.input_note_done(name, note.strategy, note.why, note.was)


def snapshot(jitted: JitView, counters: Counters, entries: int, live_hits: int
             ) -> _stats.DispatchStats:
    """`PjitFunction.stats()`: its namespace's counts under its report name,
    with how its signatures' host inputs go."""
    return _stats.snapshot(counters, _stats.function_label(jitted), entries, live_hits,
                           host_inputs=info(jitted).namespace.host_paths())


def register() -> None:
    """Plugs observability into the core (idempotent)."""
    _hooks.set_miss_describer(describe)
    _hooks.add_miss_observer(explain_miss)
    _hooks.add_input_listener(explain_input)
    _hooks.set_stats_snapshot(snapshot)
