"""nbjit's calls in `jax.profiler` traces: jaxlib's spans, and nbjit's own.

jaxlib's PjitFunction opens a TraceMe span named ``PjitFunction(<name>)``
around every call, twice and nested: once in `PjitFunction_tp_vectorcall`,
once in `PjitFunction::Call` (`<name>` is `fun_name(fun)`: `__name__`, that
of the function a functools.partial wraps, ``<lambda>`` for a lambda, the
bare method name for a bound method). A trace of jax.jit therefore shows two
such spans per call, hit, miss or slow, and so does one of nbjit's.

Only while a profiler session is collecting: `PjitFunction.__call__` asks
`_jax.traceme_enabled()` (one C++ read) and, when it answers yes, runs the
call through `traced_call`. A TraceMe built on every call would cost the hit
path far more than that read. The answer covers every kind of session:
`jax.profiler.trace`, `start_trace`, and captures requested from outside the
process through `jax.profiler.start_server` (TensorBoard's capture button).

nbjit's own spans, nested in the call's, are named ``nbjit ...``:

  * ``nbjit key`` / ``lookup`` / ``inputs`` / ``execute`` / ``outputs``:
    the phases of a hit (the binders' "traced" flavour; `phase` and
    `next_phase` are what the generated code calls between them);
  * ``nbjit miss: <what changed>``: the sentence an explained miss logs,
    with ``nbjit compile`` (JAX's trace, lower and compile) inside;
  * ``nbjit slow: <reason>``: a call on JAX's own path, with the reason
    `stats()` counts;
  * ``nbjit agreement``: the multi-controller signature exchange of a miss;
  * ``PjitFunction(nbjit launch: <name>)``: jaxlib's spans of a launch
    record's launcher (an accelerator's hit whose host leaves jaxlib puts,
    `nbjit.core.inputs.launch`), inside the call's own pair.

While a `nbjit.profile()` times the calls, the hit keeps its timed flavour
(the profile's tables need every hit) and shows no phase spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit.core import flavours as _flavours
from nbjit.core import profiler as _profiler
from nbjit.core.profiler import ProfilerHooks, set_profiler_hooks
from nbjit.core.view import info
from nbjit.observe import explain as _explain

__all__ = ["HOOKS", "TRACED", "call_name", "enabled", "traced_call"]

TraceMe = _jax.TraceMe
enabled = _jax.traceme_enabled  # any profiler session collecting host spans

KEY, LOOKUP, INPUTS, EXECUTE, OUTPUTS = (
    "nbjit key", "nbjit lookup", "nbjit inputs", "nbjit execute", "nbjit outputs")
COMPILE = "nbjit compile"
AGREEMENT = "nbjit agreement"

_NO_SPAN = contextlib.nullcontext()


def call_name(fun: Callable) -> str:
    """The span jaxlib opens around a call of ``jax.jit(fun)``."""
    return f"PjitFunction({_jax.fun_name(fun)})"


def traced_call(jitted: Any, args: tuple, kwargs: dict) -> Any:
    """`PjitFunction.__call__` while a profiler session collects: the call in
    jaxlib's two spans, its hit phases in nbjit's (`BinderTable.traced`)."""
    facts = info(jitted)
    name = call_name(facts.fun)
    with TraceMe(name), TraceMe(name):
        _jax.collect_garbage()
        binder = facts.binders.traced((len(args), *kwargs) if kwargs else len(args))
        try:
            return binder(jitted, args, kwargs)
        except Exception as error:  # as `PjitFunction.__call__`: jaxlib shows no frames
            _jax.filter_dispatch_frames(error)
            raise


# -- the hit's phases: called by the binders' traced flavour ---------------


def phase(name: str) -> Any:
    """Opens the span of a hit's phase (closed by `next_phase` or `leave_phase`)."""
    span = TraceMe(name)
    span.__enter__()
    return span


def next_phase(span: Any, name: str) -> Any:
    span.__exit__(None, None, None)
    return phase(name)


def leave_phase(span: Any, fn: Callable, /, *args: Any) -> Any:
    """Closes the phase a call leaves the hit path in, then runs the path it takes."""
    span.__exit__(None, None, None)
    return fn(*args)


# -- misses and slow calls ----------------------------------------------------


def span(name: str) -> Any:
    """``with span(name):`` a span while a session collects; nothing otherwise."""
    return TraceMe(name) if enabled() else _NO_SPAN


def miss_span(description: Any, explaining: Callable[[Any], Any]) -> Any:
    """The span of a miss, named for what changed (as an explained miss says
    it); nothing outside a session. `explaining` is the dispatcher's (JAX's
    cache misses after the compile) -> `MissContext`; the sentence does not
    read them, so the span can open before the compile."""
    if not enabled():
        return _NO_SPAN
    try:
        why = _explain.what_changed(description, explaining(None))
    except Exception as error:  # explaining must never break a call
        why = f"not explained: {error!r}"
    return TraceMe(f"nbjit miss: {why}")


def slow_span(reason: str) -> Any:
    return TraceMe(f"nbjit slow: {reason}") if enabled() else _NO_SPAN


# The traced flavour of the hit path (`nbjit.core.flavours`): a span per
# phase, the phase a call leaves in closed before the path it takes.
TRACED = _flavours.add_flavour(_flavours.Flavour(
    "traced",
    start=f"span = phase({KEY!r})",
    stamps=(f"span = next_phase(span, {LOOKUP!r})", f"span = next_phase(span, {INPUTS!r})",
            f"span = next_phase(span, {EXECUTE!r})", f"span = next_phase(span, {OUTPUTS!r})"),
    finish="span.__exit__(None, None, None)",
    leave="leave_phase(span, {fn}, {args})",
    scope={"phase": phase, "next_phase": next_phase, "leave_phase": leave_phase}))


def slow(jitted: Any, reason: str, args: tuple, kwargs: dict) -> Any:
    """`PjitFunction._slow` in a session: JAX's own path in a span naming the reason
    (``nbjit traced`` for a call staged into an outer trace: not a slow call).

    A call with a tracer among its leaves goes straight to JAX's Python cache
    miss, which is where jaxlib's PjitFunction sends it at once (its signature
    cannot hold a tracer): the call then shows nbjit's two spans, as it
    shows jaxlib's two under jax.jit, not both pairs nested. Every other slow
    call goes through jaxlib's PjitFunction, whose own pair nests in nbjit's.
    """
    with TraceMe("nbjit traced" if reason == _profiler.TRACED else f"nbjit slow: {reason}"):
        if any(isinstance(x, _jax.Tracer) for x in _jax.flatten_for_dispatch((args, kwargs))[0]):
            return _jax.cache_miss_of(info(jitted).jax_jitted)(*args, **kwargs)[0]
        return info(jitted).jax_jitted(*args, **kwargs)


def compile_span() -> Any:
    return span(COMPILE)


# What a call does while a session collects, outside its hit path's phases
# (`nbjit.core.profiler`): the call itself, and the miss's and slow paths' spans.
HOOKS = ProfilerHooks(traced_call=traced_call, slow_call=slow, slow_span=slow_span,
                      miss_span=miss_span, compile_span=compile_span)
set_profiler_hooks(HOOKS)
