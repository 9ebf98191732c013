"""The core's optional listeners: what the rooms above it (observe,
multiprocess) plug in, so that the core imports none of them.

As JAX's `monitoring.py` keeps listener lists at the bottom for higher
layers to fill, nothing here is needed to run a call: with none of it
filled, a miss compiles unchecked, undescribed and untold, and only
`PjitFunction.stats()` has nothing to answer. The rooms fill it when they
are imported (``import nbjit`` imports every room; see each room's
``__init__``):

  * `add_compile_check`: called before JAX's miss runs, in order; may raise,
    or hand back a `Checked`: how JAX's miss must then run (multi-controller
    agreement, `nbjit.multiprocess`, compiles a process-spanning program
    ahead, and has it run as it compiled it).
  * `add_miss_observer`: told one `MissOutcome` after each compile whose
    outputs return to the caller, in order; must not raise (explained
    misses, `nbjit.observe`).
  * `set_miss_describer`: what describes a miss before it compiles
    (`nbjit.observe`; by default, nothing).
  * `set_stats_snapshot`: what `PjitFunction.stats()` returns (`nbjit.observe`).
  * `add_input_listener`: told one `InputNote` when an input strategy is
    given up, and when a record moves its host inputs another way
    (`nbjit.core.inputs.fallbacks`); must not raise (`nbjit.observe` logs them).

And per jitted function, for a library that composes nbjit's jit (as
`nbjit.filter` does): a `JitExtension` given to `PjitFunction`, and
`Deferred` arguments for `PjitFunction.call_keyed`.

Putting inputs on devices is not here: it is the core's own
(`nbjit.core.inputs`), and where a platform does it otherwise, one table
says so (`nbjit.core.inputs.platforms`). None of these is on the hit path:
they run on a miss, a slow call, or the rare call that changes how a
signature's host inputs go.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Checked", "Deferred", "InputNote", "JitExtension", "MissFacts", "MissOutcome",
           "add_compile_check", "add_input_listener", "add_miss_observer", "compile_checks",
           "describe_miss", "input_listeners", "miss_observers", "set_miss_describer",
           "set_stats_snapshot", "stats_snapshot"]


# ---------------------------------------------------------------------------
# The miss: checks before the compile, observers after it


@dataclass(frozen=True, slots=True)
class MissOutcome:
    """What one compile gave, told once to the input strategy of its platform
    (`nbjit.core.inputs.platforms`) and to every miss observer.

    `jitted` is the `PjitFunction` (a `nbjit.core.view.JitView`); `node` the
    installed node (None when JAX asked to rebuild: nothing was cached);
    `record` its fast-path data (None: the signature takes JAX's path, for
    `node.reason`); `fastpath` JAX's own fast-path data; `explaining` maps
    JAX's cache-miss counts after the compile to what the miss describer
    made of this miss (`describe_miss`).
    """

    jitted: Any
    node: Any
    record: Any
    fastpath: Any
    leaves: list
    args: tuple
    kwargs: dict
    description: Any
    explaining: Callable[[Any], Any]
    seconds: float


@dataclass(frozen=True, slots=True)
class MissFacts:
    """What the core knows of a miss before it compiles, for its describer:
    the descriptions of the namespace's entries (`cached`) and of its
    recently evicted ones, the same function's other options with entries
    (``(their global key, own global key)``), the cache's capacity, and
    JAX's cache-miss counts before the compile."""

    cached: Sequence[Any]
    evicted: Sequence[Any]
    twins: Sequence[tuple[Any, Any]]
    capacity: int
    jax_misses_before: Any


@dataclass(frozen=True, slots=True)
class Checked:
    """What a compile check hands back when JAX's miss must run its way:
    `run(miss)` returns `miss()` (JAX's trace, compile and run of the call),
    after `seconds` the check spent compiling the call's program ahead (counted
    as the miss's compile time)."""

    run: Callable[[Callable[[], Any]], Any]
    seconds: float


MissObserver = Callable[[MissOutcome], None]
CompileCheck = Callable[[Any, tuple, dict, list, Any], Checked | None]
# (jitted, args, kwargs, static positions, static names, trace context, facts)
#   -> (description or None, explaining)
MissDescriber = Callable[[Any, tuple, dict, Sequence[int], Sequence[str], tuple, MissFacts],
                         tuple[Any, Callable[[Any], Any]]]

miss_observers: list[MissObserver] = []
"""Called in order after every compile whose outputs return to the caller."""

