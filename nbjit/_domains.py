"""The plain twins of the plan kernels: index domains and replica groups, no numba.

A `ShardingPlan` (`nbjit.core.inputs.plans`) is built on the first call that puts
a numpy array onto its sharding. Importing numba and loading its kernels
costs hundreds of milliseconds in a fresh process, while the domains of a
few devices cost microseconds in numpy: so plans are built with these
twins, and numba is loaded only where its gather pays (column-major
sources, `nbjit.core.inputs.copying.kernels_or_background`). The kernels in
`nbjit._kernels` compute the same (tests/test_kernels.py compares them).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GATHER_RANK", "UINT_OF_ITEMSIZE", "gather_view_dtype", "group_replicas",
           "index_domains"]

GATHER_RANK = 4
"""Rank the gather kernel works in; lower ranks are padded with leading 1s."""

# The unsigned integer type the gather moves items of each size as.
UINT_OF_ITEMSIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def gather_view_dtype(dtype: np.dtype) -> type | None:
    """The unsigned integer type the gather works on for `dtype`, or None."""
    return UINT_OF_ITEMSIZE.get(np.dtype(dtype).itemsize)


def index_domains(global_shape: np.ndarray, mesh_shape: np.ndarray, dim_axes: np.ndarray,
                  device_coords: np.ndarray) -> np.ndarray:
    """[start, stop) per dimension of each device's shard (as `_kernels.index_domains`).

    global_shape: int64[ndim]; mesh_shape: int64[n_axes]; dim_axes:
    int64[ndim, k], the mesh axes sharding each dimension, major to minor,
    padded with -1; device_coords: int64[n_dev, n_axes]. Returns
    int64[n_dev, ndim, 2].
    """
    n_dev, ndim = device_coords.shape[0], global_shape.shape[0]
    n_shards = np.ones(ndim, np.int64)
    index = np.zeros((n_dev, ndim), np.int64)
    for j in range(dim_axes.shape[1]):
        axes = dim_axes[:, j]
        used = axes >= 0
        safe = np.where(used, axes, 0)
        sizes = np.where(used, mesh_shape[safe] if len(mesh_shape) else 1, 1)
        coords = np.where(used, device_coords[:, safe] if device_coords.shape[1] else 0, 0)
        n_shards = n_shards * sizes
        index = index * sizes + coords
    block = global_shape // np.maximum(n_shards, 1)
    out = np.empty((n_dev, ndim, 2), np.int64)
    out[:, :, 0] = index * block
    out[:, :, 1] = out[:, :, 0] + block
    return out


def group_replicas(domains: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numbers the distinct domains in order of first appearance.

    Returns (group_of_device int64[n_dev], first_device_of_group int64[n_groups]).
    """
    group_of: dict[tuple, int] = {}
    groups: list[int] = []
    first: list[int] = []
    for device, row in enumerate(domains.reshape(domains.shape[0], -1).tolist()):
        key = tuple(row)
        g = group_of.get(key)
        if g is None:
            g = group_of[key] = len(first)
            first.append(device)
        groups.append(g)
    return np.array(groups, np.int64), np.array(first, np.int64)
