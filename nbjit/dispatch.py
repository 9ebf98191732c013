"""The dispatcher: parse, key, cache, miss path, execute.

`jit(fun)` returns a `PjitFunction`. Tracing, lowering and compiling stay
JAX's own (`jax.jit(fun)._cache_miss`); what lives here is the per-call fast
path that jaxlib writes in C++: key the call, find the executable, put the
inputs on the right devices, run, wrap the outputs.

Keys. A call's signature is (key, shardings, trace context):
  * key, hashed: every leaf a `jax.Array` (the common case) gives
    ``((aval, committed), ...)`` for positional array arguments, else
    ``(treedef id, ((aval, committed), ...), prefix)`` (`_array_key`);
    avals are interned by JAX, so they hash by identity, and a treedef is
    replaced by a small int once. Any other mix of leaves (numpy arrays, scalars) gives
    ``(prefix, treedef id, _GENERAL, per-leaf signatures)``. The prefix
    says how the leaves were flattened and carries the static arguments
    (exact type and ``==``); see `PjitFunction._call_leaves`.
  * shardings and trace context (the C++ tuple of every config value that
    enters a jit key), compared per entry rather than hashed: their hashes
    are not cheap, while tuple equality checks identity first and the
    result handlers hand back the same sharding objects on every call.
A leaf of any other type (a tracer, a string, an object) takes JAX's own path
and is never cached, so JAX raises what it raises.

Invariants:
  * Only `_miss` writes the cache; an entry never changes after insertion,
    except that a hit stores its (equal) shardings list in the entry: arrays
    from `jax.device_put` carry equal but distinct sharding objects, whose
    `==` costs ~0.25 us each, while identity is a pointer compare.
  * An entry with ``fast=False`` sends its signature to JAX's own path for
    good (no fast-path data, or its compile failed).
  * A hit never enters JAX's Python: execute_sharded + consume_with_handlers.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np

from nbjit import _explain, _jax, _profile, _stats
from nbjit import sharding as _sharding

__all__ = ["PjitFunction", "PjitFunctionCache", "jit", "floor_call"]

ArrayImpl = _jax.ArrayImpl
_flatten = _jax.flatten_for_dispatch
_device_put = _jax.batched_device_put
_copy_to_devices = _jax.batched_copy_array_to_devices_with_sharding
_consume = _jax.ExecuteResults.consume_with_handlers
_collect_garbage = _jax.collect_garbage
_trace_context = _jax.trace_context
_debug_nans = _jax.debug_nans
_debug_infs = _jax.debug_infs
_host_transfers_unguarded = _jax.host_transfers_unguarded
_enable_x64 = _jax.enable_x64
_GENERAL = object()  # marks keys built by the general (mixed-leaf) path
_NOT_SET = object()  # marks jit options the caller did not pass
_MAX_CALL_SHAPES = 256  # static-argument splits remembered per function


# ---------------------------------------------------------------------------
# The cache


class PjitFunctionCache:
    """An LRU of compiled entries whose capacity is shared by many functions.

    As in jaxlib, entries are grouped per (Python function, global cache key):
    two `jit` objects over the same function with the same options share
    executables. The function is held by weak reference: when it dies, so do
    its entries.
    """

    _instances: weakref.WeakSet[PjitFunctionCache] = weakref.WeakSet()

    def __init__(self, capacity: int = 4096) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._capacity = int(capacity)
        self._lru: collections.OrderedDict[_Entry, None] = collections.OrderedDict()
        self._namespaces: dict[tuple[int, Any], _Namespace] = {}  # by weakly-held function
        self._all_namespaces: weakref.WeakSet[_Namespace] = weakref.WeakSet()
        self._lock = threading.RLock()
        PjitFunctionCache._instances.add(self)

    def size(self) -> int:
        """Number of entries (compiled signatures) held, over all functions."""
        return len(self._lru)

    def capacity(self) -> int:
        return self._capacity

    def clear(self) -> None:
        """Drops every entry of every function using this cache."""
        with self._lock:
            for namespace in list(self._all_namespaces):
                namespace.fold_hits()
                namespace.entries.clear()
            self._lru.clear()

    @staticmethod
    def clear_all() -> None:
        """Drops every entry of every `PjitFunctionCache`."""
        for cache in list(PjitFunctionCache._instances):
            cache.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self._capacity}  # pickles empty, like jaxlib's

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"])

    def __repr__(self) -> str:
        return f"PjitFunctionCache(size={self.size()}, capacity={self._capacity})"

    # -- used by PjitFunction ------------------------------------------------

    def _namespace_for(self, fun: Callable, global_key: Any) -> _Namespace:
        key = (id(fun), global_key)
        with self._lock:
            namespace = self._namespaces.get(key)
            if namespace is not None and namespace.fun_ref() is fun:
                return namespace
            namespace = _Namespace(self, None)
            self._all_namespaces.add(namespace)
            try:
                namespace.fun_ref = weakref.ref(
                    fun, functools.partial(self._forget, key, namespace))
            except TypeError:  # not weak-referenceable: the jit object owns its entries
                return namespace
            self._namespaces[key] = namespace
            return namespace

    def _forget(self, key: tuple[int, Any], namespace: _Namespace, _ref: Any = None) -> None:
        with self._lock:
            if self._namespaces.get(key) is namespace:
                del self._namespaces[key]
            namespace.drop_all()

    def _insert(self, entry: _Entry) -> None:
        with self._lock:
            self._lru[entry] = None
            while len(self._lru) > self._capacity:
                old, _ = self._lru.popitem(last=False)
                old.namespace.unlink(old)
                old.namespace.counters.count_eviction(old.description, old.hits)


class _Namespace:
    """The entries of one (function, global cache key) inside a cache."""

    __slots__ = ("cache", "entries", "pending", "fun_ref", "counters", "__weakref__")

    def __init__(self, cache: PjitFunctionCache, fun_ref: Any) -> None:
        self.cache = cache
        self.entries: dict[Any, _Entry] = {}  # key -> first entry of a chain
        self.pending: dict[Any, _Pending] = {}  # signature -> compile in flight
        self.fun_ref = fun_ref
        self.counters = _stats.Counters()  # shared by twins, as the entries are

    def find(self, key: Any, shardings: list, context: tuple) -> _Entry | None:
        entry = self.entries.get(key)
        while entry is not None and (entry.shardings != shardings or entry.context != context):
            entry = entry.next
        return entry

    def link(self, entry: _Entry) -> None:
        entry.next = self.entries.get(entry.key)
        self.entries[entry.key] = entry
        self.cache._insert(entry)

    def unlink(self, entry: _Entry) -> None:
        """Removes `entry` from its chain (called with the cache lock held)."""
        head = self.entries.get(entry.key)
        if head is entry:
            if entry.next is None:
                del self.entries[entry.key]
            else:
                self.entries[entry.key] = entry.next
            return
        while head is not None and head.next is not entry:
            head = head.next
        if head is not None:
            head.next = entry.next

    def fold_hits(self) -> None:
        """Moves the hit counts of the entries into the counters (before they are dropped)."""
        for head in self.entries.values():
            for entry in _chain(head):
                self.counters.hits += entry.hits
                entry.hits = 0

    def hits_and_size(self) -> tuple[int, int]:
        """(hits counted on live entries, number of entries); call with the cache lock held."""
        hits = n = 0
        for head in self.entries.values():
            for entry in _chain(head):
                hits += entry.hits
                n += 1
        return hits, n

    def drop_all(self) -> None:
        self.fold_hits()
        for head in list(self.entries.values()):
            entry = head
            while entry is not None:
                self.cache._lru.pop(entry, None)
                entry = entry.next
        self.entries.clear()

    def size(self) -> int:
        n = 0
        for head in self.entries.values():
            entry = head
            while entry is not None:
                n += 1
                entry = entry.next
        return n


class _Pending:
    """A compile in flight: waiters block on `done` without holding locks."""

    __slots__ = ("thread", "done")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.done = threading.Event()


class _Entry:
    """One compiled signature and everything a hit needs, fixed at creation."""

    __slots__ = (
        "key", "shardings", "context", "next", "namespace", "fast", "executable", "execute",
        "out_handlers", "out_tree", "single_output", "inputs_are_leaves", "kept",
        "consts", "copies", "host", "planned",
        "convert", "convert_shardings", "description", "slow_reason", "hits", "__weakref__",
    )

    def __init__(self, key: Any, shardings: list, context: tuple,
                 namespace: _Namespace) -> None:
        self.key = key
        self.shardings = shardings
        self.context = context
        self.namespace = namespace
        self.next: _Entry | None = None
        self.fast = False
        self.description: Any = None  # _explain.CallDescription, set by _miss
        self.slow_reason = "no_fastpath"  # why a slow entry is slow (_stats.SLOW_REASONS)
        self.hits = 0  # hits of this signature (the hit path's one increment)

    def inputs(self, leaves: Sequence) -> list:
        """The executable's input list: consts, kept leaves, converted ones.

        A single-device jax.Array on the wrong device is copied (C++); host
        values (numpy arrays, scalars) bound for one device go in one batched
        C++ transfer each (`_HostInput`), except arrays of at least
        `sharding.SINGLE_DEVICE_PLAN_MIN_BYTES`; those and host values bound
        for a multi-device sharding are copied/sliced on the host by their
        `ShardingPlan`; anything else (a resharding) goes through JAX's
        shard_args.
        """
        inputs = [*self.consts, *[leaves[i] for i in self.kept]]
        for i, device_list, sharding in self.copies:
            inputs[i] = _copy_to_devices([inputs[i]], [device_list], [sharding],
                                         [_jax.REUSE_INPUT])[0]
        for host in self.host:
            i = host.index
            inputs[i] = host.put(inputs[i])
        for i, dtype, plan in self.planned:
            inputs[i] = plan.put(np.asarray(inputs[i], dtype))
        if self.convert:
            converted = _jax.pxla_shard_args(
                self.convert_shardings, [None] * len(self.convert),
                [inputs[i] for i in self.convert])
            for i, value in zip(self.convert, converted, strict=True):
                inputs[i] = value
        return inputs


def _build_entry(signature: tuple, namespace: _Namespace, leaves: list,
                 fastpath: Any, donated: bool) -> _Entry:
    """Turns JAX's fast-path data into an entry; unusual cases stay slow.

    `donated`: the function donates some argument (host inputs keep no memo).
    """
    entry = _Entry(*signature, namespace)
    if fastpath is None:
        return entry
    entry.slow_reason = "layout"
    if any(layout is not None for layout in fastpath.in_device_local_layouts):
        return entry
    entry.slow_reason = "unsupported_fastpath"
    const_args = list(fastpath.const_args)
    kept_bits = list(fastpath.kept_var_bitvec)
    n_const = len(const_args)
    if len(kept_bits) != n_const + len(leaves):
        return entry
    in_shardings = list(fastpath.in_shardings)
    consts = [c for c, keep in zip(const_args, kept_bits[:n_const], strict=True) if keep]
    kept = tuple(i for i, keep in enumerate(kept_bits[n_const:]) if keep)
    if len(consts) + len(kept) != len(in_shardings):
        return entry
    inputs = [*consts, *[leaves[i] for i in kept]]
    copies, host, planned, convert = [], [], [], []
    for i, (x, sharding) in enumerate(zip(inputs, in_shardings, strict=True)):
        if type(x) is ArrayImpl:
            if _same_placement(x, sharding):
                continue
            if len(x._sharding.device_set) == 1 and len(sharding.device_set) == 1:
                copies.append((i, _jax.device_list(sharding), sharding))
            else:
                convert.append(i)
            continue
        dtype = _host_dtype(x)
        if dtype is None:
            convert.append(i)
        elif (len(sharding.device_set) == 1
              and (nbytes := np.size(x) * dtype.itemsize) < _sharding.SINGLE_DEVICE_PLAN_MIN_BYTES):
            aval = _jax.ShapedArray(np.shape(x), dtype)
            memo = not donated and nbytes <= _HostInput.MEMO_MAX_BYTES
            host.append(_HostInput(i, dtype, aval, sharding, memo))
        else:  # many devices, or one and a big array: sliced/copied on the host
            plan = _sharding.plan_for(sharding, np.shape(x), dtype)
            if plan is None:
                convert.append(i)
            else:
                planned.append((i, dtype, plan))
    entry.copies = tuple(copies)
    entry.host = tuple(host)
    entry.planned = tuple(planned)
    entry.executable = fastpath.xla_executable
    entry.execute = entry.executable.execute_sharded
    entry.out_handlers = [
        _jax.result_handler(aval, sharding, committed)
        for aval, sharding, committed in zip(
            fastpath.out_avals, fastpath.out_shardings, fastpath.out_committed, strict=True)
    ]
    entry.out_tree = fastpath.out_pytree_def
    entry.single_output = entry.out_tree.num_nodes == 1 and entry.out_tree.num_leaves == 1
    entry.kept = kept
    entry.consts = consts
    entry.convert = tuple(convert)
    entry.convert_shardings = [in_shardings[i] for i in convert]
    entry.inputs_are_leaves = (not consts and not copies and not convert and not host
                               and not planned and len(kept) == len(leaves))
    entry.fast = True
    return entry


class _HostInput:
    """A numpy array or scalar bound for one device, at `index` of the inputs.

    With `memo`, the device copy of the last value is kept: a call passing
    equal bytes (the same immutable scalar object, or a small array with
    the same contents) reuses it instead of transferring again. It is exact:
    bytes, not ``==``, so -0.0, NaN payloads and every dtype are told apart;
    the copy is never donated (no memo for donating functions) and never
    handed to the caller. A guarded transfer (log, disallow) always goes
    through `batched_device_put`, which applies the guard as jaxlib does.
    """

    MEMO_MAX_BYTES = 1024  # a bytes compare this size costs far less than a transfer

    __slots__ = ("index", "dtype", "aval", "sharding", "devices", "memo", "last")

    def __init__(self, index: int, dtype: np.dtype, aval: Any, sharding: Any,
                 memo: bool) -> None:
        self.index = index
        self.dtype = dtype
        self.aval = aval
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.memo = memo
        self.last: tuple | None = None  # (source object, bytes, device array)

    def put(self, x: Any) -> Any:
        if not self.memo:
            return _device_put(self.aval, self.sharding, [np.asarray(x, self.dtype)],
                               self.devices, False)
        last = self.last
        if last is not None and x is last[0] and _host_transfers_unguarded():
            return last[2]  # the same immutable scalar object
        value = np.asarray(x, self.dtype)
        data = value.tobytes()
        if last is not None and data == last[1] and _host_transfers_unguarded():
            return last[2]
        array = _device_put(self.aval, self.sharding, [value], self.devices, False)
        # Scalars are immutable: the object itself is a key. Arrays are not,
        # and are not kept alive.
        self.last = (None if type(x) is np.ndarray else x, data, array)
        return array


def _host_dtype(x: Any) -> np.dtype | None:
    """The canonical (x64-squashed) dtype a numpy array or scalar enters as."""
    if type(x) is np.ndarray or isinstance(x, np.generic):
        dtype = x.dtype
    elif type(x) in _jax.python_scalar_types:
        dtype = np.asarray(_jax.canonicalize_value(x)).dtype
    else:
        return None
    # None for float0, strings, objects, ...: JAX's shard_args decides.
    return _canonical_dtypes[_jax.enable_x64.value].get(dtype)


def _same_placement(x: Any, sharding: Any) -> bool:
    xs = x._sharding
    if xs is sharding or xs == sharding:
        return True
    try:
        return bool(xs.is_equivalent_to(sharding, x.ndim))
    except Exception:  # different sharding types JAX cannot compare: convert
        return False


_treedef_ids: dict[Any, int] = {}
_treedef_counter = itertools.count()
_treedef_lock = threading.Lock()
_MAX_TREEDEF_IDS = 1 << 16


def _treedef_id(treedef: Any) -> int:
    """A small int standing for `treedef` in keys: cheaper to hash and compare.

    Ids are never reused: when the table is full it starts afresh, and keys
    holding old ids simply stop matching (they age out of the LRU).
    """
    tid = _treedef_ids.get(treedef)
    if tid is None:
        with _treedef_lock:
            if len(_treedef_ids) >= _MAX_TREEDEF_IDS:
                _treedef_ids.clear()
                _flat_treedef_ids.clear()
            tid = _treedef_ids.setdefault(treedef, next(_treedef_counter))
    return tid


class _FlatTreedefIds(dict):
    """n -> the treedef id of an n-tuple of leaves (what flattening `args` gives)."""

    def __missing__(self, n: int) -> int:
        tid = self[n] = _treedef_id(_flatten((0,) * n)[1])
        return tid


_flat_treedef_ids = _FlatTreedefIds()


def _array_key(treedef: Any, leaves: Sequence, prefix: Any) -> tuple:
    """The hashed key of a call whose leaves are all jax.Arrays.

    Positional arguments that are themselves the leaves (the hit path in
    `PjitFunction.__call__`) key as the bare tuple of (aval, committed)
    pairs; any other structure adds its treedef id and prefix. The two
    forms never compare equal (a pair is not an int), and the same call
    gets the same key on either path.
    """
    pairs = tuple([(x.aval, x._committed) for x in leaves])
    tid = _treedef_id(treedef)
    if prefix is False and tid == _flat_treedef_ids[len(leaves)]:
        return pairs
    return (tid, pairs, prefix)


# ---------------------------------------------------------------------------
# Per-leaf signatures (general path)


def _leaf_signature(x: Any, canonical: dict) -> Any:
    """A hashable signature of one leaf, or None if JAX must handle it.

    As in jaxlib, a numpy array and a numpy scalar are keyed alike by
    (canonical dtype, shape): with x64 off, float64 and float32 inputs share
    a signature. `canonical` maps a dtype to its canonical dtype under the
    call's x64 setting (which is part of the trace context).
    """
    t = type(x)
    if t is ArrayImpl:
        return (x.aval, x._committed, x._sharding)
    if t is np.ndarray or isinstance(x, np.generic):
        dtype = canonical.get(x.dtype)
        return None if dtype is None else (dtype, x.shape)
    if t in _jax.python_scalar_types:
        return t  # weakly typed: each Python type has its own (dtype, weak type)
    return None


class _CanonicalDtypes(dict):
    """dtype -> canonical dtype for one x64 setting; None for non-numeric dtypes."""

    def __init__(self, x64: bool) -> None:
        super().__init__()
        self._x64 = x64

    def __missing__(self, dtype: np.dtype) -> np.dtype | None:
        if not _is_numeric(dtype):
            return None  # not cached: strings, objects, float0 go to JAX's path
        with _jax.enable_x64(self._x64):
            canonical = np.dtype(_jax.canonicalize_dtype(dtype))
        self[dtype] = canonical
        return canonical

    def get(self, dtype: np.dtype, default: Any = None) -> np.dtype | None:
        try:
            return self[dtype]
        except TypeError:  # an unhashable "dtype" of some exotic subclass
            return default


_canonical_dtypes = {False: _CanonicalDtypes(False), True: _CanonicalDtypes(True)}


def _is_numeric(dtype: np.dtype) -> bool:
    """bool, integers, floats, complex, and ml_dtypes' (bfloat16, float8, ...)."""
    return dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes"


