"""Pools of host buffers, each reused once only its pool holds it.

A zero-copy put hands the runtime a host buffer that it reads after the
call returns (an accelerator's transfer) or for as long as a device array
aliases it (the CPU). The runtime holds a Python reference to that buffer
while anything may read it and drops it when done, so a pooled buffer may
be written again exactly when its reference count shows that nothing but
its pool holds it. That rule is `BufferPool.claim`'s, and nowhere else's:
the count a free buffer shows is measured at import by the very function
that reads counts (`_popped`), not counted by hand, since what a frame's
count includes differs between CPython versions.

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


def _popped(free: collections.deque) -> tuple[np.ndarray, int]:
    """The oldest buffer of `free`, taken out, and its reference count as this frame sees it."""
    buffer = free.popleft()
    return buffer, sys.getrefcount(buffer)


# What `_popped` reports for a buffer that nothing but its deque held: the
# free count, measured here by the same code that `claim` runs.
_FREE = _popped(collections.deque([np.empty(0, np.uint8)]))[1]

# The registry and every pool's `kept` change under this lock (re-entrant: a
# pool that dies while it is held gives its bytes back, `_forget`).
_lock = threading.RLock()
_pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()
_kept_bytes = 0  # what every live pool keeps


class BufferPool:
    """Buffers of `nbytes` (made by `make`) reused once nothing else holds them.

    `claim()` takes a buffer out of the pool: the oldest released one that
    only the pool held, else a new one. `release(buffer)` puts a claimed
    buffer back once it is handed on (to a put, which holds it while it
    reads): a buffer is claimed again only after every reader let go. At
    most `cap` buffers are kept (and `POOLED_MAX_BYTES` across pools); past
    that a claim makes a buffer the pool does not keep, and its release
    drops it.

    `free` is a deque: ``popleft`` and ``append`` are atomic under the GIL,
    so a buffer out of it is seen by one thread only. `kept` holds the ids
    of the buffers kept (each alive: in `free`, or with whoever claimed it).
    """

    __slots__ = ("nbytes", "make", "cap", "free", "kept", "__weakref__")

    def __init__(self, nbytes: int, make: Callable[[], np.ndarray], cap: int) -> None:
        self.nbytes = nbytes
        self.make = make
        self.cap = max(1, cap)
        self.free: collections.deque = collections.deque()
        self.kept: set[int] = set()
        with _lock:
            _pools.add(self)
        weakref.finalize(self, _forget, self.kept, nbytes)

    def claim(self) -> np.ndarray:
        """A buffer nothing else holds: a released one, else a new one."""
        free = self.free
        for _ in range(len(free)):
            try:
                buffer, count = _popped(free)
            except IndexError:  # another thread took the last one meanwhile
                break
            if count == _FREE:
                return buffer
            free.append(buffer)  # still read: a transfer, a device array aliasing it
        return self._new()

    def release(self, buffer: np.ndarray) -> None:
        """Puts a claimed `buffer` back (a buffer the pool does not keep is dropped)."""
        if id(buffer) in self.kept:
            self.free.append(buffer)

    def clear(self) -> None:
        """Lets go of every kept buffer (one still read lives on with its reader)."""
        self.free.clear()
        _forget(self.kept, self.nbytes)

    def _new(self) -> np.ndarray:
        global _kept_bytes
        buffer = self.make()
        with _lock:
            if (len(self.kept) < self.cap and id(buffer) not in self.kept
                    and _kept_bytes + self.nbytes <= POOLED_MAX_BYTES):
                self.kept.add(id(buffer))
                _kept_bytes += self.nbytes
        return buffer


def _forget(kept: set[int], nbytes: int) -> None:
    """A pool's kept buffers count no more (the pool was cleared, or died)."""
    global _kept_bytes
    with _lock:
        _kept_bytes -= len(kept) * nbytes
        kept.clear()


def clear_pools() -> None:
    """Lets go of every pool's buffers (those still read live on with their readers)."""
    with _lock:
        pools = list(_pools)
    for pool in pools:
        pool.clear()


def pooled_buffers() -> int:
    """Buffers every pool keeps (free or claimed)."""
    with _lock:
        return sum(len(pool.kept) for pool in _pools)


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


def staging_buffer(size: int) -> tuple[np.ndarray, BufferPool | None]:
    """A uint8 buffer of `size` bytes that nothing else uses, and its pool
    (None below STAGING_POOL_MIN_BYTES: a fresh buffer), to `release` it to
    once it is handed to a put. The buffer is the allocation itself, not a
    view: every view of it made for a put refers to it."""
    if size < STAGING_POOL_MIN_BYTES:
        return np.empty(size, np.uint8), None
    pool = _by_size.get(size)
    if pool is None:
        made = BufferPool(size, lambda: np.empty(size, np.uint8), _STAGING_POOL_PER_SIZE)
        with _lock:
            pool = _by_size.setdefault(size, made)
    return pool.claim(), pool


def clear_staging_pool() -> None:
    """Lets go of every pooled staging buffer, the plans' and the staged leaves'
    (arrays using one keep it alive)."""
    with _lock:
        _by_size.clear()
    clear_pools()


def staging_pool_size() -> int:
    """The plans' pooled staging buffers (free or in use)."""
    with _lock:
        return sum(len(pool.kept) for pool in _by_size.values())
