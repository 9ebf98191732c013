"""Pools of host buffers, each reused once only its pool holds it.

A zero-copy put hands the runtime a host buffer that it reads after the
call returns (an accelerator's transfer) or for as long as a device array
aliases it (the CPU). The runtime holds a Python reference to that buffer
while anything may read it and drops it when done, so a pooled buffer may
be written again exactly when its reference count shows that nothing but
its pool holds it. That rule is `BufferPool.claim`'s, and nowhere else's:
the count a free buffer shows is measured at import by `claim` itself
(`_measured_free`), not counted by hand, since what a frame's count
includes differs between CPython versions.

Every pool is in one registry: together they keep at most
`POOLED_MAX_BYTES` (past it a claim makes a buffer no pool keeps), and
`clear_pools` lets go of every kept buffer (one that something still reads
stays alive there). The pools: the plans' big staging buffers, one per size
(`staging_buffer`), and each staged leaf's private copies
(`nbjit.core.inputs.staging.StagingRing`).
"""

from __future__ import annotations

import collections
import sys
import threading
import weakref
from collections.abc import Callable

import numpy as np

from nbjit._common import ALIGN, align_up

__all__ = ["POOLED_MAX_BYTES", "STAGING_POOL_MIN_BYTES", "BufferPool", "aligned_empty",
           "clear_pools", "clear_staging_pool", "pooled_buffers", "staging_buffer",
           "staging_pool_size"]

# Plans' staging buffers from this size are pooled: a fresh buffer is memory
# the kernel faults in and zeroes (docs/performance.md#measured-constants-behind-the-code).
STAGING_POOL_MIN_BYTES = 8 << 20
_STAGING_POOL_PER_SIZE = 2  # buffers kept per staging size (double buffering)
POOLED_MAX_BYTES = 512 << 20  # what every pool keeps, together


_FREE: int  # what `claim` sees for a buffer only its pool holds (`_measured_free`, below)
_MARKS_TRIED = 64  # counts `_measured_free` tries: far above any free buffer's
_getrefcount = sys.getrefcount

# The registry and every pool's `kept` change under this lock (re-entrant: a
# pool that dies while it is held gives its bytes back, `_forget`).
_lock = threading.RLock()
_pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()
_kept_bytes = 0  # what every live pool keeps


class BufferPool:
    """Buffers of `nbytes` (made by `make`) reused once nothing else holds them.

    `claim()` takes a buffer out of the pool: the oldest released one that
    only the pool held, else a new one. `release(buffer)` puts a claimed
    buffer back; it is claimed again only once nothing else holds it, so a
    caller may release a buffer as soon as it holds it: its own reference,
    then its reader's (a put's, while it reads), keep it from a claim. The
    pool keeps `kept.count` buffers, at most `cap` (and `POOLED_MAX_BYTES`
    across pools): a buffer it makes past that is not counted, and a
    release finding `free` holding that many drops its buffer.

    `free` is a deque: ``popleft`` and ``append`` are atomic under the GIL,
    so a buffer out of it is seen by one thread only.
    """

    __slots__ = ("nbytes", "make", "cap", "free", "kept", "__weakref__")

    def __init__(self, nbytes: int, make: Callable[[], np.ndarray], cap: int) -> None:
        self.nbytes = nbytes
        self.make = make
        self.cap = max(1, cap)
        self.free: collections.deque = collections.deque()
        self.kept = _Kept(nbytes)  # (its own object: the pool's finalizer reads it)
        with _lock:
            _pools.add(self)
        weakref.finalize(self, _forget, self.kept)

    def claim(self) -> np.ndarray:
        """A buffer nothing else holds: a released one, else a new one."""
        free = self.free
        for _ in range(len(free)):
            try:
                buffer = free.popleft()
            except IndexError:  # another thread took the last one meanwhile
                break
            if _getrefcount(buffer) == _FREE:
                return buffer
            free.append(buffer)  # still read: a transfer, a device array aliasing it
        return self._new()

    def release(self, buffer: np.ndarray) -> None:
        """Puts a claimed `buffer` back (dropped where the pool keeps enough)."""
        free = self.free
        if len(free) < self.kept.count:
            free.append(buffer)

    def clear(self) -> None:
        """Lets go of every kept buffer (one still read lives on with its reader)."""
        self.free.clear()
        _forget(self.kept)

    def _new(self) -> np.ndarray:
        global _kept_bytes
        kept = self.kept
        with _lock:
            if kept.count < self.cap and _kept_bytes + self.nbytes <= POOLED_MAX_BYTES:
                kept.count += 1
                _kept_bytes += self.nbytes
        return self.make()


