"""Fresh host buffers of `pools.POPULATE_MIN_BYTES` and more have their pages
mapped at once (Linux's MAP_POPULATE), not faulted in by their first writes:
a staging ring's buffers and a miss's private copies on an accelerator; and
a big leaf's ring has its first buffers made on a thread (`pools.prefill`)."""

from __future__ import annotations

import gc
import mmap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs, steps_of

import nbjit
from nbjit.core.inputs import platforms as _platforms
from nbjit.core.inputs import pools as _pools
from nbjit.core.inputs import staging as _staging
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


class _Made:
    """A pool's `make`, noting which thread made each buffer."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.threads: list[str] = []

    def __call__(self) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        return np.zeros(self.nbytes, np.uint8)


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_prefill_makes_a_pools_first_buffers_on_its_own_thread():
    made = _Made(4096)
    pool = _pools.BufferPool(4096, made, cap=5)
    _pools.prefill(pool, 3)
    assert _until(lambda: len(pool.free) == 3)
    assert made.threads == ["nbjit buffer prefill"] * 3 and pool.kept.count == 3
    claimed = [pool.claim() for _ in range(3)]  # (held: each claim takes another)
    assert len(made.threads) == 3  # none made by this thread
    assert len({id(b) for b in claimed}) == 3
    pool.release(claimed[0])
    assert len(pool.free) <= pool.kept.count


def test_prefill_stays_within_the_pools_cap():
    made = _Made(64)
    pool = _pools.BufferPool(64, made, cap=2)
    _pools.prefill(pool, 5)
    assert _until(lambda: len(pool.free) == 2)
    time.sleep(0.05)
    assert len(made.threads) == 2 and pool.kept.count == 2


def test_prefill_of_a_collected_pool_makes_nothing():
    made = _Made(64)
    pool = _pools.BufferPool(64, made, cap=4)
    _pools.prefill(pool, 0)  # (the thread is up)
    blocker = threading.Event()
    _pools._prefill_jobs().put((lambda: blocker.wait(5) and None, 0))  # holds the thread
    _pools.prefill(pool, 4)
    del pool
    gc.collect()
    blocker.set()
    done = _Made(64)
    last = _pools.BufferPool(64, done, cap=1)
    _pools.prefill(last, 1)
    assert _until(lambda: len(last.free) == 1)
    assert made.threads == []


def test_a_big_rings_first_buffers_are_made_ahead(monkeypatch):
    made = []
    real = _staging._aligned

    def aligned(shape, dtype):
        made.append(threading.current_thread().name)
        return real(shape, dtype)

    monkeypatch.setattr(_staging, "_aligned", aligned)
    n = _pools.POPULATE_MIN_BYTES // 4
    ring = _staging.StagingRing((n,), np.dtype(np.float32), 8)
    assert _until(lambda: len(ring.pool.free) == _staging.PREFILL_BUFFERS)
    x = np.arange(n, dtype=np.float32)
    staged = [ring.stage(x) for _ in range(_staging.PREFILL_BUFFERS)]
    assert all(np.array_equal(s, x) for s in staged)
    assert made == ["nbjit buffer prefill"] * _staging.PREFILL_BUFFERS
    small = _staging.StagingRing((16,), np.dtype(np.float32), 8)
    time.sleep(0.05)
    assert len(small.pool.free) == 0  # small buffers: made as claimed
