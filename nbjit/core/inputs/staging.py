"""Host staging buffers: the copy into them and the pools that reuse them.

A `ShardingPlan` (`nbjit.core.inputs.plans`) gathers a numpy array's shards into one
64-byte-aligned staging buffer per call (`staging_buffer`; from
PARALLEL_COPY_MIN_BYTES the copy is split into chunks several threads
claim, `split_copy` / `parallel_copy`); a staged leaf copies into the
private buffers of its `StagingRing`. A pool reuses a buffer only once its
reference count shows that nothing else (no live array, no transfer) holds
it; pools made above the core (packed host inputs', `nbjit.host.staging`)
are cleared with these (`add_staging_pool`).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from nbjit._common import ALIGN, align_up
from nbjit.core.inputs.stream import STREAM_MIN_BYTES, stream_copy

__all__ = ["PARALLEL_COPY_MIN_BYTES", "STAGING_POOL_MIN_BYTES", "StagingRing",
           "add_staging_pool", "clear_staging_pool", "copy_parts", "immutable",
           "kernels_or_background",
           "load_kernels", "parallel_copy", "split_copy",
           "staging_buffer", "staging_pool_size", "aligned_empty"]

# Big arrays: from PARALLEL_COPY_MIN_BYTES the copy into staging is split
# into chunks of about _COPY_CHUNK_BYTES that this thread and up to
# COPY_THREADS - 1 copy threads claim (below it the handoff costs more than
# it saves), and staging buffers from STAGING_POOL_MIN_BYTES are reused once
# the runtime has let go of them (a fresh buffer is memory the kernel faults
# in and zeroes; two threads faulting a fresh buffer were erratic, so both
# thresholds are equal). The measurements behind both thresholds:
# docs/performance.md#measured-constants-behind-the-code.
PARALLEL_COPY_MIN_BYTES = 8 << 20
STAGING_POOL_MIN_BYTES = 8 << 20
_STAGING_POOL_PER_SIZE = 2  # buffers kept per staging size (double buffering)
_STAGING_POOL_MAX_BYTES = 512 << 20  # all pooled buffers together
COPY_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else (os.cpu_count() or 1)))

_COPY_CHUNK_BYTES = 2 << 20  # the copy threads claim chunks of about this size
_MAX_COPY_CHUNKS = 64


_kernels: Any = None  # nbjit._kernels once loaded
_kernels_lock = threading.Lock()


def load_kernels() -> Any:
    """The Numba kernels (`nbjit._kernels`), imported on first use: the import
    is deferred to here because importing numba is not cheap, and a process
    that never builds a plan should not pay it."""
    global _kernels
    if _kernels is None:
        with _kernels_lock:
            if _kernels is None:
                from nbjit import _kernels as kernels

                _kernels = kernels
    return _kernels


_loader: threading.Thread | None = None


def kernels_or_background() -> Any:
    """The kernels if loaded, else None after starting their load on a thread.

    For a copy the Numba gather only speeds up (a column-major source):
    the call that first wants it copies with numpy instead of waiting for
    numba's import (hundreds of milliseconds in a fresh process), and a
    later call uses the kernel once the thread has loaded it.
    """
    global _loader
    if _kernels is not None:
        return _kernels
    if _loader is None:
        with _kernels_lock:
            if _loader is None:
                _loader = threading.Thread(target=_load_quietly, name="nbjit-load-kernels",
                                           daemon=True)
                _loader.start()
    return None


def _load_quietly() -> None:
    try:
        load_kernels()
    except Exception:  # (numpy's copy goes on; a direct load_kernels raises it)
        pass


def aligned_empty(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialised bytes starting at a multiple of `ALIGN` (a view
    of a slightly bigger allocation)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    address = raw.__array_interface__["data"][0]
    skip = align_up(address) - address
    return raw[skip:skip + nbytes]


class _CopyPart:
    """One thread's share of a plan's copy into staging: row ranges of shards.

    `pieces`: (source index, destination shape, byte offset in staging) for
    numpy's copy; `starts`/`stops`/`offsets`: the same pieces for the Numba
    gather (None when the rank exceeds its GATHER_RANK).
    """

    __slots__ = ("pieces", "starts", "stops", "offsets")

    def __init__(self, pieces: list, rank: int | None, itemsize: int):
        self.pieces = [(tuple(slice(a, b) for a, b in zip(lo, hi, strict=True)),
                        tuple(b - a for a, b in zip(lo, hi, strict=True)), off)
                       for lo, hi, off in pieces]
        self.starts = self.stops = self.offsets = None
        if rank is not None:
            n = len(pieces)
            self.starts = np.zeros((n, rank), np.int64)
            self.stops = np.ones((n, rank), np.int64)
            for i, (lo, hi, _) in enumerate(pieces):
                self.starts[i, rank - len(lo):] = lo
                self.stops[i, rank - len(hi):] = hi
            self.offsets = np.array([off // itemsize for _, _, off in pieces], np.int64)

    def copy(self, x: np.ndarray, staging: np.ndarray, dtype: np.dtype, uint: type,
             kernel: bool) -> None:
        if kernel:
            _kernels.gather_strided(x, self.starts, self.stops, self.offsets, staging.view(uint))
        else:
            for index, shape, offset in self.pieces:
                np.copyto(np.ndarray(shape, dtype, buffer=staging, offset=offset), x[index])


def copy_parts(nbytes: int, lows: np.ndarray, highs: np.ndarray, byte_offsets: list[int],
               itemsize: int, rank: int | None) -> list[_CopyPart] | None:
    """A plan's copy into `nbytes` of staging as parts for several threads, or
    None where one thread copies it all (small, or one copy thread)."""
    if COPY_THREADS <= 1 or nbytes < PARALLEL_COPY_MIN_BYTES:
        return None
    n_parts = min(_MAX_COPY_CHUNKS, max(2, nbytes // _COPY_CHUNK_BYTES))
    return split_copy(lows, highs, byte_offsets, itemsize, n_parts, rank)


def split_copy(lows: np.ndarray, highs: np.ndarray, byte_offsets: list[int], itemsize: int,
               n_parts: int, rank: int | None) -> list[_CopyPart] | None:
    """The distinct shards' copy cut into (at most) `n_parts` parts of about
    equal bytes.

    Each shard is cut along its first dimension longer than 1 (its row-major
    block in staging stays contiguous per piece). None when it cannot be cut.
    """
    shards = []
    total = 0
    for lo, hi, off in zip(lows.tolist(), highs.tolist(), byte_offsets, strict=True):
        extents = [b - a for a, b in zip(lo, hi, strict=True)]
        axis = next((d for d, n in enumerate(extents) if n > 1), None)
        nbytes = int(np.prod(extents, dtype=np.int64)) * itemsize
        if nbytes == 0:
            continue
        if axis is None:
            return None
        row = nbytes // extents[axis]
        shards.append((lo, hi, off, axis, row))
        total += nbytes
    target = -(-total // n_parts)  # (a ceiling division, not an alignment)
    parts: list[list] = [[]]
    room = target
    for lo, hi, off, axis, row in shards:
        start = lo[axis]
        while start < hi[axis]:
            if room < row and parts[-1] and len(parts) < n_parts:
                parts.append([])
                room = target
            rows = min(hi[axis] - start, max(1, room // row))
            if len(parts) == n_parts:
                rows = hi[axis] - start  # the last part takes what is left
            piece_lo, piece_hi = list(lo), list(hi)
            piece_lo[axis], piece_hi[axis] = start, start + rows
            parts[-1].append((piece_lo, piece_hi, off + (start - lo[axis]) * row))
            room -= rows * row
            start += rows
    if len(parts) < 2:
        return None
    return [_CopyPart(p, rank, itemsize) for p in parts]


_executor: ThreadPoolExecutor | None = None
_executor_pid: int | None = None
_executor_lock = threading.Lock()


def _copy_executor() -> ThreadPoolExecutor:
    """The copy threads of this process (made again after a fork)."""
    global _executor, _executor_pid
    pid = os.getpid()
    if _executor is None or _executor_pid != pid:
        with _executor_lock:
            if _executor is None or _executor_pid != pid:
                _executor = ThreadPoolExecutor(COPY_THREADS - 1,
                                               thread_name_prefix="nbjit-staging-copy")
                _executor_pid = pid
    return _executor


class _CopyRun:
    """One call's chunks, claimed one at a time by this thread and the copy
    threads: a copy thread that gets no core in time claims nothing, and the
    caller waits only for chunks a copy thread has started."""

    __slots__ = ("parts", "args", "next", "busy", "error", "cond")

    def __init__(self, parts: list[_CopyPart], args: tuple):
        self.parts = parts
        self.args: tuple | None = args
        self.next = 0
        self.busy = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition(threading.Lock())

    def work(self) -> None:
        cond = self.cond
        parts = self.parts
        while True:
            with cond:
                i = self.next
                if i >= len(parts) or self.error is not None:
                    return
                self.next = i + 1
                self.busy += 1
            try:
                parts[i].copy(*self.args)  # type: ignore[misc]  # set while busy
            except BaseException as e:  # re-raised by the caller
                with cond:
                    self.error = e
            finally:
                with cond:
                    self.busy -= 1
                    if not self.busy:
                        cond.notify_all()

    def wait(self) -> None:
        with self.cond:
            while self.busy:
                self.cond.wait()
            # A copy thread that starts later claims nothing; its queued task
            # must not keep the staging buffer (or the caller's array) alive.
            self.args = None
        if self.error is not None:
            raise self.error


def parallel_copy(parts: list[_CopyPart], x: np.ndarray, staging: np.ndarray,
                   dtype: np.dtype, uint: type, kernel: bool) -> None:
    """Every chunk copied by this thread and the copy threads together (numpy's
    copy and the Numba gather release the GIL)."""
    run = _CopyRun(parts, (x, staging, dtype, uint, kernel))
    try:
        executor = _copy_executor()
        for _ in range(COPY_THREADS - 1):
            executor.submit(run.work)
    except RuntimeError:  # interpreter shutting down: this thread copies it all
        pass
    run.work()
    run.wait()


def _refcounts(buffers: list[np.ndarray]) -> list[int]:
    return [sys.getrefcount(raw) for raw in buffers]


# What `_refcounts` reports for a buffer that only its pool list holds.
_FREE_REFCOUNT = _refcounts([np.empty(1, np.uint8)])[0]
_pool: dict[int, list[np.ndarray]] = {}
_pool_bytes = 0
_pool_lock = threading.Lock()


def staging_buffer(size: int) -> np.ndarray:
    """A uint8 buffer of `size` bytes that nothing else uses.

    From STAGING_POOL_MIN_BYTES, one of the pooled buffers of that size that
    no live array holds any more (with zero copy the runtime keeps a
    reference to the staging array until its device buffer is freed; while
    a transfer reads it, too), else a fresh one, pooled while there is room.
    """
    global _pool_bytes
    if size < STAGING_POOL_MIN_BYTES:
        return np.empty(size, np.uint8)
    with _pool_lock:
        buffers = _pool.setdefault(size, [])
        for raw, count in zip(buffers, _refcounts(buffers), strict=True):
            if count == _FREE_REFCOUNT:
                return raw
        raw = np.empty(size, np.uint8)
        if len(buffers) < _STAGING_POOL_PER_SIZE and _pool_bytes + size <= _STAGING_POOL_MAX_BYTES:
            buffers.append(raw)
            _pool_bytes += size
        return raw


_rings: weakref.WeakSet[StagingRing] = weakref.WeakSet()  # (the class is below)
# Pools of staging buffers made above the core (packed host inputs':
# `nbjit.host.staging`), emptied with the core's own (`add_staging_pool`).
_other_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def add_staging_pool(pool: Any) -> None:
    """Has `clear_staging_pool` clear `pool` (anything with ``clear()``) too, while it lives."""
    with _pool_lock:
        _other_pools.add(pool)


def clear_staging_pool() -> None:
    """Lets go of every pooled staging buffer (arrays using one keep it alive)."""
    global _pool_bytes
    with _pool_lock:
        _pool.clear()
        _pool_bytes = 0
        for pool in _other_pools:
            pool.clear()
        for ring in _rings:
            ring.clear()


def staging_pool_size() -> int:
    """Pooled staging buffers (free or in use)."""
    return sum(len(b) for b in _pool.values())


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
    """Private copies of one host leaf, for zero-copy puts to a device with
    memory of its own (an accelerator).

    There a put of the caller's array reads it after the call returns (the
    transfer is asynchronous), so a write right after the call could change
    the result; a put that copies during the call waits for the transfer.
    A step instead copies the leaf into one of these buffers (`stage`) and
    puts that, zero copy: the call returns while the transfer runs, and no
    one but the runtime reads the buffer. The runtime keeps one reference to
    the buffer while anything may still read it, so a buffer is written
    again only when its reference count shows the ring's alone (the rule
    every staging pool here follows); with none free a new one is made,
    kept while the ring holds fewer than `cap`.

    `free` is rotated with ``popleft``/``append`` (atomic under the GIL: a
    buffer out of the deque is seen by one thread only); the buffer goes
    back before the put, which is safe because the caller's own reference
    (the put's argument) keeps its count above the free mark until the
    runtime holds its own.
    """

    __slots__ = ("shape", "dtype", "nbytes", "cap", "free", "made", "stream", "__weakref__")

    # A free buffer as `getrefcount(candidate)` sees it in `_claim`: the
    # deque, the local name and the call's argument.
    FREE_REFCOUNT = 3

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, cap: int) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self.cap = max(1, cap)
        self.free: collections.deque = collections.deque()
        self.made = 0
        # From STREAM_MIN_BYTES a same-dtype contiguous leaf is copied with
        # non-temporal stores (compiled here, at the miss that made the ring).
        self.stream = stream_copy() if self.nbytes >= STREAM_MIN_BYTES else None
        with _pool_lock:
            _rings.add(self)

    def _new(self) -> np.ndarray:
        return aligned_empty(self.nbytes).view(self.dtype).reshape(self.shape)

    def stage(self, x: Any) -> np.ndarray:
        """A private buffer holding `x` converted to the ring's dtype (numpy's
        ``astype`` conversion, as jaxlib's own of a host array); `x` itself
        where nothing can write it (`immutable`) and it needs no conversion;
        copied with non-temporal stores where the ring has them (`stream`)."""
        if not x.flags.writeable and x.dtype == self.dtype and immutable(x):
            return x
        buffer = self._claim()
        if (stream := self.stream) is not None and x.dtype == self.dtype and x.flags.c_contiguous:
            stream(buffer, x)
        else:
            np.copyto(buffer, x, casting="unsafe")
        return buffer

    def stage_scalar(self, x: Any) -> np.ndarray:
        """A private 0-d buffer holding scalar `x` (the caller checked that it
        converts exactly: `values.scalar_converts_exactly`)."""
        buffer = self._claim()
        buffer[()] = x
        return buffer

    def _claim(self) -> np.ndarray:
        """A buffer only the ring holds (or a new one)."""
        free = self.free
        buffer = None
        for _ in range(len(free)):
            try:
                candidate = free.popleft()
            except IndexError:
                break
            free.append(candidate)
            if sys.getrefcount(candidate) == self.FREE_REFCOUNT:
                buffer = candidate
                break
            del candidate
        if buffer is None:
            buffer = self._new()
            if self.made < self.cap:
                self.made += 1
                free.append(buffer)
        return buffer

    def clear(self) -> None:
        """Lets go of the ring's buffers (those a transfer reads stay alive there)."""
        self.free.clear()
        self.made = 0
