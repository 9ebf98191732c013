"""Private copies of host leaves for an accelerator's transfers: `StagingRing`.

On a device with memory of its own a put of the caller's array reads it
after the call returns (the transfer is asynchronous), so a write right
after the call could change the result. A launch record
(`nbjit.core.inputs.launch`) instead hands jaxlib's put a private copy from
the leaf's `StagingRing`, or the caller's array itself where no one can
write it (`immutable`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from nbjit.core.inputs import stream as _stream
from nbjit.core.inputs.pools import BufferPool, aligned_empty
from nbjit.core.inputs.stream import STREAM_MIN_BYTES

__all__ = ["StagingRing", "immutable"]


def immutable(x: Any) -> bool:
    """Whether `x`'s memory is a numpy array's that no one can write: `x` and
    every array down its base chain not writeable, the last one owning its
    memory (or a `bytes` object owning it). Such an array needs no private
    copy: a write to it raises (one that turns its flag back on first is
    the caller's own act). A view of a writeable array, or of any other
    buffer (a bytearray, an mmap, ...), is not."""
    while type(x) is np.ndarray:
        if x.flags.writeable:
            return False
        if x.base is None:
            return True
        x = x.base
    return type(x) is bytes


class StagingRing:
    """Private copies of one host leaf (its shape and canonical dtype), for
    zero-copy puts to a device with memory of its own.

    A step copies the leaf into a buffer of the ring's pool (`stage`) and
    puts that, zero copy: the call returns while the transfer runs, and no
    one but the runtime reads the buffer. A buffer is written again only
    once nothing but its pool holds it (`nbjit.core.inputs.pools.BufferPool`);
    with none free a new one is made, kept while the pool keeps fewer than
    `cap`. A buffer goes back to the pool before it is written: this
    frame's reference, then the caller's (the put's argument), keep it
    from being claimed until the runtime holds its own.
    """

    __slots__ = ("shape", "dtype", "nbytes", "pool", "stream", "stream_pending")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, cap: int) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self.pool = BufferPool(self.nbytes, functools.partial(_aligned, shape, self.dtype), cap)
        # From STREAM_MIN_BYTES a same-dtype contiguous leaf is copied with
        # non-temporal stores, once their compile (begun now, on a thread of
        # its own) is done; numpy's copy until then.
        self.stream = None
        self.stream_pending = self.nbytes >= STREAM_MIN_BYTES
        if self.stream_pending:
            self._take_stream()

    def _take_stream(self) -> None:
        """The streamed copy, once its compile is done (none: numpy's copy for good)."""
        compiled = _stream.ready()
        if compiled is not _stream.PENDING:
            self.stream, self.stream_pending = compiled, False

    def stage(self, x: Any) -> np.ndarray:
        """A private buffer holding `x` converted to the ring's dtype (numpy's
        ``astype`` conversion, as jaxlib's own of a host array); `x` itself
        where nothing can write it (`immutable`) and it needs no conversion;
        copied with non-temporal stores where the ring has them (`stream`:
        numpy's copy while they compile)."""
        if not x.flags.writeable and x.dtype == self.dtype and immutable(x):
            return x
        pool = self.pool
        buffer = pool.claim()
        pool.release(buffer)
        if self.stream_pending:
            self._take_stream()
        if (stream := self.stream) is not None and x.dtype == self.dtype and x.flags.c_contiguous:
            stream(buffer, x)
        else:
            np.copyto(buffer, x, casting="unsafe")
        return buffer

    def stage_scalar(self, x: Any) -> np.ndarray:
        """A private 0-d buffer holding scalar `x` (the caller checked that it
        converts exactly: `values.scalar_converts_exactly`)."""
        pool = self.pool
        buffer = pool.claim()
        pool.release(buffer)
        buffer[()] = x
        return buffer


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised 64-byte-aligned array of `shape` and `dtype`."""
    return aligned_empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize).view(
        dtype).reshape(shape)
