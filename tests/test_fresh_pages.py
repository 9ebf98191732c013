"""Fresh host buffers of `pools.POPULATE_MIN_BYTES` and more have their pages
mapped at once (Linux's MAP_POPULATE), not faulted in by their first writes:
a staging ring's buffers and a miss's private copies on an accelerator."""

from __future__ import annotations

import mmap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs, steps_of

import nbjit
from nbjit.core.inputs import platforms as _platforms
from nbjit.core.inputs import pools as _pools
from nbjit.core.inputs import values as _values

populating = pytest.mark.skipif(not _pools._MAP_POPULATE, reason="no MAP_POPULATE here")


def _mapped(buffer: np.ndarray) -> bool:
    """Whether `buffer` lies in a mapping of its own (its base chain ends in an mmap)."""
    x = buffer
    while isinstance(x, np.ndarray):
        x = x.base
    return isinstance(x, memoryview) and isinstance(x.obj, mmap.mmap)


@populating
def test_big_buffers_are_mapped_at_once():
    n = _pools.POPULATE_MIN_BYTES
    big, small = _pools.aligned_empty(n + 8), _pools.aligned_empty(n - 8)
    assert big.nbytes == n + 8 and big.dtype == np.uint8 and big.flags.writeable
    assert big.ctypes.data % mmap.PAGESIZE == 0 and _mapped(big)
    assert small.nbytes == n - 8 and small.ctypes.data % 64 == 0 and not _mapped(small)
    big[:] = 7
    assert int(big.sum()) == 7 * (n + 8)


def test_a_failed_mapping_falls_back_to_malloc(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(_pools.mmap, "mmap", refuse)
    buffer = _pools.aligned_empty(_pools.POPULATE_MIN_BYTES * 2)
    assert buffer.nbytes == _pools.POPULATE_MIN_BYTES * 2 and buffer.ctypes.data % 64 == 0
    assert not _mapped(buffer)


@pytest.mark.parametrize("make", [
    lambda n: np.arange(n, dtype=np.float32).reshape(-1, 64),
    lambda n: np.asfortranarray(np.arange(n, dtype=np.int32).reshape(64, -1)),
    lambda n: (np.arange(n) % 3 == 0),
    lambda n: np.arange(2 * n, dtype=np.float32)[::2],
], ids=["float32 C", "int32 Fortran", "bool", "strided"])
def test_a_misss_big_private_copy_is_its_own(make):
    """On an accelerator (every array copied) a big leaf's private copy holds
    its values, dtype and shape, shares no memory with it, and is mapped at
    once where the system can."""
    x = make(_pools.POPULATE_MIN_BYTES)
    assert x.nbytes >= _pools.POPULATE_MIN_BYTES
    y = _values._private_leaf(x, True)
    assert y is not x and y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(y, x) and not np.shares_memory(x, y) and y.flags.writeable
    assert _mapped(y) == bool(_pools._MAP_POPULATE)
    x[...] = 0 if x.dtype != bool else False
    assert not np.array_equal(y, x)


def test_small_and_object_leaves_copy_as_before():
    small = np.ones(16, np.float32)
    copied = _values._private_leaf(small, True)
    assert copied is not small and copied.base is None
    rows = np.zeros(_pools.POPULATE_MIN_BYTES // 8, dtype=[("a", np.float32), ("b", np.int32)])
    assert _values._private_leaf(rows, True).base is None  # a structured dtype: numpy's copy


@populating
def test_a_big_leafs_ring_buffers_are_mapped_at_once(monkeypatch):
    monkeypatch.setitem(_platforms._plugged, jax.devices()[0].platform, _platforms.STAGED)
    n = _pools.POPULATE_MIN_BYTES // 4 + 16
    fn = lambda w, x: (jnp.sum(x) * w, x[::997] - 1.0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(1)
    w = jnp.float32(2.0)
    for _ in range(5):
        x = rng.standard_normal(n).astype(np.float32)
        assert_same_outputs(f(w, x), g(w, x))
    (host,) = steps_of(f, w, x)["HostInput"]
    ring = host.transfer.stage.__self__
    buffer = ring.pool.claim()
    ring.pool.release(buffer)
    assert _mapped(buffer) and buffer.shape == (n,) and buffer.dtype == np.float32
