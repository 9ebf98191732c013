"""Numpy arrays and scalars onto any sharding, sliced on the host.

Per (sharding, shape, dtype, weak_type) a `ShardingPlan` is built once and
cached: each addressable device's index domain, the devices grouped by
distinct domain (replicas), and where each distinct shard sits in one
64-byte-aligned staging buffer (built with numpy, `nbjit._domains`: no
numba). Per call a plan only allocates that buffer, gathers every distinct
shard into it once (the Numba kernel for column-major sources once numba is
loaded, on a thread of its own after the first such put; numpy's
memcpy-speed copy otherwise: whichever measured faster), and makes one
batched transfer (`batched_device_put`), handing every replica of a domain
the same staging view.

Dispatcher contract: `plan_for(sharding, shape, dtype)` once per cache entry
(None: use JAX's own shard_args for that argument), then per call
`plan.put(np.asarray(x, dtype))`, an implicit transfer (transfer guards apply
as to jax.jit's). `device_put` is the public, explicit-transfer entry.

The staging buffer is owned by the transfer: on CPU the runtime may use it
in place (zero copy) and the caller's numpy array is never aliased, so
mutating it after the call never changes the result. It is fresh per call,
except from STAGING_POOL_MIN_BYTES: a pooled buffer is reused only once
nothing but its pool (no live array, no transfer) holds it
(`nbjit.core.inputs.pools`). From PARALLEL_COPY_MIN_BYTES the copy into it
runs on several threads (`nbjit.core.inputs.copying`).

Anything a plan cannot do exactly (an unsupported sharding, dtype or layout,
a shape the sharding does not divide, a numpy subclass) goes to
`jax.device_put`, which gives upstream's result or raises upstream's
exception; nothing is cached for it.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np

from nbjit import _domains, _jax
from nbjit._common import ALIGN, PYTHON_SCALARS, align_up
from nbjit.core.inputs.copying import (
    copy_parts,
    kernels_or_background,
    load_kernels,
    parallel_copy,
)
from nbjit.core.inputs.pools import clear_staging_pool, staging_buffer

__all__ = ["SINGLE_DEVICE_PLAN_MIN_BYTES", "ShardingPlan", "addressable_index_domains",
           "clear_plans", "device_put", "plan_cache_size", "plan_for", "warm_kernels"]

_PLAN_CACHE_SIZE = 4096

SINGLE_DEVICE_PLAN_MIN_BYTES = 20 << 20
"""From this many bytes a numpy input bound for one device is better sent
through `plan_for(SingleDeviceSharding(d), shape, dtype).put(x)` (aligned
pooled staging, filled by the parallel copy, used in place) than through a
plain `batched_device_put` of the input (the runtime copies a misaligned
input itself); below it the plan measured slower than the plain put.
Measured as put + jitted `a * 2`, plan against plain; the ratios are in
docs/performance.md#measured-constants-behind-the-code."""


def warm_kernels() -> None:
    """Imports numba and loads (or, cold, compiles) the plan kernels now.

    Plans are built without them (`nbjit._domains`); only a
    column-major source's gather uses them, and the first such put starts
    their load on a thread and copies with numpy meanwhile. Call this to
    have them from the first put on: numba's import and target
    initialisation (warm), plus compilation (cold, much longer);
    docs/performance.md, "Numba kernels: first-call cost".
    """
    kernels = load_kernels()
    domains = kernels.index_domains(np.array([8], np.int64), np.array([2], np.int64),
                                    np.zeros((1, 1), np.int64), np.zeros((2, 1), np.int64))
    kernels.group_replicas(domains)
    x = np.zeros((2, 2), np.float32, order="F")
    kernels.gather_strided(x, np.zeros((1, _domains.GATHER_RANK), np.int64),
                           np.ones((1, _domains.GATHER_RANK), np.int64),
                           np.zeros(1, np.int64), np.empty(1, np.float32))


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
        self.sharding = sharding
        self.shape = shape
        self.dtype = dtype
        self.weak_type = weak_type
        self.aval = _jax.aval_with_sharding(
            _jax.ShapedArray(shape, dtype, weak_type=weak_type), sharding)
        self.devices = devices
        self.domains = domains
        group_of_device, first_device = _domains.group_replicas(domains)
        self.group_of_device = group_of_device.tolist()
        n_groups = len(first_device)
        lows = domains[first_device, :, 0]
        highs = domains[first_device, :, 1]
        # The Numba gather works in GATHER_RANK dimensions (leading ones padded).
        self._kernel_ok = len(shape) <= _domains.GATHER_RANK
        if self._kernel_ok:
            pad = _domains.GATHER_RANK - len(shape)
            self._starts = np.zeros((n_groups, _domains.GATHER_RANK), np.int64)
            self._stops = np.ones((n_groups, _domains.GATHER_RANK), np.int64)
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
            offset += align_up(nbytes)
        self._shard_shapes = shard_shapes
        self._byte_offsets = byte_offsets
        self._elem_offsets = np.array(byte_offsets, np.int64) // itemsize
        self._nbytes = offset
        self._uint = _domains.UINT_OF_ITEMSIZE[dtype.itemsize]  # (itemsize 1, 2, 4 or 8)
        self._slices = [tuple(slice(int(a), int(b)) for a, b in domains[f]) for f in first_device]
        self._parts = copy_parts(self._nbytes, lows, highs, byte_offsets, itemsize,
                                 _domains.GATHER_RANK if self._kernel_ok else None)

    @property
    def parallel(self) -> bool:
        """Whether `put` splits the copy into staging over several threads."""
        return self._parts is not None

    def put(self, x: np.ndarray) -> jax.Array:
        """`x` (an ndarray of exactly `shape` and `dtype`, any strides) as a
        committed jax.Array with `sharding`. `x` is read, never aliased."""
        raw = staging_buffer(self._nbytes + ALIGN)
        address = raw.__array_interface__["data"][0]
        skip = align_up(address) - address
        staging = raw[skip:skip + self._nbytes]
        dtype = self.dtype
        shards = [np.ndarray(s, dtype, buffer=staging, offset=o)
                  for s, o in zip(self._shard_shapes, self._byte_offsets, strict=True)]
        flags = x.flags
        # Column-major sources: the Numba gather beats numpy's copy (once
        # numba is loaded: until then numpy copies, see kernels_or_background).
        # Row-major and other strides: numpy's per-shard copy runs at memcpy
        # speed and, with <= 8 shards, costs less than one Numba call even at
        # 64x64 (bench_kernels.Gather).
        kernels = None
        if flags.f_contiguous and not flags.c_contiguous and self._kernel_ok:
            kernels = kernels_or_background()
        if self._parts is not None:
            parallel_copy(self._parts, x, staging, dtype, self._uint, kernels is not None)
        elif kernels is not None:
            kernels.gather_strided(x, self._starts, self._stops, self._elem_offsets,
                                   staging.view(self._uint))
        else:
            for shard, index in zip(shards, self._slices, strict=True):
                np.copyto(shard, x[index])
        per_device = [shards[g] for g in self.group_of_device]
        return _jax.batched_device_put(self.aval, self.sharding, per_device, self.devices, True)


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
    axes_per_dim: list[tuple[int, ...]] = []
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
    hlo, assignment = _jax.gspmd_parts(sharding)
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
    domains = _domains.index_domains(np.array(shape, np.int64), mesh_shape, dim_axes,
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
    elif kind in PYTHON_SCALARS:
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
