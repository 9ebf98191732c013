"""Numpy arrays and scalars onto any sharding, sliced on the host.

Per (sharding, shape, dtype, weak_type) a `ShardingPlan` is built once and
cached: each addressable device's index domain, the devices grouped by
distinct domain (replicas), and where each distinct shard sits in one
64-byte-aligned staging buffer. Per call a plan only allocates that buffer,
gathers every distinct shard into it once (the Numba kernel for column-major
sources, numpy's memcpy-speed copy otherwise: whichever measured faster), and
makes one batched transfer (`batched_device_put`), handing every replica of
a domain the same staging view.

Dispatcher contract: `plan_for(sharding, shape, dtype)` once per cache entry
(None: use JAX's own shard_args for that argument), then per call
`plan.put(np.asarray(x, dtype))`, an implicit transfer (transfer guards apply
as to jax.jit's). `device_put` is the public, explicit-transfer entry.

The staging buffer is owned by the transfer: on CPU the runtime may use it
in place (zero copy) and the caller's numpy array is never aliased, so
mutating it after the call never changes the result. It is fresh per call,
except from STAGING_POOL_MIN_BYTES: a pooled buffer is reused only once its
reference count shows that nothing (no live array, no transfer) holds it.
From PARALLEL_COPY_MIN_BYTES the copy into it runs on several threads.

Anything a plan cannot do exactly (an unsupported sharding, dtype or layout,
a shape the sharding does not divide, a numpy subclass) goes to
`jax.device_put`, which gives upstream's result or raises upstream's
exception; nothing is cached for it.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from nbjit import _jax

_ALIGN = 64  # bytes; the CPU client uses host memory in place when aligned to this
_PLAN_CACHE_SIZE = 4096
_SCALAR_TYPES = (bool, int, float, complex)

# Big arrays: from PARALLEL_COPY_MIN_BYTES the copy into staging is split
# into chunks of about _COPY_CHUNK_BYTES that this thread and up to
# _COPY_THREADS - 1 copy threads claim (below it the handoff costs more than
# it saves), and staging buffers from STAGING_POOL_MIN_BYTES are reused once
# the runtime has let go of them (a fresh buffer is memory the kernel faults
# in and zeroes; two threads faulting a fresh buffer were erratic, so both
# thresholds are equal). The measurements behind both thresholds:
# docs/performance.md#measured-constants-behind-the-code.
PARALLEL_COPY_MIN_BYTES = 8 << 20
STAGING_POOL_MIN_BYTES = 8 << 20
_STAGING_POOL_PER_SIZE = 2  # buffers kept per staging size (double buffering)
_STAGING_POOL_MAX_BYTES = 512 << 20  # all pooled buffers together
_COPY_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else (os.cpu_count() or 1)))

_COPY_CHUNK_BYTES = 2 << 20  # the copy threads claim chunks of about this size
_MAX_COPY_CHUNKS = 64

SINGLE_DEVICE_PLAN_MIN_BYTES = 20 << 20
"""From this many bytes a numpy input bound for one device is better sent
through `plan_for(SingleDeviceSharding(d), shape, dtype).put(x)` (aligned
pooled staging, filled by the parallel copy, used in place) than through a
plain `batched_device_put` of the input (the runtime copies a misaligned
input itself); below it the plan measured slower than the plain put.
Measured as put + jitted `a * 2`, plan against plain; the ratios are in
docs/performance.md#measured-constants-behind-the-code."""

_kernels = None  # nbjit._kernels, imported on first plan (importing numba is not cheap)
_kernels_lock = threading.Lock()


def _load_kernels():
    global _kernels
    if _kernels is None:
        with _kernels_lock:
            if _kernels is None:
                from nbjit import _kernels as kernels

                _kernels = kernels
    return _kernels


def warm_kernels() -> None:
    """Imports numba and loads (or, cold, compiles) the plan kernels now.

    The first plan otherwise pays this on first use: numba's import and
    target initialisation (warm), plus compilation (cold, much longer);
    docs/performance.md, "Numba kernels: first-call cost".
    """
    kernels = _load_kernels()
    domains = kernels.index_domains(np.array([8], np.int64), np.array([2], np.int64),
                                    np.zeros((1, 1), np.int64), np.zeros((2, 1), np.int64))
    kernels.group_replicas(domains)


