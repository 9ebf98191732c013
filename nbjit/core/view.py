"""What the rooms around the dispatcher read of a jitted function: `JitInfo` and `JitView`.

Observability (stats, explain, profile), multi-controller agreement, the
host-input policy and the lab read a few of a `PjitFunction`'s fields. They
read them through this typed interface, never through `Any`: `JitView` is a
`Protocol` that `nbjit.core.dispatch.PjitFunction` satisfies (the type
checker holds it to that, see `nbjit.core.dispatch._as_view`). The
fields keep their leading underscore because upstream's `PjitFunction` has
no such public attributes (tests/test_object_surface.py); the members are
read-only here, so no reader can assign them. Rooms that need only what a
jitted function is read its `JitInfo` (`info(jitted)`), public fields fixed
when it was made, rather than these private ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from nbjit.core.cache import Counters, Namespace, Node

__all__ = ["JitInfo", "JitView", "info", "register_info"]


@dataclasses.dataclass(frozen=True, slots=True)
class JitInfo:
    """What a jitted function is, fixed when it is made: the rooms above the core
    read these public fields (`info(jitted)`) instead of the function's private
    attributes. It holds no reference back to the jitted function."""

    fun: Callable[..., Any]  # the Python function it jits
    options: Mapping[str, Any]  # the jit options the caller passed (as `jax.jit` takes them)
    donates: bool  # whether any argument is donated
    global_key: Any  # JAX's global cache key of its options (what twins share)
    namespace: Namespace  # its entries and counters in the cache, shared with its twins
    counters: Counters  # its namespace's counters (`nbjit.stats()`)
    jax_jitted: Any  # JAX's own jitted function (its path: slow calls, misses)
    name: str  # its `__name__`
    binders: Any  # its call shape -> binder table (`nbjit.core.binders.BinderTable`)


def register_info(jitted: Any, facts: JitInfo) -> None:
    """Called once by `PjitFunction.__init__`. The facts live on the function
    itself, not in a module-level table: they hold the Python function, which
    may be a bound method of an object that holds the jitted function (``self.step
    = nbjit.jit(self._step)``); a table keyed weakly by the jitted function would
    keep that object, and its executables, alive for good."""
    jitted._nbjit_info = facts


def info(jitted: Any) -> JitInfo:
    """The `JitInfo` of a `PjitFunction` (KeyError for anything else)."""
    try:
        return jitted._nbjit_info
    except AttributeError:
        raise KeyError(jitted) from None


class JitView(Protocol):
    """The read-only face of a jitted function that other rooms may use."""

    @property
    def _fun(self) -> Callable[..., Any]:
        """The Python function it jits."""

    @property
    def _options(self) -> Mapping[str, Any]:
        """The jit options the caller passed (as `jax.jit` takes them)."""

    @property
    def _donates(self) -> bool:
        """Whether any argument is donated."""

    @property
    def _global_key(self) -> Any:
        """JAX's global cache key of its options (what twins share)."""

    @property
    def _namespace(self) -> Namespace:
        """Its entries and counters in the cache, shared with its twins."""

    @property
    def _counters(self) -> Counters:
        """Its namespace's counters (`nbjit.stats()`)."""

    @property
    def miss_count(self) -> int:
        """Compiles through this jit object."""

    @property
    def _binders(self) -> Any:
        """Its binder table (`nbjit.core.binders.BinderTable`)."""

    def stats(self) -> Any:
        """Its `nbjit.DispatchStats`."""
        ...

    def _entry_for(self, args: tuple, kwargs: dict) -> tuple[Node | None, Sequence[Any]]:
        """The node a call would hit, and its dynamic leaves (no side effects)."""
        ...
