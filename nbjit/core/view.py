"""What the rooms around the dispatcher read of a jitted function: `JitInfo` and `JitView`.

Observability (stats, explain, profile, spans), multi-controller agreement,
the host-input policy and the lab read what a jitted function is from its
`JitInfo` (`info(jitted)`): public fields fixed when it was made, kept off
the function's own attributes, which upstream's `PjitFunction` does not have
(tests/test_object_surface.py). What changes as it runs and other rooms
read (its compile count and its stats) is `JitView`, a `Protocol` that
`nbjit.core.dispatch.PjitFunction` satisfies (the type checker holds it to
that, see `nbjit.core.dispatch._as_view`); its members are read-only here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from nbjit.core.cache import Counters, Namespace

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
    signature: inspect.Signature | None  # `fun`'s, as JAX resolved it (None: it has none)


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
    """What other rooms read of a jitted function itself, beside its `JitInfo`:
    what changes as it runs."""

    @property
    def miss_count(self) -> int:
        """Compiles through this jit object (`nbjit.observe.profile` tells a miss
        from a slow call by it)."""

    def stats(self) -> Any:
        """Its `nbjit.DispatchStats` (`nbjit.stats()`)."""
        ...