class _Kept:
    """How many buffers of `nbytes` a pool keeps, free or claimed (under `_lock`)."""

    __slots__ = ("count", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.count = 0
        self.nbytes = nbytes


def _measured_free() -> int:
    """The count `BufferPool.claim` sees for a buffer only its pool holds: the
    lowest free mark at which `claim` hands back a released buffer instead
    of making one (a buffer anything else holds shows more)."""
    global _FREE
    for mark in range(1, _MARKS_TRIED):
        _FREE = mark
        counted = _Counted()
        pool = BufferPool(0, counted.make, 1)
        pool.release(pool.claim())  # now only the pool holds it
        pool.claim()
        if counted.made == 1:
            return mark
    raise RuntimeError("no free mark found for BufferPool.claim")


class _Counted:
    """Empty buffers, counted as they are made (`_measured_free`)."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made = 0

    def make(self) -> np.ndarray:
        self.made += 1
        return np.empty(0, np.uint8)


def _forget(kept: _Kept) -> None:
    """A pool's kept buffers count no more (the pool was cleared, or died)."""
    global _kept_bytes
    with _lock:
        _kept_bytes -= kept.count * kept.nbytes
        kept.count = 0


def clear_pools() -> None:
    """Lets go of every pool's buffers (those still read live on with their readers)."""
    with _lock:
        pools = list(_pools)
    for pool in pools:
        pool.clear()


def pooled_buffers() -> int:
    """Buffers every pool keeps (free or claimed)."""
    with _lock:
        return sum(pool.kept.count for pool in _pools)


_FREE = _measured_free()


def aligned_empty(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialised bytes starting at a multiple of `ALIGN` (a view
    of a slightly bigger allocation)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    address = raw.__array_interface__["data"][0]
    skip = align_up(address) - address
    return raw[skip:skip + nbytes]


# ---------------------------------------------------------------------------
# The plans' staging buffers: one pool per size, from STAGING_POOL_MIN_BYTES

_by_size: dict[int, BufferPool] = {}


def staging_buffer(size: int) -> np.ndarray:
    """A uint8 buffer of `size` bytes that nothing else uses: from
    STAGING_POOL_MIN_BYTES a pooled one, released already (the caller's
    reference, then the put's arrays', keep it from another claim). It is
    the allocation itself, not a view: every view made of it refers to it."""
    if size < STAGING_POOL_MIN_BYTES:
        return np.empty(size, np.uint8)
    pool = _by_size.get(size)
    if pool is None:
        made = BufferPool(size, lambda: np.empty(size, np.uint8), _STAGING_POOL_PER_SIZE)
        with _lock:
            pool = _by_size.setdefault(size, made)
    raw = pool.claim()
    pool.release(raw)
    return raw


def clear_staging_pool() -> None:
    """Lets go of every pooled staging buffer, the plans' and the staged leaves'
    (arrays using one keep it alive)."""
    with _lock:
        _by_size.clear()
    clear_pools()


def staging_pool_size() -> int:
    """The plans' pooled staging buffers (free or in use)."""
    with _lock:
        return sum(pool.kept.count for pool in _by_size.values())