# ---------------------------------------------------------------------------
# The jitted function


_default_cache = PjitFunctionCache(8192)  # jit(f) with no explicit options
_explicit_cache = PjitFunctionCache(8192)  # jit(f, donate_argnums=..., ...)


class PjitFunction:
    """A `jax.jit`-compatible callable with nbjit's own cache-hit dispatch."""

    def __init__(self, fun: Callable, options: dict[str, Any],
                 cache: PjitFunctionCache | None = None) -> None:
        jitted = jax.jit(fun, **options)  # JAX validates the options, as upstream
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
        self._namespace = cache._namespace_for(fun, global_key)
        self._global_key = global_key
        self._lookup = self._namespace.entries.get  # the dict is never replaced
        self._touch = cache._lru.move_to_end
        self._flat_args = True  # until a call passes a non-jax.Array argument
        self._leaf_args = True  # positional arguments are leaves (see _call_pytree)
        self._static_argnums = tuple(info.static_argnums)
        self._static_argnames = frozenset(info.static_argnames)
        self._static_split: dict[Any, tuple[tuple, ...]] = {}  # call shape -> split
        self._fun_signature = info.fun_signature
        self._donates = bool(info.donate_argnums or info.donate_argnames)
        self.miss_count = 0
        self.slow_count = 0
        self._counters = self._namespace.counters
        if self._static_argnums or self._static_argnames:
            self.__class__ = _StaticPjitFunction
        _stats.register(self)
        if _profile.active():
            self.__class__ = _ProfiledPjitFunction

    # -- the hit path: key -> lookup -> inputs -> execute -> outputs ----------

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        _collect_garbage()  # frees buffers dropped off the GIL, as jaxlib does per call
        if kwargs or not self._flat_args:
            return self._call_pytree(args, kwargs)
        try:  # all jax.Arrays? (pytrees, numpy, scalars, tracers lack these attributes)
            key = tuple([(x.aval, x._committed) for x in args])  # see _array_key
            shardings = [x._sharding for x in args]
        except AttributeError:
            return self._not_flat(args, kwargs)
        context = _trace_context()
        entry = self._lookup(key)
        while entry is not None and (entry.shardings != shardings or entry.context != context):
            entry = entry.next
        if entry is None or not entry.fast or _debug_nans.value or _debug_infs.value:
            return self._flat_miss(args, kwargs, (key, shardings, context), entry)
        entry.shardings = shardings  # equal; keeping the newest makes identity checks hit
        try:  # the executable refuses a deleted or non-jax.Array input before running
            self._touch(entry)  # KeyError if another thread evicted it meanwhile
            results = entry.execute(args if entry.inputs_are_leaves else entry.inputs(args))
        except Exception as error:
            return self._execute_failed(error, args, kwargs, args)
        outs = _consume(results, entry.out_handlers)
        entry.hits += 1
        return outs[0] if entry.single_output else entry.out_tree.unflatten(outs)

    def _not_flat(self, args: tuple, kwargs: dict) -> Any:
        """This function takes pytrees, host values or other arrays: always flatten."""
        self._flat_args = False
        return self._call_pytree(args, kwargs)

    def _flat_miss(self, args: tuple, kwargs: dict, signature: tuple,
                   entry: _Entry | None) -> Any:
        if entry is None and any(type(x) is not ArrayImpl for x in args):
            # Attributes alike, but not an ArrayImpl (a typed PRNG key array, say):
            # never cached under a flat key.
            return self._not_flat(args, kwargs)
        return self._miss_or_slow(args, kwargs, list(args), signature, entry)

    def _call_pytree(self, args: tuple, kwargs: dict) -> Any:
        if not kwargs and self._leaf_args and tuple(map(type, args)).count(ArrayImpl) != len(args):
            # Positional arguments that are all leaves (numpy arrays, scalars,
            # jax.Arrays) key as `_general` would key their flattening.
            canonical = _canonical_dtypes[_enable_x64.value]
            signatures = tuple([_leaf_signature(x, canonical) for x in args])
            if None not in signatures:
                key = (False, _flat_treedef_ids[len(args)], _GENERAL, signatures)
                return self._general_hit(args, kwargs, args, key)
            self._leaf_args = False  # pytrees (or other leaves): flatten from now on
        leaves, treedef = _flatten((args, kwargs) if kwargs else args)
        if not self._leaf_args and not kwargs and len(leaves) == len(args):
            self._leaf_args = treedef.num_nodes == len(args) + 1  # leaves again: try keying them
        return self._call_leaves(args, kwargs, leaves, treedef, bool(kwargs))

    def _call_leaves(self, args: tuple, kwargs: dict, leaves: list, treedef: Any,
                     prefix: Any) -> Any:
        """The hit path for flattened leaves (pytrees, keywords, static arguments).

        `prefix` tells apart calls whose leaves flatten alike: False (positional
        only), True (with keywords: leaves of ``(args, kwargs)``), or
        ``(static key, has dynamic keywords)``.
        """
        if tuple(map(type, leaves)).count(ArrayImpl) != len(leaves):
            return self._general(args, kwargs, leaves, treedef, prefix)
        key = _array_key(treedef, leaves, prefix)
        shardings = [x._sharding for x in leaves]
        context = _trace_context()
        try:  # a static argument's __eq__ may raise: JAX reports it
            entry = self._lookup(key)
        except Exception:
            return self._slow(args, kwargs, "static_arg_error")
        while entry is not None and (entry.shardings != shardings or entry.context != context):
            entry = entry.next
        if entry is None or not entry.fast or _debug_nans.value or _debug_infs.value:
            return self._miss_or_slow(args, kwargs, leaves, (key, shardings, context), entry)
        entry.shardings = shardings  # equal; keeping the newest makes identity checks hit
        return self._run_entry(entry, args, kwargs, leaves)

    # -- slow paths -------------------------------------------------------------

    def _general(self, args: tuple, kwargs: dict, leaves: list, treedef: Any,
                 prefix: Any) -> Any:
        """Leaves that are not all jax.Arrays: numpy arrays, scalars, others.

        `prefix` as in `_call_leaves`.
        """
        canonical = _canonical_dtypes[_jax.enable_x64.value]
        signatures = tuple([_leaf_signature(x, canonical) for x in leaves])
        if None in signatures:  # JAX handles (or rejects) it
            return self._slow(args, kwargs, _unknown_leaf_reason(leaves))
        key = (prefix, _treedef_id(treedef), _GENERAL, signatures)
        return self._general_hit(args, kwargs, leaves, key)

    def _general_hit(self, args: tuple, kwargs: dict, leaves: Sequence, key: tuple) -> Any:
        """Looks up a `_GENERAL` key (its shardings list is empty) and runs it."""
        context = _trace_context()
        try:  # a static argument's __eq__ may raise: JAX reports it
            entry = self._namespace.find(key, [], context)
        except Exception:
            return self._slow(args, kwargs, "static_arg_error")
        if entry is None or not entry.fast or _debug_nans.value or _debug_infs.value:
            return self._miss_or_slow(args, kwargs, leaves, (key, [], context), entry)
        return self._run_entry(entry, args, kwargs, leaves)

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

    def _slow(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """JAX's own path, uncached here; JAX raises what it raises.

        `reason`: a key of `_stats.SLOW_REASONS`, counted in the stats.
        """
        self.slow_count += 1
        self._counters.count_slow(reason)
        return self._jax_jitted(*args, **kwargs)

    def _slow_entry(self, entry: _Entry, args: tuple, kwargs: dict) -> Any:
        """A signature whose entry has no fast path: JAX's cache-miss function runs it."""
        self.slow_count += 1
        self._counters.count_slow(entry.slow_reason)
        return self._jax_cache_miss(*args, **kwargs)[0]

    def _miss_or_slow(self, args: tuple, kwargs: dict, leaves: list, signature: tuple,
                      entry: _Entry | None) -> Any:
        if entry is not None:  # a slow entry, or debug_nans/infs is on
            if entry.fast:
                return self._slow(args, kwargs,
                                  "debug_nans" if _debug_nans.value else "debug_infs")
            return self._slow_entry(entry, args, kwargs)
        if _jax.disable_jit.value:
            self._counters.count_slow("disable_jit")
            return self._fun(*args, **kwargs)
        if not _jax.is_top_level_trace():  # staged into an outer trace: never cached
            return self._slow(args, kwargs, "tracer")
        return self._miss(args, kwargs, leaves, signature)

    def _miss(self, args: tuple, kwargs: dict, leaves: list, signature: tuple) -> Any:
        """Compiles once per signature across threads; only writer of the cache.

        `signature` is ``(key, shardings, trace context)``.
        """
        namespace = self._namespace
        lock = namespace.cache._lock
        key, shardings, context = signature
        pending_key = (key, tuple(shardings), context)
        with lock:
            entry = namespace.find(*signature)
            pending = namespace.pending.get(pending_key) if entry is None else None
            owner = entry is None and pending is None
            if owner:
                pending = namespace.pending[pending_key] = _Pending()
        if entry is not None:  # another thread finished the compile meanwhile
            return self._run_entry(entry, args, kwargs, leaves)
        if not owner:
            if pending.thread == threading.get_ident():
                raise RecursionError(
                    f"Recursively calling jit: {self.__name__} re-entered itself "
                    "while compiling the same signature")
            pending.done.wait()
            entry = namespace.find(*signature)
            if entry is None:  # the compile failed or was evicted: JAX's path
                return self._slow(args, kwargs, "compile_failed")
            return self._run_entry(entry, args, kwargs, leaves)
        self.miss_count += 1
        try:
            if any(type(x) is ArrayImpl and x.is_deleted() for x in leaves):
                # JAX rejects it before caching anything
                return self._slow(args, kwargs, "deleted_or_donated")
            started = time.perf_counter_ns()
            description, explaining = self._describe_miss(args, kwargs, context)
            try:
                outs, fastpath, rebuild = self._jax_cache_miss(*args, **kwargs)
            except BaseException:
                failed = _Entry(*signature, namespace)
                failed.description, failed.slow_reason = description, "compile_failed"
                with lock:  # as jaxlib: this signature now takes JAX's path
                    namespace.link(failed)
                self._counters.count_miss(time.perf_counter_ns() - started)
                raise
            try:
                entry = _build_entry(signature, namespace, leaves, fastpath, self._donates)
            except Exception:  # something nbjit cannot hold: JAX's path for good
                entry = _Entry(*signature, namespace)
                entry.slow_reason = "unsupported_fastpath"
            if entry.slow_reason == "no_fastpath" and not entry.fast:
                entry.slow_reason = _no_fastpath_reason(self._jax_jitted, args, kwargs)
            entry.description = description
            self._counters.count_miss(time.perf_counter_ns() - started)
            if explaining is not None:
                _explain.log_miss(description, explaining(_jax.jax_cache_misses()))
            if not rebuild:
                with lock:
                    namespace.link(entry)
            return outs  # JAX's own outputs: required when arguments were donated
        finally:
            with lock:
                namespace.pending.pop(pending_key, None)
            pending.done.set()

    def _run_entry(self, entry: _Entry, args: tuple, kwargs: dict, leaves: list) -> Any:
        if not entry.fast:
            return self._slow_entry(entry, args, kwargs)
        try:
            self._touch(entry)  # KeyError if another thread evicted it meanwhile
            inputs = leaves if entry.inputs_are_leaves else entry.inputs(leaves)
        except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong
            return self._slow(args, kwargs, "inputs_refused")
        try:
            results = entry.execute(inputs)
        except Exception as error:
            return self._execute_failed(error, args, kwargs, inputs)
        outs = _consume(results, entry.out_handlers)
        entry.hits += 1
        return outs[0] if entry.single_output else entry.out_tree.unflatten(outs)

    # -- observability (nbjit/_stats.py, _explain.py, _profile.py) -------------

    def stats(self) -> _stats.DispatchStats:
        """Calls, hits, misses, slow calls (with reasons), evictions of this function
        and its twins (same function, same options)."""
        with self._cache._lock:
            live_hits, entries = self._namespace.hits_and_size()
        return self._counters.snapshot(_stats.qualified_name(self._fun), entries, live_hits)

    def reset_stats(self) -> None:
        """Zeroes the counters of this function and its twins (entries stay)."""
        with self._cache._lock:
            self._namespace.fold_hits()
            self._counters.reset()

    def _describe_miss(self, args: tuple, kwargs: dict, context: tuple) -> tuple[Any, Any]:
        """(this call's description, and when misses are explained, a function
        (JAX's cache misses now) -> `_explain.MissContext`, else None)."""
        static, _, static_names, _ = self._split_for(len(args), tuple(kwargs))
        try:
            description = _explain.describe_call(args, kwargs, static, static_names, context)
        except Exception:  # describing must never break a call
            return None, None
        if not _explain.enabled():
            return description, None
        namespace, counters = self._namespace, self._counters
        with namespace.cache._lock:
            cached = [e.description for head in namespace.entries.values()
                      for e in _chain(head) if e.description is not None]
        evicted = list(counters.evicted)
        twins = [] if cached or evicted else self._other_options_with_entries()
        if not (cached or evicted or twins):
            return description, None
        before = _jax.jax_cache_misses()
        return description, lambda after: _explain.MissContext(
            _stats.qualified_name(self._fun), cached, evicted, twins,
            namespace.cache.capacity(), (before, after))

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

    def _entry_for(self, args: tuple, kwargs: dict) -> tuple[_Entry | None, list]:
        """The entry a call would hit, and its flat dynamic leaves (no side effects)."""
        if self._static_argnums or self._static_argnames:
            static_key, args, kwargs = self._split_static(args, kwargs)
            prefix: Any = (static_key, bool(kwargs))
        else:
            prefix = bool(kwargs)
        leaves, treedef = _flatten((args, kwargs) if kwargs else args)
        context = _trace_context()
        if all(type(x) is ArrayImpl for x in leaves):
            key = _array_key(treedef, leaves, prefix)
            return self._namespace.find(key, [x._sharding for x in leaves], context), leaves
        canonical = _canonical_dtypes[_jax.enable_x64.value]
        signatures = tuple([_leaf_signature(x, canonical) for x in leaves])
        key = (prefix, _treedef_id(treedef), _GENERAL, signatures)
        return self._namespace.find(key, [], context), leaves

    def _split_static(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple, dict]:
        """(static key, dynamic positional args, dynamic keyword args).

        Static values enter the key with their exact type, so 1 and 1.0 and
        True are different signatures, as in jaxlib. The key is not hashed
        here: an unhashable one fails the lookup, which sends the call to
        JAX's path and its error. Which positions and names are static is
        worked out once per call shape (count of positional arguments and
        keyword names in order).
        """
        shape = (len(args), *kwargs) if kwargs else len(args)
        split = self._static_split.get(shape)
        if split is None:
            split = self._split_for(len(args), tuple(kwargs))
            if len(self._static_split) >= _MAX_CALL_SHAPES:
                self._static_split.clear()
            self._static_split[shape] = split
        static_positions, dynamic_positions, static_names, dynamic_names = split
        static_key = tuple([(type(args[i]), args[i]) for i in static_positions])
        if static_positions:
            args = tuple([args[i] for i in dynamic_positions])
        if static_names:
            static_key += tuple([(k, type(kwargs[k]), kwargs[k]) for k in static_names])
            kwargs = {k: kwargs[k] for k in dynamic_names}
        return static_key, args, kwargs

    def _split_for(self, nargs: int, names: tuple[str, ...]) -> tuple[tuple, ...]:
        """(static positions, dynamic positions, static names sorted, dynamic names)."""
        static = sorted({i if i >= 0 else i + nargs for i in self._static_argnums})
        static = tuple(i for i in static if 0 <= i < nargs)
        dynamic = tuple(i for i in range(nargs) if i not in static)
        static_names = tuple(sorted(self._static_argnames.intersection(names)))
        dynamic_names = tuple(k for k in names if k not in self._static_argnames)
        return static, dynamic, static_names, dynamic_names

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


def _chain(entry: _Entry | None) -> Iterable[_Entry]:
    while entry is not None:
        yield entry
        entry = entry.next


def _unknown_leaf_reason(leaves: Sequence) -> str:
    return "tracer" if any(isinstance(x, _jax.Tracer) for x in leaves) else "unknown_leaf_type"


def _no_fastpath_reason(jitted: Any, args: tuple, kwargs: dict) -> str:
    """'effects' when JAX gave no fast-path data because the function has effects."""
    try:
        return "effects" if _jax.jaxpr_has_effects(jitted, args, kwargs) else "no_fastpath"
    except Exception:
        return "no_fastpath"


class _StaticPjitFunction(PjitFunction):
    """A PjitFunction with static arguments: their values join the key."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        _collect_garbage()
        static_key, dyn_args, dyn_kwargs = self._split_static(args, kwargs)
        leaves, treedef = _flatten((dyn_args, dyn_kwargs) if dyn_kwargs else dyn_args)
        return self._call_leaves(args, kwargs, leaves, treedef, (static_key, bool(dyn_kwargs)))


_clock = time.perf_counter_ns
_profiled_call = threading.local()  # .t0: when the profiled call on this thread began


class _ProfiledPjitFunction(PjitFunction):
    """Any PjitFunction while a `nbjit.profile()` is active: the same paths, timed.

    Flat calls (positional jax.Arrays) are timed in all five phases; hits of
    other call shapes time key and lookup together (reported as key, lookup
    0) until the per-call-shape binders split them. Misses and slow calls
    are timed whole.
    """

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        t0 = _clock()
        _collect_garbage()
        if kwargs or not self._flat_args or self._static_argnums or self._static_argnames:
            return self._profiled_other(t0, args, kwargs)
        try:
            key = tuple([(x.aval, x._committed) for x in args])
            shardings = [x._sharding for x in args]
        except AttributeError:
            return self._profiled_other(t0, args, kwargs)
        context = _trace_context()
        t_key = _clock()
        entry = self._lookup(key)
        while entry is not None and (entry.shardings != shardings or entry.context != context):
            entry = entry.next
        if entry is None or not entry.fast or _debug_nans.value or _debug_infs.value:
            return self._profiled_other(t0, args, kwargs)
        t_lookup = _clock()
        entry.shardings = shardings
        try:
            self._touch(entry)
            inputs = args if entry.inputs_are_leaves else entry.inputs(args)
            t_inputs = _clock()
            results = entry.execute(inputs)
        except Exception:
            return self._profiled_other(t0, args, kwargs)  # the plain path handles it
        t_execute = _clock()
        outs = _consume(results, entry.out_handlers)
        out = outs[0] if entry.single_output else entry.out_tree.unflatten(outs)
        entry.hits += 1
        _profile.record(self, t0, t_key, t_lookup, t_inputs, t_execute, _clock())
        return out

    def _profiled_other(self, t0: int, args: tuple, kwargs: dict) -> Any:
        """Any call but a flat hit: hits record through `_run_entry`, the rest whole."""
        counters = self._counters
        misses = counters.misses
        _profiled_call.t0, _profiled_call.hit = t0, False
        try:
            if self._static_argnums or self._static_argnames:
                return _StaticPjitFunction.__call__(self, *args, **kwargs)
            return PjitFunction.__call__(self, *args, **kwargs)
        finally:
            if not _profiled_call.hit:
                kind = "miss" if counters.misses != misses else "slow"
                _profile.record_whole(self, kind, _clock() - t0)

    def _run_entry(self, entry: _Entry, args: tuple, kwargs: dict, leaves: list) -> Any:
        t_lookup = _clock()
        if not entry.fast:
            return self._slow_entry(entry, args, kwargs)
        try:
            self._touch(entry)
            inputs = leaves if entry.inputs_are_leaves else entry.inputs(leaves)
        except Exception:
            return self._slow(args, kwargs, "inputs_refused")
        t_inputs = _clock()
        try:
            results = entry.execute(inputs)
        except Exception as error:
            return self._execute_failed(error, args, kwargs, inputs)
        t_execute = _clock()
        outs = _consume(results, entry.out_handlers)
        out = outs[0] if entry.single_output else entry.out_tree.unflatten(outs)
        entry.hits += 1
        t0 = getattr(_profiled_call, "t0", t_lookup)
        _profiled_call.hit = True
        _profile.record(self, t0, t_lookup, t_lookup, t_inputs, t_execute, _clock())
        return out


def _set_profiled(on: bool) -> None:
    """Swaps every live function to the profiled flavour (on) or back (off)."""
    for jitted in _stats.live_functions():
        if on and type(jitted) in (PjitFunction, _StaticPjitFunction):
            jitted.__class__ = _ProfiledPjitFunction
        elif not on and type(jitted) is _ProfiledPjitFunction:
            static = jitted._static_argnums or jitted._static_argnames
            jitted.__class__ = _StaticPjitFunction if static else PjitFunction


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
    jax.block_until_ready(jitted(*args, **kwargs))
    entry, leaves = jitted._entry_for(args, kwargs)
    if entry is None or not entry.fast:
        raise ValueError("this call has no fast-path entry (it takes JAX's own path)")
    inputs = entry.inputs(leaves)
    executable, handlers = entry.executable, entry.out_handlers

    def run() -> Any:
        return executable.execute_sharded(inputs).consume_with_handlers(handlers)

    return run
