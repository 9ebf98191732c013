"""The executable cache: an LRU shared by many functions, namespaces, chain nodes.

A call's signature is ``(key, shardings, trace context)``. The key is hashed
(`nbjit.core.binders` builds it); the shardings list and the trace context are
compared per node, identity first, because their hashes are not cheap while
the result handlers hand back the same sharding objects on every call.
Nodes with the same key form a chain from `Namespace.entries[key]`.

Invariants:
  * Only the miss path (`nbjit.core.dispatch`) links nodes; a node's key and
    context never change after it is linked, and its record (fields never
    change) is only ever replaced whole, by `Namespace.replace_record` (a
    compare-and-swap under the cache's lock; the host-input policy,
    `nbjit.host.policy`, calls it), never edited. A hit stores its (equal)
    shardings list in the node, so that the next call's comparison is by
    identity (`jax.device_put` hands out equal but distinct sharding objects,
    whose ``==`` costs far more than an identity check; measured in
    docs/performance.md, "Measured constants behind the code").
  * A node whose `record` is None sends its signature to JAX's own path for
    good (no fast-path data), except one left by a failed compile (reason
    "compile_failed"): the next call compiles again and replaces it.
  * Every structural change (link, unlink, eviction, clear) happens under
    the cache's lock; lookups read without it (dict reads are atomic). The
    lock and the LRU are this module's own: the dispatcher and the observers
    use the methods below (`Namespace.claim`/`release`/`install`,
    `Namespace.usage`, `PjitFunctionCache.namespaces_of`, `mark_recent`).
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbjit import _jax
from nbjit.core.inputs import fallbacks as _fallbacks

if TYPE_CHECKING:
    from nbjit.core.record import FastPath

__all__ = ["PjitFunctionCache", "Namespace", "Node", "Counters", "cache_from_config"]

_ABSENT = object()


class Counters:
    """What happened to one namespace's calls (see `nbjit.DispatchStats`).

    A hit counts on the node it ran (`Node.hits`, a local the hit path
    already holds); a node's count is folded into `hits` here when it leaves
    the cache, so a namespace's hits are ``hits + sum(node.hits)``.
    Everything else is counted off the hit path. No counter takes a lock.
    On CPython 3.11-3.13 with the GIL a thread switch cannot fall inside
    ``node.hits += 1`` on a ``__slots__`` object (no eval-breaker check
    between its load and its store), so hits from many threads add up
    exactly (tests/test_stats.py checks it); the language does not promise
    this (a free-threaded build can lose counts), and a first-time slow
    reason, which runs ``Counter.__missing__`` in Python, can lose one in a
    race. Counters are statistics, not accounting.
    """

    __slots__ = ("hits", "misses", "slow", "slow_reasons", "traced", "raised", "evictions",
                 "miss_seconds", "evicted", "extension_counters", "given_up")

    EVICTED_REMEMBERED = 64  # descriptions of evicted nodes kept (nbjit.observe.explain)

    def __init__(self) -> None:
        # Name -> the counters an extension of the core keeps for this
        # namespace (the host's `HostCounters`: `nbjit.host.layout`), made on
        # first use and reset with the rest; their fields are the extension's.
        self.extension_counters: dict[str, Any] = {}
        self.reset()

    def extension(self, name: str, make: Callable[[], Any]) -> Any:
        """The counters extension `name` keeps here (made by `make` on first use)."""
        found = self.extension_counters.get(name)
        if found is None:
            found = self.extension_counters.setdefault(name, make())
        return found

    def reset(self) -> None:
        self.hits = 0
        self.misses = 0
        self.slow = 0
        self.slow_reasons: collections.Counter[str] = collections.Counter()
        self.traced = 0  # calls staged into an outer trace (grad, vmap, scan, jit): never cached
        self.raised = 0  # calls whose trace raised in the function (its own error, as jax.jit's)
        self.evictions = 0
        self.miss_seconds = 0.0
        for counters in list(self.extension_counters.values()):
            counters.reset()
        self.evicted: collections.deque = collections.deque(maxlen=self.EVICTED_REMEMBERED)
        # Input strategies given up for this namespace's signatures: strategy ->
        # why, the first time (`nbjit.core.inputs.fallbacks.gave_up`).
        self.given_up: dict[str, str] = {}

    def count_slow(self, reason: str) -> None:
        self.slow += 1
        self.slow_reasons[reason] += 1


class Node:
    """One cached signature in a chain; `record` is its frozen fast-path data."""

    __slots__ = ("key", "shardings", "context", "next", "namespace", "record", "reason",
                 "description", "hits", "host_policy", "__weakref__")

    def __init__(self, key: Any, shardings: list, context: tuple, namespace: Namespace,
                 record: FastPath | None = None, reason: str | None = None) -> None:
        self.key = key
        self.shardings = shardings
        self.context = context
        self.namespace = namespace
        self.record: FastPath | None = record  # replaced only by `Namespace.replace_record`
        self.reason = reason  # why a node without a record takes JAX's path
        self.next: Node | None = None
        self.hits = 0  # hits served by this node (see `Counters`)
        self.description: Any = None  # what `nbjit.observe.explain` needs, set on the miss path
        self.host_policy: Any = None  # its host-input policy, if armed (nbjit.host.policy)


class Pending:
    """A compile in flight: waiters block on `done` without holding locks."""

    __slots__ = ("key", "thread", "done")

    def __init__(self, key: Any = None) -> None:
        self.key = key  # its place in `Namespace.pending`
        self.thread = threading.get_ident()
        self.done = threading.Event()


class Namespace:
    """The nodes of one (function, global cache key) inside a cache.

    Twin `jit` objects over one function with equal options share it, and
    so share its entries and its counters.
    """

    __slots__ = ("cache", "entries", "pending", "fun_ref", "counters", "__weakref__")

    def __init__(self, cache: PjitFunctionCache) -> None:
        self.cache = cache
        self.entries: dict[Any, Node] = {}  # key -> first node of a chain; never replaced
        self.pending: dict[Any, Pending] = {}  # signature -> compile in flight
        self.fun_ref: Any = None
        self.counters = Counters()

    def find(self, key: Any, shardings: list, context: tuple) -> Node | None:
        node = self.entries.get(key)
        while node is not None and (node.shardings != shardings or node.context != context):
            node = node.next
        return node

    def nodes(self) -> list[Node]:
        out = []
        for head in list(self.entries.values()):
            node: Node | None = head
            while node is not None:
                out.append(node)
                node = node.next
        return out

    def link(self, node: Node) -> None:
        """Makes `node` the head of its chain (called with the cache lock held)."""
        node.next = self.entries.get(node.key)
        self.entries[node.key] = node
        self.cache._insert(node)

    def unlink(self, node: Node) -> None:
        """Removes `node` from its chain (called with the cache lock held)."""
        self.counters.hits += node.hits
        node.hits = 0
        head: Node | None = self.entries.get(node.key)
        if head is node:
            if node.next is None:
                del self.entries[node.key]
            else:
                self.entries[node.key] = node.next
            return
        while head is not None and head.next is not node:
            head = head.next
        if head is not None:
            head.next = node.next

    def drop(self, node: Node) -> None:
        """Unlinks `node` and takes it out of the LRU (called with the cache lock held)."""
        if self.cache._lru.pop(node, _ABSENT) is not _ABSENT:
            self.unlink(node)

    def drop_all(self) -> None:
        for node in self.nodes():
            self.cache._lru.pop(node, None)
            self.counters.hits += node.hits
            node.hits = 0
        self.entries.clear()

    def size(self) -> int:
        with self.cache._lock:
            return len(self.nodes())

    def clear(self) -> None:
        """Drops every entry of this namespace (its counters stay)."""
        with self.cache._lock:
            self.drop_all()

    # -- the miss path's seams (the lock is taken here, nowhere else) -----------

    def claim(self, key: Any, shardings: list, context: tuple
              ) -> tuple[Node | None, Node | None, Pending | None, Pending | None]:
        """Finds or claims a signature's compile: ``(node, failed, waiting, owned)``.

        `node`: the usable node already cached (None when there is none, or
        only one a failed compile left, returned as `failed`). When nothing
        is cached the first caller owns the compile (`owned`: a new `Pending`
        it must `release`); later callers get the owner's (`waiting`) to
        wait on.
        """
        with self.cache._lock:
            node = self.find(key, shardings, context)
            failed = node if node is not None and node.reason == "compile_failed" else None
            if failed is not None:
                node = None
            if node is not None:
                return node, None, None, None
            pending_key = (key, tuple(shardings), context)
            pending = self.pending.get(pending_key)
            if pending is not None:
                return None, failed, pending, None
            pending = self.pending[pending_key] = Pending(pending_key)
            return None, failed, None, pending

    def release(self, pending: Pending) -> None:
        """Ends the compile `pending` stood for; its waiters look again."""
        with self.cache._lock:
            self.pending.pop(pending.key, None)
        pending.done.set()

    def install(self, node: Node | None, replacing: Node | None = None) -> None:
        """Links `node` (if any) in place of `replacing` (if any), atomically."""
        with self.cache._lock:
            if replacing is not None:
                self.drop(replacing)
            if node is not None:
                self.link(node)

    def replace_record(self, node: Node, expected: FastPath, new: FastPath) -> bool:
        """The one way a node's record changes after its insert: installs `new` if
        `node` still holds `expected` (compare-and-swap, under the cache's lock);
        False otherwise (nothing changes). The hit path reads ``node.record``
        once per call, so a call runs one record whole."""
        with self.cache._lock:
            if node.record is not expected:
                return False
            node.record = new
        _fallbacks.moved(self.counters, expected.host_path, new.host_path)
        return True

    # -- what observers read ------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """(entries, hits counted on them), read together."""
        with self.cache._lock:
            nodes = self.nodes()
            return len(nodes), sum(node.hits for node in nodes)

    def host_paths(self) -> dict[str, int]:
        """How many entries move their host inputs each way (`FastPath.host_path`)."""
        with self.cache._lock:
            paths = [n.record.host_path for n in self.nodes() if n.record is not None]
        return dict(collections.Counter(p for p in paths if p is not None))

    def reset_counts(self) -> None:
        """Zeroes the counters and the hits of every entry (entries stay)."""
        with self.cache._lock:
            for node in self.nodes():
                node.hits = 0
            self.counters.reset()

    def descriptions(self) -> list[Any]:
        """The call descriptions (`nbjit.observe.explain`) of the entries that have one."""
        with self.cache._lock:
            return [n.description for n in self.nodes() if n.description is not None]


class PjitFunctionCache:
    """An LRU of compiled entries whose capacity is shared by many functions.

    As in jaxlib, entries are grouped per (Python function, global cache key):
    two `jit` objects over the same function with the same options share
    executables. The function is held by weak reference: when it dies, so do
    its entries.
    """

    _instances: weakref.WeakSet[PjitFunctionCache] = weakref.WeakSet()

    def __init__(self, capacity: int = 4096) -> None:
        self._setup(capacity)
        PjitFunctionCache._instances.add(self)

    def _setup(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._capacity = int(capacity)
        self._lru: collections.OrderedDict[Node, None] = collections.OrderedDict()
        self._namespaces: dict[tuple[int, Any], Namespace] = {}  # by weakly-held function
        self._all_namespaces: weakref.WeakSet[Namespace] = weakref.WeakSet()
        self._lock = threading.RLock()
        # A hit moves its node to the LRU's recent end: the OrderedDict's own
        # bound method, so the generated hit path pays one call, no wrapper.
        self.mark_recent: Callable[[Node], None] = self._lru.move_to_end

    def size(self) -> int:
        """Number of entries (compiled signatures) held, over all functions."""
        return len(self._lru)

    def capacity(self) -> int:
        return self._capacity

    def clear(self) -> None:
        """Drops every entry of every function using this cache."""
        with self._lock:
            for namespace in list(self._all_namespaces):
                namespace.drop_all()
            self._lru.clear()

    @staticmethod
    def clear_all() -> None:
        """Drops every entry of every `PjitFunctionCache`."""
        for cache in list(PjitFunctionCache._instances):
            cache.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self._capacity}  # pickles empty, like jaxlib's

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["capacity"])
        PjitFunctionCache._instances.add(self)

    def __repr__(self) -> str:
        return f"PjitFunctionCache(size={self.size()}, capacity={self._capacity})"

    # -- used by the dispatcher ---------------------------------------------------

    def namespace_for(self, fun: Callable, global_key: Any) -> Namespace:
        """The namespace of (fun, global_key), shared by twins while `fun` lives."""
        key = (id(fun), global_key)
        with self._lock:
            namespace = self._namespaces.get(key)
            if namespace is not None and namespace.fun_ref() is fun:
                return namespace
            namespace = Namespace(self)
            self._all_namespaces.add(namespace)
            try:
                namespace.fun_ref = weakref.ref(
                    fun, functools.partial(self._forget, key, namespace))
            except TypeError:  # not weak-referenceable: the jit object owns its entries
                return namespace
            self._namespaces[key] = namespace
            return namespace

    def namespaces_of(self, fun: Callable) -> list[tuple[Any, Namespace]]:
        """(global key, namespace) of every live namespace of `fun` (all its jit options)."""
        with self._lock:  # over a copy: a collection in the loop may run `_forget` (an RLock)
            return [(global_key, namespace)
                    for (fun_id, global_key), namespace in self._namespaces.copy().items()
                    if fun_id == id(fun) and namespace.fun_ref() is fun]

    def _forget(self, key: tuple[int, Any], namespace: Namespace, _ref: Any = None) -> None:
        with self._lock:
            if self._namespaces.get(key) is namespace:
                del self._namespaces[key]
            namespace.drop_all()

    def _insert(self, node: Node) -> None:
        with self._lock:
            self._lru[node] = None
            while len(self._lru) > self._capacity:
                old, _ = self._lru.popitem(last=False)
                old.namespace.unlink(old)
                old.namespace.counters.evictions += 1
                if old.description is not None:
                    old.namespace.counters.evicted.append(old.description)


class _ClearedWithJax:
    """Registered with JAX's cache management: `jax.clear_caches()` clears every
    `PjitFunctionCache` too, as it clears jaxlib's."""

    def cache_clear(self) -> None:
        PjitFunctionCache.clear_all()

    def cache_info(self) -> None:
        return None

    def cache_keys(self) -> list:
        return []


_cleared_with_jax = _ClearedWithJax()  # JAX holds it weakly
_jax.register_cache(_cleared_with_jax, "nbjit.PjitFunctionCache (all)")

# jaxlib cache named by `jax_jit_cpp_cache_obj` -> (it, weak ref to nbjit's twin)
_config_caches: dict[int, tuple[Any, weakref.ref]] = {}
_config_caches_lock = threading.Lock()


def cache_from_config() -> PjitFunctionCache | None:
    """The cache a function created now uses by `jax.config.jax_jit_cpp_cache_obj`.

    As upstream (`pjit._cpp_pjit`): only at the top level of tracing. The
    config holds a jaxlib `PjitFunctionCache`; nbjit gives each such cache
    one twin of its own with the same capacity, which the functions created
    under it share (so they evict each other as upstream's do). The twin
    lives while a function uses it; it is not cleared by the jaxlib cache's
    `clear()`.
    """
    config_cache = _jax.jit_cpp_cache_obj.value
    if config_cache is None or not _jax.is_top_level_trace():
        return None
    key = id(config_cache)
    with _config_caches_lock:
        held = _config_caches.get(key)
        twin = held[1]() if held is not None and held[0] is config_cache else None
        if twin is None:
            twin = PjitFunctionCache(config_cache.capacity())
            _config_caches[key] = (config_cache, weakref.ref(twin))
            weakref.finalize(twin, _forget_config_cache, key, _config_caches[key][1])
    return twin


def _forget_config_cache(key: int, twin_ref: weakref.ref) -> None:
    with _config_caches_lock:
        held = _config_caches.get(key)
        if held is not None and held[1] is twin_ref:
            del _config_caches[key]
