"""Pools of host buffers (`nbjit.core.inputs.pools`): one rule, measured once.

A buffer is claimed again only when nothing but its pool holds it; the
reference count a free buffer shows is measured at import, on the Python
that runs, so these checks hold (and can fail) on every CPython the suite
runs on.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from nbjit.core.inputs import pools
from nbjit.core.inputs.pools import BufferPool

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pool(cap: int = 4, made: list | None = None) -> BufferPool:
    """A pool of 64-byte buffers; `made` gets one item per buffer it makes."""
    def make() -> np.ndarray:
        if made is not None:
            made.append(None)
        return np.empty(64, np.uint8)

    return BufferPool(64, make, cap)


def _reuse() -> tuple[bool, bool]:
    """(whether a buffer someone else holds was ever handed out, whether one
    only the pool held was reused every time), over many claims: the interpreter specializes
    `claim`'s code on the way, and the rule must hold before and after."""
    made: list = []
    pool = _pool(made=made)
    held = pool.claim()
    pool.release(held)  # released, but still held here (as a transfer holds it)
    handed_out, reused = False, True
    for _ in range(2000):
        buffer = pool.claim()
        handed_out |= buffer is held
        pool.release(buffer)
        again = pool.claim()  # `buffer` is still held here: another one
        handed_out |= again is buffer or again is held
        pool.release(again)
        del buffer, again
        before = len(made)
        free = pool.claim()  # only the pool holds what it released: no new one
        reused &= len(made) == before
        pool.release(free)
        del free
    return handed_out, reused


def test_a_held_buffer_is_never_claimed_and_a_free_one_is_reused():
    assert _reuse() == (False, True)


@pytest.mark.parametrize("off", [-1, 1])
def test_a_miscounted_free_mark_fails_that_check(monkeypatch, off):
    """The check above fails both ways on a wrong count: a count one too high
    hands out buffers still held, one too low never reuses one."""
    monkeypatch.setattr(pools, "_FREE", pools._FREE + off)
    handed_out, reused = _reuse()
    assert handed_out if off > 0 else not reused


def test_a_view_held_elsewhere_keeps_its_buffer_busy():
    """A plan's pool keeps the allocation itself: every view made of it (the
    shards a put holds) refers to it, so a held view keeps it from reuse."""
    made: list = []
    pool = _pool(cap=1, made=made)
    raw = pool.claim()
    pool.release(raw)
    shard = np.ndarray((4,), np.float32, buffer=raw[8:40], offset=4)
    del raw
    for _ in range(4):
        other = pool.claim()
        assert not np.shares_memory(other, shard)
        pool.release(other)
        del other
    del shard
    before = len(made)
    pool.claim()
    assert len(made) == before  # free again: reused


def test_the_pools_keep_at_most_cap_and_the_process_bound(monkeypatch):
    pool = _pool(cap=2)
    claimed = [pool.claim() for _ in range(4)]  # all held: new ones, two kept
    assert pool.kept.count == 2
    for b in claimed:
        pool.release(b)
    assert len(pool.free) == 2  # past what the pool keeps, released buffers are dropped
    pool.clear()
    assert not pool.kept.count and not pool.free
    monkeypatch.setattr(pools, "POOLED_MAX_BYTES", pools._kept_bytes + 64)
    first, second = _pool(), _pool()
    a, b = first.claim(), second.claim()
    assert (first.kept.count, second.kept.count) == (1, 0)  # the bound: every pool's together
    del a, b


def test_clear_staging_pool_clears_every_pool_and_a_dead_pool_gives_its_bytes_back():
    pool = _pool()
    held = pool.claim()
    assert pools.pooled_buffers() >= 1
    before = pools._kept_bytes
    del pool
    assert pools._kept_bytes == before - 64
    again = _pool()
    kept = again.claim()
    pools.clear_staging_pool()
    assert not again.kept.count and pools.staging_pool_size() == 0
    again.release(kept)  # claimed before the clear: not kept any more
    assert not again.free
    del held


def test_only_the_pools_module_reads_reference_counts():
    """The free rule is written once: no other module of nbjit reads a
    reference count (so none compares one with a count made by hand)."""
    readers = []
    for path in sorted((ROOT / "nbjit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Attribute) and n.attr == "getrefcount" for n in ast.walk(tree)):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == ["nbjit/core/inputs/pools.py"]
