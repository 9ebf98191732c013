"""Device-to-device transfer guards on a hit: nbjit does what jax.jit does.

jaxlib's fast path (`PrepareIfrtInputs` in pjit.cc) moves a one-device
jax.Array that sits on another device than the executable's with IFRT
`CopyArrays`, below the layer that applies transfer guards: a hit copies it
even inside `transfer_guard_device_to_device("disallow")`. Everything that
goes through JAX's Python (a miss, a resharding onto many devices) is
guarded. Each case is a differential check against jax.jit on two fresh
copies of one function; the first call (a miss) happens outside the guard.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_exception
from jax.sharding import Mesh, NamedSharding, PartitionSpec, make_single_device_sharding

import nbjit
from nbjit import _jax

pytestmark = pytest.mark.cpu_devices("device-to-device copies among devices 0-7")

LEVELS = ["disallow", "disallow_explicit", "log", "log_explicit"]


def _pair(**options) -> tuple[Callable, Callable]:
    """(nbjit.jit, jax.jit) of two fresh copies of the same function."""
    def make():
        return lambda x: x * 2
    return nbjit.jit(make(), **options), jax.jit(make(), **options)


def _hits_inside_guard(nb, jx, x, level: str, guard=jax.transfer_guard_device_to_device):
    assert_same_call(nb, jx, x)  # the miss, unguarded
    misses = nb.miss_count
    with guard(level):
        for _ in range(2):
            assert_same_call(nb, jx, x)
    assert nb.miss_count == misses, "the guarded calls were not hits"


def _assert_implicit_transfers_refused(x: jax.Array) -> None:
    """The guard still holds for JAX's own (Python) path after nbjit's hit."""
    fresh = jax.jit(lambda v: v - 1, in_shardings=make_single_device_sharding(jax.devices()[6]))
    with pytest.raises(Exception, match="[Dd]isallowed device-to-device"):
        fresh(x)


@pytest.mark.parametrize("level", LEVELS)
def test_uncommitted_array_copied_on_a_hit_ignores_the_guard(level):
    nb, jx = _pair(in_shardings=make_single_device_sharding(jax.devices()[1]))
    x = jnp.arange(4.0)  # uncommitted, on device 0
    assert not x._committed
    _hits_inside_guard(nb, jx, x, level)


@pytest.mark.parametrize("level", LEVELS)
def test_committed_array_on_the_wrong_device_copied_on_a_hit_ignores_the_guard(level):
    nb, jx = _pair(in_shardings=make_single_device_sharding(jax.devices()[1]))
    x = jax.device_put(jnp.arange(4.0), jax.devices()[2])
    assert x._committed
    _hits_inside_guard(nb, jx, x, level)


def test_global_guard_and_pytree_path():
    """Set with jax.config (global level), and a dict argument (nbjit's pytree path)."""
    third = make_single_device_sharding(jax.devices()[3])
    nb, jx = (nbjit.jit(lambda d: d["a"] + 1, in_shardings=third),
              jax.jit(lambda d: d["a"] + 1, in_shardings=third))
    x = {"a": jnp.arange(4.0)}
    assert_same_call(nb, jx, x)
    old = jax.config.jax_transfer_guard_device_to_device
    jax.config.update("jax_transfer_guard_device_to_device", "disallow")
    try:
        assert_same_call(nb, jx, x)
        _assert_implicit_transfers_refused(x["a"])
    finally:
        jax.config.update("jax_transfer_guard_device_to_device", old)


def test_the_guard_level_is_restored_after_a_hit():
    nb, jx = _pair(in_shardings=make_single_device_sharding(jax.devices()[1]))
    x = jnp.arange(4.0)
    nb(x)
    state = _jax._guard_thread_local()
    with jax.transfer_guard_device_to_device("disallow"):
        before = state.device_to_device
        nb(x)
        assert state.device_to_device == before
        _assert_implicit_transfers_refused(x)
    assert state.device_to_device is None


def test_a_miss_inside_the_guard_raises_as_upstream():
    nb, jx = _pair(in_shardings=make_single_device_sharding(jax.devices()[1]))
    with jax.transfer_guard_device_to_device("disallow"):
        e_nb, _ = assert_same_exception(nb, jx, jnp.arange(4.0))
    assert "isallowed device-to-device" in str(e_nb)


def test_resharding_onto_many_devices_stays_guarded():
    """Uncommitted one-device input to a NamedSharding: JAX's shard_args, guarded."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    nb, jx = _pair(in_shardings=NamedSharding(mesh, PartitionSpec("x")))
    x = jnp.arange(8.0)
    assert_same_call(nb, jx, x)
    with jax.transfer_guard_device_to_device("disallow"):
        e_nb, _ = assert_same_exception(nb, jx, x)
    assert "isallowed device-to-device" in str(e_nb)
    assert_same_call(nb, jx, x)
