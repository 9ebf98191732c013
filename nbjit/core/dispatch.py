"""The dispatcher: `jit` and `PjitFunction`, its miss path and its slow paths.

`jit(fun)` returns a `PjitFunction`. Tracing, lowering and compiling stay
JAX's own (`jax.jit(fun)._cache_miss`); what nbjit replaces is the per-call
fast path that jaxlib writes in C++: key the call, find the executable, put
the inputs on the right devices, run, wrap the outputs.

A call goes: `__call__` -> the binder of its call shape (`nbjit.core.binders`:
one generated function per positional count and keyword names, which keys
the call and runs the hit path: lookup -> inputs -> execute -> outputs). A
leaf no key can hold goes to `_unkeyable` (JAX's own path). A miss, or a
signature that cannot take the fast path, goes to `_miss_or_slow`. While
a profiler session collects, or while the hit path's flavour stamps a
call's ends (`nbjit.profile()`'s), `__call__` stamps the call's ends around
its detour (`_traced_call`, `_stamped_call`: the same call, the binder
handed the stamps).

A miss reads as one story: `_miss` claims the signature (one compile per
signature across threads, `Namespace.claim`); `_compile` checks that every
process agrees on it and on its program (multi-controller only; before
anything runs, and it may raise), lets JAX trace, lower, compile and run
(through the check's runner, if it gave one), installs the node, counts
the miss, and tells one `MissOutcome` to the input strategy of its
platform (`nbjit.core.inputs.platforms`: on the CPU the host-input policy
may arm the node), then to each registered miss observer (explain says why
it missed). The checks and observers are registered by the rooms above the
core (`nbjit.core.hooks`): the core imports none of them.

Invariants:
  * Only the miss path links nodes into the cache (`nbjit.core.cache`); a
    node's record (a `nbjit.core.record.FastPath`, whose fields never change)
    is set by that insert and afterwards replaced whole only through the
    cache's compare-and-swap (`Namespace.replace_record`), never edited.
  * A hit never enters JAX's Python: execute_sharded + consume_with_handlers.
  * JAX's own path answers everything else, so JAX raises what it raises.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nbjit import _jax
from nbjit._common import warn_past
from nbjit.core import hooks as _hooks
from nbjit.core.binders import BinderTable, call_shape
from nbjit.core.cache import Namespace, Node, PjitFunctionCache, cache_from_config
from nbjit.core.hooks import MissFacts, MissOutcome
from nbjit.core.inputs.fallbacks import gave_up
from nbjit.core.inputs.platforms import after_miss, before_miss
from nbjit.core.inputs.values import canonical_dtypes, host_dtype, private_host_copies
from nbjit.core.keys import leaf_signature
from nbjit.core.live import register_live
from nbjit.core.profiler import TRACED, profiler_hooks
from nbjit.core.record import FastPath, Unsupported, build_record
from nbjit.core.view import JitInfo, JitView, register_info

__all__ = ["PjitFunction", "PjitFunctionCache", "jit"]

ArrayImpl = _jax.ArrayImpl
_collect_garbage = _jax.collect_garbage
_trace_context = _jax.trace_context
_tracing = _jax.traceme_enabled  # a profiler session is collecting spans (nbjit/observe/spans.py)
_clock = time.perf_counter_ns  # `__call__`'s stamps while a profile times calls
_NOT_SET = object()  # marks jit options the caller did not pass


_default_cache = PjitFunctionCache(8192)  # jit(f) with no explicit options
_explicit_cache = PjitFunctionCache(8192)  # jit(f, donate_argnums=..., ...)


class PjitFunction:
    """A `jax.jit`-compatible callable with nbjit's own cache-hit dispatch."""

    __name__: str  # these two from `functools.update_wrapper`, as upstream's
    __wrapped__: Callable

    def __init__(self, fun: Callable, options: dict[str, Any],
                 cache: PjitFunctionCache | None = None, *,
                 extension: _hooks.JitExtension | None = None) -> None:
        """`extension`: what a library composing this jit changes off the hit
        path (`nbjit.core.hooks.JitExtension`; `nbjit.filter` gives one)."""
        jitted = _jit_as_caller(fun, options)  # JAX validates the options, as upstream
        functools.update_wrapper(self, fun)
        info = _jax.jit_info(jitted)
        global_key = _jax.jit_global_cache_key(info)
        if cache is None:
            cache = cache_from_config()
        if cache is None:
            cache = _explicit_cache if global_key.contains_explicit_attributes else _default_cache
        self._fun = fun
        self._options = options
        self._extension = _hooks.NO_EXTENSION if extension is None else extension
        self._jax_jitted: Any = jitted  # (jax's stubs lack its clear_cache)
        self._jax_cache_miss = _jax.cache_miss_of(jitted)
        self._cache = cache
        self._namespace: Namespace = cache.namespace_for(fun, global_key)
        self._global_key = global_key
        self._counters = self._namespace.counters
        self._static_argnums = tuple(info.static_argnums)
        self._static_argnames = frozenset(info.static_argnames)
        self._binders = BinderTable(self._namespace, self._static_argnums,
                                    self._static_argnames)
        self._fun_signature = info.fun_signature
        self._donates = bool(info.donate_argnums or info.donate_argnames)
        self.miss_count = 0  # compiles through this jit object (its twins count their own)
        self.slow_count = 0  # calls of this jit object that took JAX's own path
        self.traced_count = 0  # calls of this jit object staged into an outer trace
        register_info(self, JitInfo(fun, options, self._donates, global_key, self._namespace,
                                    self._counters, jitted,
                                    str(getattr(self, "__name__", "function")), self._binders,
                                    self._fun_signature))
        register_live(self)  # for nbjit.stats()

    # -- the hit path: the binder of the call shape keys the call and runs it

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        binders = self._binders
        if binders.stamps_entry or _tracing():  # a profile times calls, or a profiler session
            stamps = [_clock()]  # the call's first stamp, and its last once the detour returns
            out = (_stamped_call if binders.stamps_entry else _traced_call)(
                self, args, kwargs, stamps)
            stamps[-1] = _clock()  # a hit a profile recorded holds `stamps`
            return out
        _collect_garbage()  # frees buffers dropped off the GIL, as jaxlib does per call
        # A keyword call is looked up by its positional count (its binder checks
        # the names); a shape with no binder yet gets one (`BinderTable.__missing__`).
        binder = binders[~len(args) if kwargs else len(args)]
        try:  # costs nothing unless something raises (Python >= 3.11)
            return binder(self, args, kwargs)
        except Exception as error:  # a miss, slow path or bad input: jaxlib shows no frames
            _jax.filter_dispatch_frames(error)
            raise

    def _unkeyable(self, args: tuple, kwargs: dict, leaves: Sequence) -> Any:
        """A call with a leaf no key can hold (a tracer, a jax.Ref, an object): JAX's own path."""
        reason = _unkeyable_reason(leaves, canonical_dtypes[_jax.enable_x64.value])
        if reason == TRACED:
            return self._traced(args, kwargs)
        return self._slow(args, kwargs, reason)

    # -- slow paths -------------------------------------------------------------

    def _slow(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """JAX's own path, uncached here; JAX raises what it raises."""
        self._count_slow(reason)
        return self._jax_path(args, kwargs, reason)

    def _traced(self, args: tuple, kwargs: dict) -> Any:
        """A call staged into an outer trace (under jit, grad, vmap, scan), as
        jax.jit's calls are there: JAX's own path, never cached. Counted as
        traced, apart from slow calls: it is what every jit does inside a
        transformation, not a call nbjit could have served."""
        self.traced_count += 1
        self._counters.traced += 1
        return self._jax_path(args, kwargs, TRACED)

    def _jax_path(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """JAX's own jitted function runs the call (its `reason` names the span
        a profiler session shows)."""
        args, kwargs = self._private(_hooks.real_args(args), kwargs)
        with self._extension.jax_path():
            traced = profiler_hooks().slow_call if _tracing() else None
            if traced is not None:  # a span naming the reason
                return traced(self, reason, args, kwargs)
            return self._jax_jitted(*args, **kwargs)

    def _private(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """JAX's path gets private copies of numpy arrays (it may use them in place)."""
        split = self._binders.split((len(args), *kwargs) if kwargs else len(args))
        return private_host_copies(args, kwargs, split.static_positions, split.static_names)

    def _count_slow(self, reason: str) -> None:
        self.slow_count += 1
        self._counters.count_slow(reason)

    def _execute_failed(self, error: Exception, args: tuple, kwargs: dict,
                        inputs: Sequence) -> Any:
        """The executable refused a hit's inputs, or its execution failed.

        Refused inputs (a deleted array; something not a jax.Array) go to
        JAX's own path, which raises what it raises. A failure of the
        execution itself (say, one buffer donated twice in a call; before
        jaxlib 0.11.2, an array donated to an earlier call) raises ValueError
        with the runtime's message, as jaxlib's fast path does.
        """
        args = _hooks.real_args(args)
        if isinstance(error, _jax.JaxRuntimeError) and (
                _jax.donated_input_rejected(error, inputs)
                or all(type(x) is ArrayImpl and not x.is_deleted() for x in inputs)):
            raise ValueError(str(error)) from error
        deleted = any(type(x) is ArrayImpl and x.is_deleted() for x in inputs)
        return self._slow(args, kwargs, "deleted_or_donated" if deleted else "execute_refused")

    def _launch_refused(self, refused: Any, args: tuple, kwargs: dict) -> Any:
        """A launch record's launcher refused the call (`LaunchRefused`,
        `nbjit.core.inputs.launch`): refused inputs (a transfer guard that
        forbids a host leaf's put, say) go to JAX's own path as a hit's
        refused inputs do, a refused execution where that goes."""
        if refused.inputs is None:
            return self._slow(args, kwargs, "input_refused")
        return self._execute_failed(refused.error, args, kwargs, refused.inputs)

    def _miss_or_slow(self, args: tuple, kwargs: dict, leaves: list, signature: tuple,
                      node: Node | None) -> Any:
        args = _hooks.real_args(args)  # a `Deferred` from `call_keyed`: made now
        if node is not None:  # a slow node, a failed compile, or NaN/Inf checks are on
            if node.record is not None:
                return self._slow(args, kwargs,
                                  "debug_nans" if _jax.debug_nans.value else "debug_infs")
            if node.reason != "compile_failed":
                self._count_slow(node.reason or "no_fastpath")
                args, kwargs = self._private(args, kwargs)
                with profiler_hooks().slow_span(node.reason or "no_fastpath"):
                    return self._jax_cache_miss(*args, **kwargs)[0]
        if _jax.disable_jit.value:
            self._count_slow("disable_jit")
            with profiler_hooks().slow_span("disable_jit"):
                return self._fun(*args, **kwargs)
        if not _jax.is_top_level_trace():
            return self._traced(args, kwargs)  # staged into an outer trace: never cached
        return self._miss(args, kwargs, leaves, signature)

    def _miss(self, args: tuple, kwargs: dict, leaves: list, signature: tuple) -> Any:
        """Compiles once per signature across threads; only writer of the cache.

        `signature` is ``(key, shardings, trace context)``. A node left by a
        failed compile stands for its signature in the cache (its size is
        upstream's) but is compiled again by the next call, which replaces it.
        """
        namespace = self._namespace
        node, failed, waiting, owned = namespace.claim(*signature)
        if owned is not None:
            try:
                return self._compile(args, kwargs, leaves, signature, failed)
            finally:
                namespace.release(owned)
        if waiting is not None:
            if waiting.thread == threading.get_ident():
                raise RecursionError(
                    f"Recursively calling jit: {self.__name__} re-entered itself "
                    "while compiling the same signature")
            waiting.done.wait()
            node = namespace.find(*signature)
        # Another thread compiled it (or failed: JAX's path, as jaxlib's waiters).
        if node is None or node.record is None:
            return self._slow(args, kwargs, "compile_failed")
        now = time.perf_counter_ns()  # the timed flavour records the hit from here
        key, shardings, _ = signature
        return self._binders.hit(self, args, kwargs, leaves, key, shardings, [now], now)

    def _compile(self, args: tuple, kwargs: dict, leaves: list, signature: tuple,
                 failed: Node | None) -> Any:
        """JAX's trace/lower/compile for one signature; installs the node it gives
        (in place of `failed`, the node an earlier failed compile left) and tells
        the miss observers (`nbjit.core.hooks`) what happened."""
        if any(type(x) is ArrayImpl and x.is_deleted() for x in leaves):
            return self._slow(args, kwargs, "deleted_or_donated")  # JAX rejects it
        description, explaining = self._describe_miss(args, kwargs, signature[2])
        with self._extension.jax_path(), profiler_hooks().miss_span(description, explaining):
            return self._compile_described(args, kwargs, leaves, signature, failed,
                                           description, explaining)

    def _compile_described(self, args: tuple, kwargs: dict, leaves: list, signature: tuple,
                           failed: Node | None, description: Any, explaining: Any) -> Any:
        """`_compile` once the call is described (inside the miss's span, in a trace)."""
        private_args, private_kwargs = self._private(args, kwargs)
        # Before anything runs: every process must agree on the call and its
        # program (multi-controller only; AgreementError when they differ). The
        # check compiles a process-spanning program ahead, and JAX's miss then
        # runs through it (`Checked.run`).
        checked = None
        for check in _hooks.compile_checks:  # registered by nbjit.multiprocess
            checked = check(self, private_args, private_kwargs, leaves, description) or checked
        ahead = 0.0 if checked is None else checked.seconds
        before_miss()
        start = time.perf_counter()
        try:
            with profiler_hooks().compile_span():
                if checked is None:
                    outs, fastpath, rebuild = self._jax_cache_miss(*private_args,
                                                                   **private_kwargs)
                else:
                    outs, fastpath, rebuild = checked.run(
                        functools.partial(self._jax_cache_miss, *private_args, **private_kwargs))
        except BaseException as error:
            self._compile_failed(signature, description, failed,
                                 time.perf_counter() - start + ahead, error)
            raise
        seconds = time.perf_counter() - start + ahead
        record, reason = _record_for(fastpath, leaves, self._donates,
                                     str(getattr(self, "__name__", "function")), self._counters)
        if fastpath is None:  # effects, or something else JAX keeps on its own path
            reason = _no_fastpath_reason(self._jax_jitted, args, kwargs)
        node = None
        if not rebuild:
            key, shardings, context = signature
            node = Node(key, shardings, context, self._namespace, record, reason)
            node.description = description
        self._namespace.install(node, replacing=failed)
        outcome = MissOutcome(self, node, record, fastpath, leaves, args, kwargs, description,
                              explaining, seconds)
        self._count_miss(seconds)
        after_miss(outcome)  # the input strategy of its platform may arm an optimisation
        for observe in _hooks.miss_observers:  # registered by the rooms above (never raise)
            observe(outcome)
        return outs  # JAX's own outputs: required when arguments were donated

    def _count_miss(self, seconds: float) -> None:
        """Stats: one compile, and its time (`nbjit.stats()`)."""
        counters = self._counters
        counters.miss_seconds += seconds
        counters.misses += 1
        self.miss_count += 1

    def _compile_failed(self, signature: tuple, description: Any, failed: Node | None,
                        seconds: float, error: BaseException) -> None:
        """The signature keeps a node, as jaxlib's cache does, but not for good
        (jaxlib's `fall_back_to_python`): its next call compiles again and gets
        the fast path if that succeeds. An error (an `Exception`: the function's,
        as a TracerBoolConversionError, or its arguments') counts as raised, the
        call's own outcome, as under jax.jit; an interrupt (KeyboardInterrupt)
        counts as a slow call whose compile failed."""
        self._counters.miss_seconds += seconds
        if isinstance(error, Exception):
            self._counters.raised += 1
        else:
            self._count_slow("compile_failed")
        if failed is None:
            key, shardings, context = signature
            node = Node(key, shardings, context, self._namespace, None, "compile_failed")
            node.description = description
            self._namespace.install(node)

    # -- observability (nbjit/observe: stats, explain, profile) -----------------

    def stats(self) -> Any:
        """Calls, hits, misses, slow calls (with reasons), evictions of this function
        and its twins (same function, same options): a `nbjit.DispatchStats`."""
        entries, live_hits = self._namespace.usage()
        return _hooks.stats_snapshot(self, self._counters, entries, live_hits)

    def reset_stats(self) -> None:
        """Zeroes the counters of this function and its twins (entries stay)."""
        self._namespace.reset_counts()

    def _describe_miss(self, args: tuple, kwargs: dict, context: tuple) -> tuple[Any, Any]:
        """(this call's description or None, and a function (JAX's cache misses
        after the compile) -> what explains the miss), from the registered
        describer (`nbjit.observe.explain`: every miss is explained, logged
        only while explaining is on)."""
        split = self._binders.split(call_shape(args, kwargs))
        namespace = self._namespace
        cached = namespace.descriptions()
        evicted = list(self._counters.evicted)
        twins = [] if cached or evicted else self._other_options_with_entries()
        facts = MissFacts(cached, evicted, twins, namespace.cache.capacity(),
                          _jax.jax_cache_misses())
        description, explaining = _hooks.describe_miss(
            self, args, kwargs, split.static_positions, split.static_names, context, facts)
        return self._extension.describe(args, kwargs, context, description), explaining

    def _other_options_with_entries(self) -> list[tuple[Any, Any]]:
        """(global key, own global key) of the same function's other namespaces with entries."""
        found = []
        for cache in {_default_cache, _explicit_cache, self._cache}:
            for global_key, namespace in cache.namespaces_of(self._fun):
                if namespace is not self._namespace and namespace.entries:
                    found.append((global_key, self._global_key))
        return found

    # -- Python surface -------------------------------------------------------

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __repr__(self) -> str:
        try:  # jaxlib's format; a failing repr (or no __wrapped__) gives its fallback
            return f"<PjitFunction of {self.__wrapped__!r}>"
        except Exception:
            return "<PjitFunction>"

    def __reduce__(self) -> str | tuple:
        """By reference where this object is what its module holds at its
        qualified name (``@nbjit.jit`` on a module-level function or a method:
        the function's own name is taken by this object, so the function cannot
        be pickled by it); else as (function, options), ``nbjit.jit(f)`` kept
        under another name. Either pickles where the function does."""
        name = _name_holding(self)
        return name if name is not None else (rebuild, (self._fun, self._options))

    def __getstate__(self) -> dict[str, Any]:
        """Like jaxlib's: "function_name" is `fun`'s name (through functools.partial).

        Pickling uses `__reduce__`; this is for code that inspects the state.
        """
        return {"function_name": _jax.fun_name(self._fun), "fun": self._fun,
                "options": dict(self._options)}

    @property
    def __signature__(self) -> inspect.Signature:
        if self._fun_signature is None:
            raise ValueError(f"no signature found for {self._fun!r}")
        return self._fun_signature

    @_jax.api_boundary  # as upstream's: its traceback shows no nbjit or JAX frames
    def lower(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.lower(*args, **kwargs)

    @_jax.api_boundary
    def trace(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.trace(*args, **kwargs)

    @_jax.api_boundary
    def eval_shape(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.eval_shape(*args, **kwargs)

    # -- composing this jit (nbjit.filter): keyed calls ------------------------

    def key_of(self, args: tuple, kwargs: dict | None = None) -> tuple | None:
        """``(leaves, key, shardings)``: what this function's binder makes of a call
        (no side effects; nothing runs), or None when it cannot key the call.
        A library that reads its own calls faster than the binder can remember
        the key for a structure and run later calls with `call_keyed`."""
        kwargs = {} if kwargs is None else kwargs
        got = self._binders.key_only(call_shape(args, kwargs))(self, args, kwargs)
        return None if type(got) is str else got

    def call_keyed(self, leaves: list, key: Any, shardings: list,
                   args: Callable[[], tuple]) -> Any:
        """Runs a call whose binder key is known (`key_of` gave it for a call of
        the same structure): the hit path with `leaves`, `key` and `shardings`;
        `args()` gives the call's positional arguments, called only when the
        call leaves the hit path (a miss, a slow call, a failed execution).
        While a profile or a profiler trace is on, the call goes through
        `__call__` (its timed or traced flavour) instead."""
        binders = self._binders
        hit = binders.hit  # read before the flavour: a profile starting meanwhile is seen
        if binders.flavour != "plain" or _tracing():
            return self(*args())
        _collect_garbage()  # as __call__ does
        return hit(self, _hooks.Deferred(args), {}, leaves, key, shardings, None, 0)

    def _entry_for(self, args: tuple, kwargs: dict) -> tuple[Node | None, Sequence]:
        """The node a call would hit, and its dynamic leaves (no side effects)."""
        signature = self._binders.key_only(call_shape(args, kwargs))(self, args, kwargs)
        if type(signature) is str:
            return None, []
        leaves, key, shardings = signature
        return self._namespace.find(key, shardings, _trace_context()), leaves

    def _cache_size(self) -> int:
        """Number of signatures cached for this function (and its twins)."""
        return self._namespace.size()

    def _clear_cache(self) -> None:
        self._namespace.clear()

    def clear_cache(self) -> None:
        """Clears this function's entries and JAX's traces of it, as upstream."""
        self._clear_cache()
        self._jax_jitted.clear_cache()


def _jit_as_caller(fun: Callable, options: dict[str, Any]) -> Any:
    """JAX's own jit of `fun`, its warnings (a deprecated option, say) issued
    again from the first frame outside nbjit, as jax.jit's are: a filter on
    the caller's module (``error::DeprecationWarning:mymodule``) sees them as
    it sees jax.jit's."""
    error: Exception | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jitted = _jax.jax_jit(fun, **options)
        except Exception as raised:  # (after its warnings, as jax.jit raises it)
            error = raised
    for warning in caught:
        warn_past((_jax.NBJIT_DIR + "/",), str(warning.message), warning.category)
    if error is not None:
        raise error
    return jitted


def _record_for(fastpath: Any, leaves: Sequence, donates: bool, name: str, counters: Any
                ) -> tuple[FastPath | None, str | None]:
    """(the node's record, or None and why its signature takes JAX's path)."""
    try:
        return build_record(fastpath, leaves, donates, name=name), None
    except Unsupported as why:
        return None, why.args[0]
    except Exception as error:  # something nbjit cannot hold: JAX's path for good, and why
        gave_up("fast path", error, counters)
        return None, "no_fastpath"


def _unkeyable_reason(leaves: Sequence, canonical: dict) -> str:
    """Why a leaf has no signature: the slow reason counted for the call."""
    for x in leaves:
        if leaf_signature(x, canonical) is None:
            if isinstance(x, _jax.Tracer):
                return TRACED
            if isinstance(x, _jax.Ref):
                return "ref"  # as jax.jit: Refs always take JAX's own path
            if type(x) is ArrayImpl or host_dtype(x, canonical) is not None:
                continue
            return "unknown_leaf_type"
    return "unknown_leaf_type"


def _no_fastpath_reason(jitted: Any, args: tuple, kwargs: dict) -> str:
    """'effects' when JAX gave no fast-path data because the function has effects."""
    try:
        return "effects" if _jax.jaxpr_has_effects(jitted, args, kwargs) else "no_fastpath"
    except Exception:
        return "no_fastpath"


# -- what `PjitFunction.__call__` does first: its detour --------------------
#
# While the hit path's flavour stamps a call's ends (`Flavour.entry_stamp`:
# a `nbjit.profile()`; the function's binder table says so, `stamps_entry`,
# set with its flavour) or a profiler session collects (`TraceMe.is_enabled`,
# one C++ read), `__call__` reads the clock, hands the call to its detour
# with that stamp in a list, and sets the list's last item to the clock as
# the detour returns: the ends of a call a profile times, as near its caller
# as `__call__` can take them. The class itself never changes (a class
# attribute set on every switch would, from Python 3.13 on, leave the class
# without the version tag its calls' attribute caches need after 1000 switches).


def _traced_call(jitted: PjitFunction, args: tuple, kwargs: dict, stamps: list[int]) -> Any:
    """The call while a profiler session collects: the registered traced call."""
    return profiler_hooks().traced_call(jitted, args, kwargs)


def _stamped_call(jitted: PjitFunction, args: tuple, kwargs: dict, stamps: list[int]) -> Any:
    """The call while the hit path's flavour stamps its ends (`Flavour.entry_stamp`):
    `PjitFunction.__call__`'s own steps, the binder handed `stamps`, which
    `__call__` began as the call entered and ends as this returns, so that
    the phases span the whole call but `__call__`'s frame (finding the
    binder counts in the first phase, the binder's return in the last)."""
    if _tracing():
        return profiler_hooks().traced_call(jitted, args, kwargs)
    _collect_garbage()
    binder = jitted._binders[~len(args) if kwargs else len(args)]
    try:
        if binder.takes_entry_stamp:
            return binder(jitted, args, kwargs, stamps)
        return binder(jitted, args, kwargs)  # built plain: the flavour switched meanwhile
    except Exception as error:  # as `__call__`: jaxlib shows no frames
        _jax.filter_dispatch_frames(error)
        raise


def _as_view(jitted: PjitFunction) -> JitView:
    """Never called: the type checker proves here that `PjitFunction` is a `JitView`."""
    return jitted


def _name_holding(jitted: PjitFunction) -> str | None:
    """`jitted`'s qualified name where its module holds `jitted` itself there
    (what pickle looks up by), else None."""
    qualname = getattr(jitted, "__qualname__", None)
    module = sys.modules.get(getattr(jitted, "__module__", None) or "")
    if module is None or not isinstance(qualname, str) or "<locals>" in qualname:
        return None
    found: Any = module
    try:
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # a missing name or an attribute that raises: not found
        return None
    return qualname if found is jitted else None


def rebuild(fun: Callable, options: dict[str, Any]) -> PjitFunction:
    """What an unpickled `PjitFunction` is made by (`PjitFunction.__reduce__`)."""
    return PjitFunction(fun, options)


_rebuild = rebuild  # pickles made before the rename load through this name


# ---------------------------------------------------------------------------
# Public constructor


def jit(
    fun: Callable | None = None,
    /,
    *,
    in_shardings: Any = _NOT_SET,
    out_shardings: Any = _NOT_SET,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
) -> Any:
    """Drop-in `jax.jit`: same options, same results; nbjit's cache-hit path.

    Works as ``@nbjit.jit``, ``@nbjit.jit(static_argnames=...)`` and
    ``functools.partial(nbjit.jit, ...)``.
    """
    options: dict[str, Any] = {}
    for name, value, default in (
        ("in_shardings", in_shardings, _NOT_SET),
        ("out_shardings", out_shardings, _NOT_SET),
        ("static_argnums", static_argnums, None),
        ("static_argnames", static_argnames, None),
        ("donate_argnums", donate_argnums, None),
        ("donate_argnames", donate_argnames, None),
        ("keep_unused", keep_unused, False),
        ("device", device, None),
        ("backend", backend, None),
        ("inline", inline, False),
        ("compiler_options", compiler_options, None),
    ):
        if value is not default:
            options[name] = value
    if fun is None:
        return functools.partial(_jit_with, options)
    try:
        return PjitFunction(fun, options)
    except Exception as error:  # bad options: as calls, no nbjit frame (jax.jit shows none)
        _jax.filter_dispatch_frames(error)
        raise


def _jit_with(options: dict[str, Any], fun: Callable) -> PjitFunction:
    try:
        return PjitFunction(fun, options)
    except Exception as error:  # as `jit`
        _jax.filter_dispatch_frames(error)
        raise