compile_checks: list[CompileCheck] = []
"""Called in order before JAX's miss runs: (jitted, args, kwargs, leaves, description),
the arguments as JAX's miss gets them (private copies of host arrays)."""


def add_miss_observer(observer: MissObserver) -> MissObserver:
    """Registers `observer` (once); it must not raise: a raise would reach the
    caller after the node is installed."""
    if observer not in miss_observers:
        miss_observers.append(observer)
    return observer


def add_compile_check(check: CompileCheck) -> CompileCheck:
    """Registers `check` (once); its exception stops the miss before JAX's miss
    runs, with nothing cached (the last `Checked` handed back is the one used)."""
    if check not in compile_checks:
        compile_checks.append(check)
    return check


def _no_description(jitted: Any, args: tuple, kwargs: dict, static_positions: Sequence[int],
                    static_names: Sequence[str], context: tuple, facts: MissFacts
                    ) -> tuple[Any, Callable[[Any], Any]]:
    return None, lambda after: None


_describer: MissDescriber = _no_description


def set_miss_describer(describer: MissDescriber) -> None:
    """Sets what describes a miss before it compiles (`nbjit.observe.explain`)."""
    global _describer
    _describer = describer


def describe_miss(jitted: Any, args: tuple, kwargs: dict, static_positions: Sequence[int],
                  static_names: Sequence[str], context: tuple, facts: MissFacts
                  ) -> tuple[Any, Callable[[Any], Any]]:
    """(the call's description or None, explaining: see `MissOutcome`)."""
    return _describer(jitted, args, kwargs, static_positions, static_names, context, facts)


# ---------------------------------------------------------------------------
# Host inputs: strategies given up, and records that move them another way


@dataclass(frozen=True, slots=True)
class InputNote:
    """One thing that happened to a function's host inputs
    (`nbjit.core.inputs.fallbacks`). `counters`: the function's namespace
    counters (None: the process's). With `why`, `strategy` was given up for
    that reason (the exception's type and message); without, a signature's
    host inputs now go by `strategy` (a `FastPath.host_path`), where they
    went by `was`."""

    counters: Any
    strategy: str
    why: str | None
    was: str | None = None


InputListener = Callable[[InputNote], None]
input_listeners: list[InputListener] = []
"""Told each `InputNote`, in order of registration."""


def add_input_listener(listener: InputListener) -> InputListener:
    """Registers `listener` (once); it must not raise."""
    if listener not in input_listeners:
        input_listeners.append(listener)
    return listener


# ---------------------------------------------------------------------------
# Stats

# (jitted, its namespace's counters, entries, hits of live nodes) -> nbjit.DispatchStats
StatsSnapshot = Callable[[Any, Any, int, int], Any]
_stats_snapshot: StatsSnapshot | None = None


def set_stats_snapshot(snapshot: StatsSnapshot) -> None:
    """Sets what `PjitFunction.stats()` returns for a jitted function (`nbjit.observe`)."""
    global _stats_snapshot
    _stats_snapshot = snapshot


def stats_snapshot(jitted: Any, counters: Any, entries: int, live_hits: int) -> Any:
    """The jitted function's stats (`nbjit.DispatchStats`)."""
    if _stats_snapshot is None:
        raise LookupError("no stats registered (import nbjit)")
    return _stats_snapshot(jitted, counters, entries, live_hits)


# ---------------------------------------------------------------------------
# Composing a jitted function (nbjit.filter): its extension, deferred arguments


class JitExtension:
    """What a library composing nbjit's jit changes of one `PjitFunction`, off
    the hit path: given as ``PjitFunction(fun, options, extension=...)``.
    Subclass it and override what you need; the defaults change nothing."""

    def jax_path(self) -> contextlib.AbstractContextManager[Any]:
        """Entered around JAX's own path: a miss's compile, and a slow call."""
        return contextlib.nullcontext()

    def describe(self, args: tuple, kwargs: dict, context: tuple, description: Any) -> Any:
        """A miss's description (what explained misses compare), given nbjit's
        own (`description`, None if it could not describe the call). Must not raise."""
        return description


NO_EXTENSION = JitExtension()


class Deferred:
    """A call's positional arguments, made only if the call leaves the hit path.

    `PjitFunction.call_keyed` takes one: a hit needs only the leaves and the
    key; a miss, a slow call or a failed execution calls `make()` for the
    arguments JAX's own path needs."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], tuple]) -> None:
        self.make = make


def real_args(args: Any) -> tuple:
    """`args` itself, or the arguments a `Deferred` makes."""
    return args.make() if type(args) is Deferred else args
