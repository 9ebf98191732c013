"""The staging pools of packed host inputs: small buffers of one layout, reused when free.

A packed record (`nbjit.host.packing`) writes its host leaves into a
buffer of its `HostStaging` pool and puts that buffer, zero copy.
"""

from __future__ import annotations

import collections
import sys
import threading
import weakref

import numpy as np

from nbjit._common import ALIGN, align_up
from nbjit.core.inputs.staging import add_staging_pool

__all__ = ["HostStaging", "host_staging_size"]

_pools: weakref.WeakSet[HostStaging] = weakref.WeakSet()
_lock = threading.Lock()


def host_staging_size() -> int:
    """Pooled small staging buffers of packed records (free or in use)."""
    with _lock:
        return sum(s.made for s in _pools)


class HostStaging:
    """Small staging buffers of one layout, for one packed record's host leaves.

    The rule of the core's staging pools (`nbjit.core.inputs.staging`): a
    buffer is overwritten only when, right after `collect_garbage()` (each
    call runs one first), no
    one but the pool holds it (with zero copy the runtime holds one
    reference to the array it was given for as long as any device buffer,
    computation or view reads that memory). Each item is
    ``(staging, *leaf views)``: the staging array (uint32 words) is a 64-byte-aligned view
    of its allocation, the leaf views are views of that allocation too, so
    a reference to the staging array itself is the runtime's alone.

    `free` is claimed with ``popleft`` and refilled with ``append`` (atomic
    under the GIL: two threads never fill one buffer). At most `cap`
    buffers are pooled; beyond, each call gets a fresh, unpooled buffer
    (never reused, so never overwritten while read).
    """

    __slots__ = ("nbytes", "layouts", "cap", "free", "made", "spare", "__weakref__")

    CHUNK = 16  # items allocated at once (fewer where that passes CHUNK_BYTES)
    CHUNK_BYTES = 1 << 20

    # A free item's staging array as `getrefcount(item[0])` sees it: the
    # item tuple's reference and the call's argument.
    FREE_REFCOUNT = 2

    def __init__(self, nbytes: int, layouts: list[tuple[int, tuple[int, ...], np.dtype]],
                 cap: int) -> None:
        self.nbytes = nbytes
        # (start, stop, shape, dtype) of each leaf's view, from (offset, shape, dtype)
        self.layouts = [(offset, offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                         shape, dtype) for offset, shape, dtype in layouts]
        self.cap = cap
        self.free: collections.deque = collections.deque()
        self.made = 0  # buffers pooled so far
        self.spare: list = []  # made, never used yet
        with _lock:
            _pools.add(self)
        add_staging_pool(self)  # (`nbjit.sharding.clear_staging_pool` clears it too)

    def new_item(self) -> tuple:
        """A fresh ``(staging, *views)`` (zero-filled: padding bytes are defined)."""
        spare = self.spare
        if not spare:
            # Made `CHUNK` at a time: reading an allocation's address costs more
            # than making it. Each item's views are of the chunk (their base).
            stride = self.nbytes
            chunk = max(1, min(self.CHUNK, self.CHUNK_BYTES // stride))
            raw = np.zeros(stride * chunk + ALIGN, np.uint8)
            address = raw.__array_interface__["data"][0]
            skip = align_up(address) - address
            for k in range(chunk):
                at = skip + k * stride
                spare.append((raw[at:at + stride].view(np.uint32),
                              *[raw[at + start:at + stop].view(dtype).reshape(shape)
                                for start, stop, shape, dtype in self.layouts]))
        try:
            return spare.pop()
        except IndexError:  # another thread took the last one meanwhile
            return self.new_item()

    def claim(self) -> tuple:
        """A free pooled item, else a new one (pooled while under the cap)."""
        free = self.free
        for _ in range(len(free)):
            try:
                item = free.popleft()
            except IndexError:
                break
            if sys.getrefcount(item[0]) == self.FREE_REFCOUNT:
                return item
            free.append(item)  # still read by an array or a computation
        item = self.new_item()
        if self.made >= self.cap:
            return (*item, None)  # unpooled: marked by a trailing None
        self.made += 1
        return item

    def release(self, item: tuple) -> None:
        """Puts a claimed item back (the runtime's reference marks it busy)."""
        if item[-1] is not None:
            self.free.append(item)

    def clear(self) -> None:
        """Lets go of the free buffers; those in use come back when released."""
        self.free.clear()
        self.spare.clear()
        self.made = 0
