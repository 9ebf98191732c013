"""The dispatcher: `jit` and `PjitFunction`, its hit path and its slow paths.

`jit(fun)` returns a `PjitFunction`. Tracing, lowering and compiling stay
JAX's own (`jax.jit(fun)._cache_miss`); what lives here is the per-call fast
path that jaxlib writes in C++: key the call, find the executable, put the
inputs on the right devices, run, wrap the outputs.

A call goes: `__call__` -> the binder of its call shape (`nbjit._keys`: one
generated function per positional count and keyword names, which builds the
key of an all-jax.Array call) -> `_hit` (lookup -> inputs -> execute ->
outputs). Anything a binder does not expect goes to `_general` (flattened
leaves, host values), which keys the call and also ends in `_hit`. A miss or
a signature that cannot take the fast path goes to `_miss_or_slow`.

Invariants:
  * Only `_miss` links nodes into the cache (`nbjit._cache`); a node's
    record (`nbjit._record.FastPath`) never changes.
  * A hit never enters JAX's Python: execute_sharded + consume_with_handlers.
  * JAX's own path answers everything else, so JAX raises what it raises.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from nbjit import _explain, _jax, _profile, _stats
from nbjit._cache import Namespace, Node, Pending, PjitFunctionCache
from nbjit._keys import LEAVES, Split, flat_treedef_ids, leaf_signature, make_binder, treedef_id
from nbjit._record import Unsupported, build_record, canonical_dtypes, host_dtype

__all__ = ["PjitFunction", "PjitFunctionCache", "jit", "floor_call"]

ArrayImpl = _jax.ArrayImpl
_flatten = _jax.flatten_for_dispatch
_consume = _jax.ExecuteResults.consume_with_handlers
_collect_garbage = _jax.collect_garbage
_trace_context = _jax.trace_context
_post_hook = _jax.post_hook_state
_NOT_SET = object()  # marks jit options the caller did not pass
_MAX_CALL_SHAPES = 256  # binders kept per function; the table starts afresh when full
_LEAF_TYPES = frozenset({ArrayImpl, np.ndarray, *_jax.python_scalar_types})


class _Binders(dict):
    """call shape -> binder, built on first use (see `nbjit._keys`)."""

    def __init__(self, static_argnums: tuple[int, ...], static_argnames: frozenset[str]) -> None:
        super().__init__()
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.splits: dict[Any, Split] = {}

    def split(self, shape: Any) -> Split:
        split = self.splits.get(shape)
        if split is None:
            split = Split(shape, self.static_argnums, self.static_argnames)
            if len(self.splits) >= _MAX_CALL_SHAPES:
                self.splits.clear()
            self.splits[shape] = split
        return split

    def __missing__(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        binder = make_binder(self.split(shape))
        if len(self) >= _MAX_CALL_SHAPES:
            self.clear()
        self[shape] = binder
        return binder


_default_cache = PjitFunctionCache(8192)  # jit(f) with no explicit options
_explicit_cache = PjitFunctionCache(8192)  # jit(f, donate_argnums=..., ...)


class PjitFunction:
    """A `jax.jit`-compatible callable with nbjit's own cache-hit dispatch."""

    def __init__(self, fun: Callable, options: dict[str, Any],
                 cache: PjitFunctionCache | None = None) -> None:
        jitted = _jax.jax_jit(fun, **options)  # JAX validates the options, as upstream
        functools.update_wrapper(self, fun)
        info = _jax.jit_info(jitted)
        global_key = _jax.jit_global_cache_key(info)
        if cache is None:
            cache = _explicit_cache if global_key.contains_explicit_attributes else _default_cache
        self._fun = fun
        self._options = options
        self._jax_jitted = jitted
        self._jax_cache_miss = _jax.cache_miss_of(jitted)
        self._cache = cache
        self._namespace: Namespace = cache.namespace_for(fun, global_key)
        self._global_key = global_key
        self._counters = self._namespace.counters
        self._lookup = self._namespace.entries.get  # the dict is never replaced
        self._touch = cache._lru.move_to_end
        self._static_argnums = tuple(info.static_argnums)
        self._static_argnames = frozenset(info.static_argnames)
        self._binders = _Binders(self._static_argnums, self._static_argnames)
        self._fun_signature = info.fun_signature
        self._donates = bool(info.donate_argnums or info.donate_argnames)
        self.miss_count = 0  # compiles through this jit object (its twins count their own)
        self.slow_count = 0  # calls of this jit object that took JAX's own path
        _stats.register(self)  # observability hooks: nbjit/_stats.py, _profile.py
        if _profile.active():
            self.__class__ = _ProfiledPjitFunction

    # -- the hit path: binder (key) -> _hit (lookup -> inputs -> execute -> outputs)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        _collect_garbage()  # frees buffers dropped off the GIL, as jaxlib does per call
        if kwargs:
            return self._binders[(len(args), *kwargs)](self, args, kwargs)
        return self._binders[len(args)](self, args, kwargs)

    def _hit(self, args: tuple, kwargs: dict, leaves: Sequence, key: Any, shardings: list) -> Any:
        context = _trace_context()
        try:  # a static argument's __hash__ or __eq__ may raise: JAX reports it
            node = self._lookup(key)
        except Exception:
            return self._slow(args, kwargs, "static_arg_error")
        while node is not None and (node.shardings != shardings or node.context != context):
            node = node.next
        if node is None or (record := node.record) is None or _post_hook.value is not None:
            return self._miss_or_slow(args, kwargs, leaves, (key, shardings, context), node)
        node.shardings = shardings  # equal; keeping the newest makes identity checks hit
        try:
            self._touch(node)  # KeyError if another thread evicted it meanwhile
            inputs = leaves if record.leaves_are_inputs else record.inputs(leaves)
        except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong
            return self._slow(args, kwargs, "input_refused")
        try:
            results = record.execute(inputs)
        except Exception as error:
            return self._execute_failed(error, args, kwargs, inputs)
        outs = _consume(results, record.out_handlers)
        node.hits += 1
        return outs[0] if record.single_output else record.out_tree.unflatten(outs)

    # -- the general path: flattened leaves, host values ------------------------

    def _general(self, args: tuple, kwargs: dict) -> Any:
        """Calls a binder does not expect: pytrees, host values, anything else."""
        signature = self._general_signature(args, kwargs)
        if type(signature) is str:
            return self._slow(args, kwargs, signature)
        return self._hit(args, kwargs, *signature)

    def _general_signature(self, args: tuple, kwargs: dict) -> tuple | str:
        """``(leaves, key, shardings)`` of a call, or the reason JAX must take it.

        Positional arguments that are all leaves are keyed without flattening;
        anything else is flattened with the registry jit itself uses.
        """
        split = self._binders.split((len(args), *kwargs) if kwargs else len(args))
        static_key, args_d, kwargs_d = split.apply(args, kwargs) if split.has_static else (
            (), args, kwargs)
        if not kwargs_d and all(type(x) in _LEAF_TYPES for x in args_d):
            leaves, tid = args_d, flat_treedef_ids[len(args_d)]
        else:
            leaves, treedef = _flatten((args_d, kwargs_d) if kwargs_d else args_d)
            tid = treedef_id(treedef)
        try:  # all jax.Arrays (pytrees of parameters)?
            signatures = tuple([(x.aval, x._committed) for x in leaves])
            shardings = [x._sharding for x in leaves]
        except AttributeError:
            canonical = canonical_dtypes[_jax.enable_x64.value]
            signatures = tuple([leaf_signature(x, canonical) for x in leaves])
            if None in signatures:
                return _unkeyable_reason(leaves, canonical)
            shardings = [x._sharding for x in leaves if type(x) is ArrayImpl]
        return leaves, (LEAVES, split.key_shape, static_key, tid, signatures), shardings

    # -- slow paths -------------------------------------------------------------

    def _slow(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """JAX's own path, uncached here; JAX raises what it raises."""
        self._count_slow(reason)
        return self._jax_jitted(*args, **kwargs)

    def _count_slow(self, reason: str) -> None:
        self.slow_count += 1
        self._counters.count_slow(reason)

    def _execute_failed(self, error: Exception, args: tuple, kwargs: dict,
                        inputs: Sequence) -> Any:
        """The executable refused a hit's inputs, or its execution failed.

        Refused inputs (a deleted array; something not a jax.Array) go to
        JAX's own path, which raises what it raises. A failure of the
        execution itself (say, one buffer donated twice in a call) raises
        ValueError with the runtime's message, as jaxlib's fast path does.
        """
        if isinstance(error, _jax.JaxRuntimeError) and all(
                type(x) is ArrayImpl and not x.is_deleted() for x in inputs):
            raise ValueError(str(error)) from error
        deleted = any(type(x) is ArrayImpl and x.is_deleted() for x in inputs)
        return self._slow(args, kwargs, "deleted_or_donated" if deleted else "execute_refused")

    def _miss_or_slow(self, args: tuple, kwargs: dict, leaves: Sequence, signature: tuple,
                      node: Node | None) -> Any:
        if node is not None:  # a slow node, or NaN/Inf checks are on
            if node.record is not None:
                return self._slow(args, kwargs,
                                  "debug_nans" if _jax.debug_nans.value else "debug_infs")
            self._count_slow(node.reason or "no_fastpath")
            return self._jax_cache_miss(*args, **kwargs)[0]
        if _jax.disable_jit.value:
            self._count_slow("disable_jit")
            return self._fun(*args, **kwargs)
        if not _jax.is_top_level_trace():
            return self._slow(args, kwargs, "tracer")  # staged into an outer trace: never cached
        return self._miss(args, kwargs, leaves, signature)

    def _miss(self, args: tuple, kwargs: dict, leaves: Sequence, signature: tuple) -> Any:
        """Compiles once per signature across threads; only writer of the cache.

        `signature` is ``(key, shardings, trace context)``.
        """
        namespace = self._namespace
        lock = namespace.cache._lock
        key, shardings, context = signature
        pending_key = (key, tuple(shardings), context)
        with lock:
            node = namespace.find(*signature)
            pending = namespace.pending.get(pending_key) if node is None else None
            owner = node is None and pending is None
            if owner:
                pending = namespace.pending[pending_key] = Pending()
        if not owner and node is None:
            if pending.thread == threading.get_ident():
                raise RecursionError(
                    f"Recursively calling jit: {self.__name__} re-entered itself "
                    "while compiling the same signature")
            pending.done.wait()
            node = namespace.find(*signature)
        if not owner:  # another thread compiled it (or failed: JAX's path)
            return self._hit(args, kwargs, leaves, key, shardings) if node is not None else (
                self._slow(args, kwargs, "compile_failed"))
        try:
            return self._compile(args, kwargs, leaves, signature)
        finally:
            with lock:
                namespace.pending.pop(pending_key, None)
            pending.done.set()

    def _compile(self, args: tuple, kwargs: dict, leaves: Sequence, signature: tuple) -> Any:
        """JAX's trace/lower/compile for one signature; links the node it gives."""
        namespace = self._namespace
        if any(type(x) is ArrayImpl and x.is_deleted() for x in leaves):
            return self._slow(args, kwargs, "deleted_or_donated")  # JAX rejects it
        counters = self._counters
        counters.misses += 1
        self.miss_count += 1
        description, explaining = self._describe_miss(args, kwargs, signature[2])
        start = time.perf_counter()
        try:
            outs, fastpath, rebuild = self._jax_cache_miss(*args, **kwargs)
        except BaseException:
            node = Node(*signature, namespace, None, "compile_failed")
            node.description = description
            with namespace.cache._lock:  # as jaxlib: this signature now takes JAX's path
                namespace.link(node)
            raise
        finally:
            counters.miss_seconds += time.perf_counter() - start
        try:
            record, reason = build_record(fastpath, leaves, self._donates), None
        except Unsupported as why:
            record, reason = None, why.args[0]
        except Exception:  # something nbjit cannot hold: JAX's path for good
            record, reason = None, "no_fastpath"
        if fastpath is None:  # effects, or something else JAX keeps on its own path
            reason = _no_fastpath_reason(self._jax_jitted, args, kwargs)
        if explaining is not None:
            _explain.log_miss(description, explaining(_jax.jax_cache_misses()))
        if not rebuild:
            node = Node(*signature, namespace, record, reason)
            node.description = description
            with namespace.cache._lock:
                namespace.link(node)
        return outs  # JAX's own outputs: required when arguments were donated

    # -- observability (nbjit/_stats.py, _explain.py, _profile.py) -------------

    def stats(self) -> _stats.DispatchStats:
        """Calls, hits, misses, slow calls (with reasons), evictions of this function
        and its twins (same function, same options)."""
        with self._cache._lock:
            nodes = self._namespace.nodes()
            live_hits = sum(node.hits for node in nodes)
        return _stats.snapshot(self._counters, _stats.qualified_name(self._fun), len(nodes),
                               live_hits)

    def reset_stats(self) -> None:
        """Zeroes the counters of this function and its twins (entries stay)."""
        with self._cache._lock:
            for node in self._namespace.nodes():
                node.hits = 0
            self._counters.reset()

    def _describe_miss(self, args: tuple, kwargs: dict, context: tuple) -> tuple[Any, Any]:
        """(this call's description, and when misses are explained, a function
        (JAX's cache misses now) -> `_explain.MissContext`, else None)."""
        split = self._binders.split((len(args), *kwargs) if kwargs else len(args))
        try:
            description = _explain.describe_call(args, kwargs, split.static_positions,
                                                 split.static_names, context)
        except Exception:  # describing must never break a call
            return None, None
        if not _explain.enabled():
            return description, None
        namespace = self._namespace
        with namespace.cache._lock:
            cached = [n.description for n in namespace.nodes() if n.description is not None]
        evicted = list(self._counters.evicted)
        twins = [] if cached or evicted else self._other_options_with_entries()
        if not (cached or evicted or twins):
            return description, None
        before = _jax.jax_cache_misses()
        return description, lambda after: _explain.MissContext(
            _stats.qualified_name(self._fun), cached, evicted, twins,
            namespace.cache.capacity(), (before, after))

    def _other_options_with_entries(self) -> list[tuple[Any, Any]]:
        """(global key, own global key) of the same function's other namespaces with entries."""
        found = []
        for cache in {_default_cache, _explicit_cache, self._cache}:
            with cache._lock:
                for (fun_id, global_key), namespace in cache._namespaces.items():
                    if (fun_id == id(self._fun) and namespace is not self._namespace
                            and namespace.entries and namespace.fun_ref() is self._fun):
                        found.append((global_key, self._global_key))
        return found

    # -- Python surface -------------------------------------------------------

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __repr__(self) -> str:
        return f"<nbjit.PjitFunction of {self.__wrapped__!r}>"

    def __reduce__(self) -> tuple:
        return (_rebuild, (self._fun, self._options))

    @property
    def __signature__(self) -> inspect.Signature:
        if self._fun_signature is None:
            raise ValueError(f"no signature found for {self._fun!r}")
        return self._fun_signature

    def lower(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.lower(*args, **kwargs)

    def trace(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.trace(*args, **kwargs)

    def eval_shape(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._jax_jitted.eval_shape(*args, **kwargs)

    def _entry_for(self, args: tuple, kwargs: dict) -> tuple[Node | None, Sequence]:
        """The node a call would hit, and its dynamic leaves (no side effects)."""
        shape = (len(args), *kwargs) if kwargs else len(args)
        signature = make_binder(self._binders.split(shape), probe=True)(self, args, kwargs)
        if type(signature) is str:
            return None, []
        leaves, key, shardings = signature
        return self._namespace.find(key, shardings, _trace_context()), leaves

    def _cache_size(self) -> int:
        """Number of signatures cached for this function (and its twins)."""
        with self._cache._lock:
            return self._namespace.size()

    def _clear_cache(self) -> None:
        with self._cache._lock:
            self._namespace.drop_all()

    def clear_cache(self) -> None:
        """Clears this function's entries and JAX's traces of it, as upstream."""
        self._clear_cache()
        self._jax_jitted.clear_cache()


def _unkeyable_reason(leaves: Sequence, canonical: dict) -> str:
    """Why a leaf has no signature: the slow reason counted for the call."""
    for x in leaves:
        if leaf_signature(x, canonical) is None:
            if isinstance(x, _jax.Tracer):
                return "tracer"
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


# ---------------------------------------------------------------------------
# The profiled flavour (while a `nbjit.profile()` is active; nbjit/_profile.py)

_clock = time.perf_counter_ns
_profiled_call = threading.local()  # .now: [t0 of the call in flight, a hit was recorded]


class _ProfiledPjitFunction(PjitFunction):
    """Every PjitFunction while a profile is active: the same paths, timed.

    Entering the first profile and leaving the last swap the class of every
    live function (`_set_profiled`), so outside a profile the hit path pays
    nothing. Hits record five phases: key (from the call to `_hit`, binder
    included), lookup, inputs, execute, outputs; misses and slow calls are
    timed whole.
    """

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        t0 = _clock()
        outer = getattr(_profiled_call, "now", None)  # a call in flight on this thread
        _profiled_call.now = now = [t0, False]
        misses = self._counters.misses
        try:  # as PjitFunction.__call__
            _collect_garbage()
            if kwargs:
                return self._binders[(len(args), *kwargs)](self, args, kwargs)
            return self._binders[len(args)](self, args, kwargs)
        finally:
            if not now[1]:
                kind = "miss" if self._counters.misses != misses else "slow"
                _profile.record_whole(self, kind, _clock() - t0)
            _profiled_call.now = outer

    def _hit(self, args: tuple, kwargs: dict, leaves: Sequence, key: Any, shardings: list) -> Any:
        t_key = _clock()
        context = _trace_context()
        try:
            node = self._lookup(key)
        except Exception:
            return self._slow(args, kwargs, "static_arg_error")
        while node is not None and (node.shardings != shardings or node.context != context):
            node = node.next
        if node is None or (record := node.record) is None or _post_hook.value is not None:
            return self._miss_or_slow(args, kwargs, leaves, (key, shardings, context), node)
        t_lookup = _clock()
        node.shardings = shardings
        try:
            self._touch(node)
            inputs = leaves if record.leaves_are_inputs else record.inputs(leaves)
        except Exception:
            return self._slow(args, kwargs, "input_refused")
        t_inputs = _clock()
        try:
            results = record.execute(inputs)
        except Exception as error:
            return self._execute_failed(error, args, kwargs, inputs)
        t_execute = _clock()
        outs = _consume(results, record.out_handlers)
        node.hits += 1
        out = outs[0] if record.single_output else record.out_tree.unflatten(outs)
        now = getattr(_profiled_call, "now", None) or [t_key, False]
        now[1] = True
        _profile.record(self, now[0], t_key, t_lookup, t_inputs, t_execute, _clock())
        return out


def _set_profiled(on: bool) -> None:
    """Swaps every live function to the profiled flavour (on) or back (off)."""
    for jitted in _stats.live_functions():
        if on and type(jitted) is PjitFunction:
            jitted.__class__ = _ProfiledPjitFunction
        elif not on and type(jitted) is _ProfiledPjitFunction:
            jitted.__class__ = PjitFunction


_profile.on_switch(_set_profiled)


def _rebuild(fun: Callable, options: dict[str, Any]) -> PjitFunction:
    return PjitFunction(fun, options)


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
    return PjitFunction(fun, options)


def _jit_with(options: dict[str, Any], fun: Callable) -> PjitFunction:
    return PjitFunction(fun, options)


def floor_call(jitted: PjitFunction, /, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """A zero-argument callable running only the executable for this call.

    It does `execute_sharded` + `consume_with_handlers` on inputs prepared
    once: the floor that no Python dispatcher can beat. Raises ValueError if
    the call's signature has no fast path.
    """
    _jax.block_until_ready(jitted(*args, **kwargs))
    node, leaves = jitted._entry_for(args, kwargs)
    if node is None or node.record is None:
        raise ValueError("this call has no fast-path entry (it takes JAX's own path)")
    record = node.record
    inputs = record.inputs(leaves)
    executable, handlers = record.executable, record.out_handlers

    def run() -> Any:
        return executable.execute_sharded(inputs).consume_with_handlers(handlers)

    return run
