"""What a call does while a `jax.profiler` session collects: the traced call,
and the spans the miss and slow paths open.

The core asks only whether a session collects (`_jax.traceme_enabled`, one
C++ read per call); what a call then does is registered from above
(`nbjit.observe.spans`, when imported: `set_profiler_hooks`), as the
flavours of the hit path are (`nbjit.core.flavours`). Until then a miss or
slow call opens no span, and a call in a session raises LookupError: the
core alone has no traced call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TRACED", "ProfilerHooks", "profiler_hooks", "set_profiler_hooks"]

# The reason `slow_call` is given for a call staged into an outer trace (not a
# slow call: `PjitFunction._traced`), where its span says so.
TRACED = "traced"

_NO_SPAN = contextlib.nullcontext()


def _no_span(*_args: Any) -> Any:
    return _NO_SPAN


def _untraced(jitted: Any, args: tuple, kwargs: dict) -> Any:
    raise LookupError("no traced call registered (import nbjit: nbjit.observe registers it)")


@dataclass(frozen=True, slots=True)
class ProfilerHooks:
    """What a call runs, and the spans the miss and slow paths open, while a
    profiler session collects.

    `traced_call(jitted, args, kwargs)`: the whole call (`PjitFunction.__call__`
    hands it over); `slow_call(jitted, reason, args, kwargs)`: a slow call's
    run of JAX's path, or, with reason `TRACED`, a call's staged into an outer
    trace (None: JAX's path as outside a session);
    `slow_span(reason)`, `miss_span(description, explaining)` and
    `compile_span()` return context managers (by default, no span).
    """

    traced_call: Callable[[Any, tuple, dict], Any] = _untraced
    slow_call: Callable[[Any, str, tuple, dict], Any] | None = None
    slow_span: Callable[[str], Any] = _no_span
    miss_span: Callable[[Any, Callable[[Any], Any]], Any] = _no_span
    compile_span: Callable[[], Any] = _no_span


_hooks = ProfilerHooks()


def set_profiler_hooks(hooks: ProfilerHooks) -> None:
    """Sets what calls do while a profiler session collects (`nbjit.observe.spans`)."""
    global _hooks
    _hooks = hooks


def profiler_hooks() -> ProfilerHooks:
    """What calls do while a profiler session collects (see `set_profiler_hooks`)."""
    return _hooks
