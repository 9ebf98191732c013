"""Meshes over the devices there are, for tests that need some devices, not eight.

The session has 8 host CPU devices (tests/conftest.py); a TPU v5e has one.
`DEVICES` are the most of JAX's default devices a mesh here spans (a power
of two, at most 8), and `mesh(rank)` lays them over `rank` axes named x, y,
z, doubling the axes in turn: 8 devices give (8,), (4, 2) and (2, 2, 2); one
gives axes of size 1, a sharding of one device.
"""

from __future__ import annotations

from typing import Any

import jax

_COUNT = 1 << (min(8, len(jax.devices())).bit_length() - 1)
DEVICES = tuple(jax.devices()[:_COUNT])
AXES = ("x", "y", "z")


def mesh_shape(rank: int) -> tuple[int, ...]:
    shape = [1] * rank
    for k in range(_COUNT.bit_length() - 1):
        shape[k % rank] *= 2
    return tuple(shape)


def mesh(rank: int, **kwargs: Any) -> jax.sharding.Mesh:
    """A mesh of `DEVICES` with `mesh_shape(rank)` over the first `rank` of `AXES`."""
    return jax.make_mesh(mesh_shape(rank), AXES[:rank], devices=DEVICES, **kwargs)