def _gatherable_dtype(dtype: np.dtype) -> bool:
    """Numeric dtypes JAX takes whose items the gather kernel can move."""
    if dtype.itemsize not in (1, 2, 4, 8) or not dtype.isnative:
        return False  # (upstream rejects non-native byte orders: leave it the error)
    if dtype.kind in "biufc":
        return True
    # ml_dtypes: bfloat16 and the float8 family (not int4/float4: packed in JAX).
    return dtype.name == "bfloat16" or dtype.name.startswith("float8")


class ShardingPlan:
    """How to slice one (shape, dtype) numpy array onto one sharding.

    Invariants: `domains[i]` is the [start, stop) per dimension of
    `devices[i]`'s shard, equal to `sharding.addressable_devices_indices_map`;
    devices with equal domains share one group, and each group's shard is
    gathered once per call.
    """

    __slots__ = ("sharding", "shape", "dtype", "weak_type", "aval", "devices", "domains",
                 "group_of_device", "_starts", "_stops", "_elem_offsets", "_byte_offsets",
                 "_shard_shapes", "_nbytes", "_uint", "_slices", "_kernel_ok", "_parts")

    def __init__(self, sharding, shape: tuple[int, ...], dtype: np.dtype, weak_type: bool,
                 devices: list, domains: np.ndarray):
        kernels = _load_kernels()
        self.sharding = sharding
        self.shape = shape
        self.dtype = dtype
        self.weak_type = weak_type
        self.aval = _jax.aval_with_sharding(
            _jax.ShapedArray(shape, dtype, weak_type=weak_type), sharding)
        self.devices = devices
        self.domains = domains
        group_of_device, first_device = kernels.group_replicas(domains)
        self.group_of_device = group_of_device.tolist()
        n_groups = len(first_device)
        lows = domains[first_device, :, 0]
        highs = domains[first_device, :, 1]
        # The Numba gather works in GATHER_RANK dimensions (leading ones padded).
        self._kernel_ok = len(shape) <= kernels.GATHER_RANK
        if self._kernel_ok:
            pad = kernels.GATHER_RANK - len(shape)
            self._starts = np.zeros((n_groups, kernels.GATHER_RANK), np.int64)
            self._stops = np.ones((n_groups, kernels.GATHER_RANK), np.int64)
            self._starts[:, pad:] = lows
            self._stops[:, pad:] = highs
        itemsize = dtype.itemsize
        shard_shapes, byte_offsets = [], []
        offset = 0
        for g in range(n_groups):
            shard_shape = tuple(int(n) for n in highs[g] - lows[g])
            shard_shapes.append(shard_shape)
            byte_offsets.append(offset)
            nbytes = int(np.prod(shard_shape, dtype=np.int64)) * itemsize
            offset += -(-nbytes // _ALIGN) * _ALIGN
        self._shard_shapes = shard_shapes
        self._byte_offsets = byte_offsets
        self._elem_offsets = np.array(byte_offsets, np.int64) // itemsize
        self._nbytes = offset
        self._uint = kernels.gather_view_dtype(dtype)
        self._slices = [tuple(slice(int(a), int(b)) for a, b in domains[f]) for f in first_device]
        self._parts = None
        if _COPY_THREADS > 1 and self._nbytes >= PARALLEL_COPY_MIN_BYTES:
            n_chunks = min(_MAX_COPY_CHUNKS, max(2, self._nbytes // _COPY_CHUNK_BYTES))
            self._parts = _split_copy(lows, highs, byte_offsets, itemsize, n_chunks,
                                      kernels.GATHER_RANK if self._kernel_ok else None)

    @property
    def parallel(self) -> bool:
        """Whether `put` splits the copy into staging over several threads."""
        return self._parts is not None

    def put(self, x: np.ndarray) -> jax.Array:
        """`x` (an ndarray of exactly `shape` and `dtype`, any strides) as a
        committed jax.Array with `sharding`. `x` is read, never aliased."""
        raw = _staging_buffer(self._nbytes + _ALIGN)
        skip = -raw.__array_interface__["data"][0] % _ALIGN
        staging = raw[skip:skip + self._nbytes]
        dtype = self.dtype
        shards = [np.ndarray(s, dtype, buffer=staging, offset=o)
                  for s, o in zip(self._shard_shapes, self._byte_offsets, strict=True)]
        flags = x.flags
        # Column-major sources: the Numba gather beats numpy's copy.
        # Row-major and other strides: numpy's per-shard copy runs at memcpy
        # speed and, with <= 8 shards, costs less than one Numba call even at
        # 64x64 (bench_kernels.Gather).
        kernel = flags.f_contiguous and not flags.c_contiguous and self._kernel_ok
        if self._parts is not None:
            _parallel_copy(self._parts, x, staging, dtype, self._uint, kernel)
        elif kernel:
            _kernels.gather_strided(x, self._starts, self._stops, self._elem_offsets,
                                    staging.view(self._uint))
        else:
            for shard, index in zip(shards, self._slices, strict=True):
                np.copyto(shard, x[index])
        per_device = [shards[g] for g in self.group_of_device]
        return _jax.batched_device_put(self.aval, self.sharding, per_device, self.devices, True)


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


def _split_copy(lows: np.ndarray, highs: np.ndarray, byte_offsets: list[int], itemsize: int,
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
    target = -(-total // n_parts)
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
                _executor = ThreadPoolExecutor(_COPY_THREADS - 1,
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
        self.args = args
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
                parts[i].copy(*self.args)
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


def _parallel_copy(parts: list[_CopyPart], x: np.ndarray, staging: np.ndarray,
                   dtype: np.dtype, uint: type, kernel: bool) -> None:
    """Every chunk copied by this thread and the copy threads together (numpy's
    copy and the Numba gather release the GIL)."""
    run = _CopyRun(parts, (x, staging, dtype, uint, kernel))
    try:
        executor = _copy_executor()
        for _ in range(_COPY_THREADS - 1):
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


def _staging_buffer(size: int) -> np.ndarray:
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


class HostStaging:
    """Small staging buffers of one layout, for one packed record's host leaves.

    The same rule as the big buffers above: a buffer is overwritten only
    when, right after `collect_garbage()` (each call runs one first), no
    one but the pool holds it (with zero copy the runtime holds one
    reference to the array it was given for as long as any device buffer,
    computation or view reads that memory). Each item is
    ``(staging, *slot views)``: the staging array is a 64-byte-aligned view
    of its allocation, the slot views are views of that allocation too, so
    a reference to the staging array itself is the runtime's alone.

    `free` is claimed with ``popleft`` and refilled with ``append`` (atomic
    under the GIL: two threads never fill one buffer). At most `cap`
    buffers are pooled; beyond, each call gets a fresh, unpooled buffer
    (never reused, so never overwritten while read).
    """

    __slots__ = ("nbytes", "slots", "cap", "free", "made", "spare", "__weakref__")

    CHUNK = 16  # items allocated at once

    # A free item's staging array as `getrefcount(item[0])` sees it: the
    # item tuple's reference and the call's argument.
    FREE_REFCOUNT = 2

    def __init__(self, nbytes: int, slots: list[tuple[int, tuple[int, ...], np.dtype]],
                 cap: int) -> None:
        self.nbytes = nbytes
        self.slots = [(offset, offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                       shape, dtype) for offset, shape, dtype in slots]  # (start, stop, ...)
        self.cap = cap
        self.free: collections.deque = collections.deque()
        self.made = 0  # buffers pooled so far
        self.spare: list = []  # made, never used yet
        with _pool_lock:
            _host_stagings.add(self)

    def new_item(self) -> tuple:
        """A fresh ``(staging, *views)`` (zero-filled: padding bytes are defined)."""
        spare = self.spare
        if not spare:
            # Made `CHUNK` at a time: reading an allocation's address costs more
            # than making it. Each item's views are of the chunk (their base).
            stride = self.nbytes
            raw = np.zeros(stride * self.CHUNK + _ALIGN, np.uint8)
            skip = -raw.__array_interface__["data"][0] % _ALIGN
            for k in range(self.CHUNK):
                at = skip + k * stride
                spare.append((raw[at:at + stride],
                              *[raw[at + start:at + stop].view(dtype).reshape(shape)
                                for start, stop, shape, dtype in self.slots]))
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


_host_stagings: weakref.WeakSet[HostStaging] = weakref.WeakSet()


def host_staging_size() -> int:
    """Pooled small staging buffers of packed records (free or in use)."""
    with _pool_lock:
        return sum(s.made for s in _host_stagings)


def clear_staging_pool() -> None:
    """Lets go of every pooled staging buffer (arrays using one keep it alive)."""
    global _pool_bytes
    with _pool_lock:
        _pool.clear()
        _pool_bytes = 0
        for staging in _host_stagings:
            staging.clear()


def staging_pool_size() -> int:
    """Pooled staging buffers (free or in use)."""
    return sum(len(b) for b in _pool.values())


def _unsupported(_reason: str) -> None:
    return None


def _named_mesh(sharding, ndim: int):
    """`_mesh_description`'s (mesh_shape, axes per dim, coords, flat devices) of a NamedSharding."""
    spec = sharding.spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        return _unsupported("unreduced/reduced axes")
    mesh = sharding.mesh
    names = list(mesh.axis_names)
    entries = list(spec) + [None] * (ndim - len(spec))
    if len(entries) != ndim:
        return None
    axes_per_dim = []
    for entry in entries:
        if entry is None:
            axes_per_dim.append(())
        elif isinstance(entry, str):
            axes_per_dim.append((names.index(entry),))
        elif isinstance(entry, tuple) and all(isinstance(a, str) for a in entry):
            axes_per_dim.append(tuple(names.index(a) for a in entry))
        else:
            return _unsupported("unconstrained or unknown spec entry")
    flat_devices = list(mesh.devices.flat)
    coords = np.stack(np.unravel_index(np.arange(len(flat_devices)), mesh.devices.shape),
                      axis=1).astype(np.int64)
    return np.array(mesh.devices.shape, np.int64), axes_per_dim, coords, flat_devices


def _gspmd_mesh(sharding, ndim: int):
    """The same for a GSPMDSharding: replicated, or tiled (optionally replicated over
    the last tile dimension)."""
    hlo = sharding._hlo_sharding
    assignment = list(sharding._device_assignment)
    if _jax.hlo_is_replicated(hlo):
        return (np.array([len(assignment)], np.int64), [()] * ndim,
                np.arange(len(assignment), dtype=np.int64)[:, None], assignment)
    if hlo.is_manual() or hlo.is_unreduced() or hlo.is_maximal():
        return _unsupported("manual/unreduced/maximal HloSharding")
    tile_dims = list(hlo.tile_assignment_dimensions())
    subgroups = list(hlo.subgroup_types())
    n_extra = len(tile_dims) - ndim
    replicated_last = hlo.replicate_on_last_tile_dim() or (
        subgroups == [_jax.OP_SHARDING_REPLICATED])
    if not (n_extra == 0 and not subgroups) and not (n_extra == 1 and replicated_last):
        return _unsupported("tile assignment with other subgroups")
    positions = list(hlo.tile_assignment_devices())
    coords = np.stack(np.unravel_index(np.arange(len(positions)), tile_dims),
                      axis=1).astype(np.int64)
    return (np.array(tile_dims, np.int64), [(d,) for d in range(ndim)], coords,
            [assignment[p] for p in positions])


def _mesh_description(sharding, ndim: int):
    """(mesh_shape, dim_axes, device_coords by flat device position, flat devices) or None."""
    if isinstance(sharding, _jax.NamedSharding):
        described = _named_mesh(sharding, ndim)
    elif isinstance(sharding, _jax.SingleDeviceSharding):
        described = (np.ones(1, np.int64), [()] * ndim, np.zeros((1, 1), np.int64),
                     list(sharding.device_set))
    elif _jax.GSPMDSharding is not None and isinstance(sharding, _jax.GSPMDSharding):
        described = _gspmd_mesh(sharding, ndim)
    else:
        return _unsupported("sharding type")
    if described is None:
        return None
    mesh_shape, axes_per_dim, coords, flat_devices = described
    width = max([1] + [len(a) for a in axes_per_dim])
    dim_axes = np.full((ndim, width), -1, np.int64)
    for d, axes in enumerate(axes_per_dim):
        dim_axes[d, :len(axes)] = axes
    return mesh_shape, dim_axes, coords, flat_devices


def addressable_index_domains(sharding, shape: tuple[int, ...]):
    """(addressable devices, int64[n_dev, ndim, 2] domains) or None if unsupported.

    Devices are in `sharding`'s addressable device assignment order (the
    order `batched_device_put` takes). The shape must already be valid for
    the sharding (see `plan_for`).
    """
    described = _mesh_description(sharding, len(shape))
    if described is None:
        return None
    mesh_shape, dim_axes, coords, flat_devices = described
    devices = list(_jax.addressable_device_assignment(sharding))
    position = {d: i for i, d in enumerate(flat_devices)}
    if len(position) != len(flat_devices) or any(d not in position for d in devices):
        return None
    device_coords = np.ascontiguousarray(coords[[position[d] for d in devices]])
    kernels = _load_kernels()
    domains = kernels.index_domains(np.array(shape, np.int64), mesh_shape, dim_axes,
                                    device_coords)
    return devices, domains


_plans: dict[tuple, ShardingPlan | None] = {}
_plans_lock = threading.Lock()


def plan_for(sharding, shape: tuple[int, ...], dtype: np.dtype,
             weak_type: bool = False) -> ShardingPlan | None:
    """The cached plan for numpy arrays of `shape` and (canonical) `dtype`.

    None when nbjit cannot slice this case itself (unsupported sharding type,
    memory kind or dtype; a shape the sharding rejects): use `jax.device_put`
    (or JAX's own shard_args), which gives upstream's result or exception.
    Only successful plans are cached; a rejected combination is recomputed
    (and rejected again) on every call, so errors stay upstream's.
    """
    dtype = np.dtype(dtype)
    key = (sharding, shape, dtype, weak_type)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    plan = _build_plan(sharding, shape, dtype, weak_type)
    if plan is not None:
        with _plans_lock:
            if len(_plans) >= _PLAN_CACHE_SIZE:
                _plans.clear()
            _plans[key] = plan
    return plan


def _build_plan(sharding, shape, dtype, weak_type) -> ShardingPlan | None:
    if not _gatherable_dtype(dtype):
        return None
    if getattr(sharding, "memory_kind", None) not in (None, "device"):
        return None
    try:
        sharding.shard_shape(shape)  # JAX's own rank and divisibility checks
    except Exception:
        return None
    found = addressable_index_domains(sharding, shape)
    if found is None:
        return None
    devices, domains = found
    return ShardingPlan(sharding, shape, dtype, weak_type, devices, domains)


def clear_plans() -> None:
    """Drops every cached plan and lets go of the pooled staging buffers."""
    with _plans_lock:
        _plans.clear()
    clear_staging_pool()


def plan_cache_size() -> int:
    return len(_plans)


def _canonical_scalar(x) -> tuple[np.ndarray, bool] | None:
    """A Python scalar as (0-d canonical ndarray, weak_type), or None to defer to JAX."""
    dtype = np.dtype(jax.dtypes.result_type(x))
    if type(x) is int:
        info = np.iinfo(dtype)
        if not info.min <= x <= info.max:
            return None  # upstream raises OverflowError
    return np.asarray(x, dtype), type(x) is not bool


def device_put(x: Any, device: Any = None, **kwargs: Any) -> jax.Array:
    """`jax.device_put(x, device)` for numpy arrays and numpy/Python scalars.

    `device` is a `jax.sharding.Sharding` (NamedSharding, GSPMDSharding,
    SingleDeviceSharding). Same shards, devices, data, sharding, dtype, weak
    type and committedness as upstream, and the transfer counts as explicit
    for transfer guards; the numpy input is copied, never aliased (upstream
    aliases 64-byte-aligned inputs on CPU when it can). Anything else (jax
    Arrays, pytrees, a Device or None, keyword options such as `donate` or
    `may_alias`) and anything a plan cannot handle goes to `jax.device_put`
    unchanged.
    """
    sharding = device
    if kwargs:
        return jax.device_put(x, device, **kwargs)
    kind = type(x)
    if kind is np.ndarray:
        weak_type = False
    elif kind in _SCALAR_TYPES:
        scalar = _canonical_scalar(x)
        if scalar is None:
            return jax.device_put(x, sharding)
        x, weak_type = scalar
    elif isinstance(x, np.generic):
        x, weak_type = np.asarray(x), False
    else:
        return jax.device_put(x, sharding)
    if not isinstance(sharding, jax.sharding.Sharding) or not _gatherable_dtype(x.dtype):
        return jax.device_put(x, sharding)
    dtype = np.dtype(_jax.canonicalize_dtype(x.dtype))
    plan = plan_for(sharding, x.shape, dtype, weak_type)
    if plan is None:
        return jax.device_put(x, sharding)
    if x.dtype != dtype:
        x = x.astype(dtype)
    with _jax.explicit_device_put_scope():  # transfer guards see an explicit transfer
        return plan.put(x)
