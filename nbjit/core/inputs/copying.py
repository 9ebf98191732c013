"""Copies into host staging buffers: the plans' gather, split over threads for big arrays.

A `ShardingPlan` (`nbjit.core.inputs.plans`) gathers a numpy array's
shards into one staging buffer per call. Column-major sources are gathered
by a Numba kernel once numba is loaded (`load_kernels`; the first call that
wants it starts the load on a thread and copies with numpy meanwhile:
`kernels_or_background`); from PARALLEL_COPY_MIN_BYTES the copy is cut into
chunks that this thread and the copy threads claim (`copy_parts`,
`split_copy`, `parallel_copy`). The buffers themselves come from a pool
(`nbjit.core.inputs.pools`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from nbjit.core.inputs.fallbacks import gave_up

__all__ = ["COPY_THREADS", "PARALLEL_COPY_MIN_BYTES", "copy_parts", "kernels_or_background",
           "load_kernels", "parallel_copy", "split_copy"]

# Big arrays: from PARALLEL_COPY_MIN_BYTES the copy into staging is split
# into chunks of about _COPY_CHUNK_BYTES that this thread and up to
# COPY_THREADS - 1 copy threads claim (below it the handoff costs more than
# it saves). It equals the pools' STAGING_POOL_MIN_BYTES: two threads
# faulting in a fresh buffer were erratic. The measurements behind it:
# docs/performance.md#measured-constants-behind-the-code.
PARALLEL_COPY_MIN_BYTES = 8 << 20
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
    except Exception as error:  # numpy's copy goes on (a direct load_kernels raises it)
        gave_up("numba gather", error)


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

