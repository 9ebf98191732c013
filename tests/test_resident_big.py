"""Big host arrays in resident slots (nbjit/host/resident_prepare.py,
nbjit/host/waker.py): from COMPARE_MIN_BYTES a leaf is compared with what
its slot holds and written only where it differs; unchanged ones run before
their compare; signatures that write every call rotate through spare slots;
writes of a few KiB to a MiB wake the runtime's worker first. Every result is
compared with jax.jit's, the caller overwriting its arrays while
computations are in flight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs
from _host import is_resident, node_of, pool_of, run_fresh

import nbjit
from nbjit import _jax
from nbjit.host import resident as _resident
from nbjit.host import resident_prepare as _prepare
from nbjit.host import slots as _slots
from nbjit.host import waker as _waker

pytestmark = pytest.mark.cpu_host_memory  # tests/conftest.py


def _overwritten_after_each_call(n: int, value_of, b_value_of=None, n_b: int = 0) -> tuple:
    """200 calls of a slow function of two float32 arrays of `n` and `n_b` (or
    `n`; the first 64-byte aligned: jax.jit would alias it), holding
    `value_of(i)` and `b_value_of(i)` (or ``-value_of(i) / 7``) at call i and
    overwritten by the caller right after it, computations in flight.
    Returns (the nbjit function, its two arrays, how many results were wrong)."""
    def fn(a, b):
        x = a.reshape(-1, b.shape[0])
        for _ in range(3):
            x = jnp.sin(x) * 1.0001 + b
        return x.reshape(-1, 256).sum(0), jnp.sum(b)

    f, g = nbjit.jit(fn), jax.jit(fn)
    raw = np.zeros(4 * n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64
    a = raw[start:start + 4 * n].view(np.float32)
    b = np.zeros(n_b or n, np.float32)
    results, expected = [], []
    for i in range(200):
        a[:] = value_of(i)
        b[:] = -value_of(i) / 7 if b_value_of is None else b_value_of(i)
        expected.append(g(a.copy(), b.copy()))
        results.append(f(a, b))
        a[:] = 12345.0
        b[:] = -99.0
    wrong = sum(not np.array_equal(np.asarray(r[0]), np.asarray(e[0]))
                or not np.array_equal(np.asarray(r[1]), np.asarray(e[1]))
                for r, e in zip(results, expected, strict=True))
    return f, a, b, wrong


def test_caller_overwrites_big_arrays_in_flight():
    """The same big arrays (256 KiB, 1 MiB) every call, overwritten right after
    each call while slow computations are in flight: 0 wrong of 400, and
    several slots made (calls really were in flight)."""
    wrong, made = 0, []
    for n in (1 << 16, 1 << 18):
        f, a, b, w = _overwritten_after_each_call(n, lambda i: i)
        assert is_resident(f, a, b)
        made.append(pool_of(f, a, b).made)
        wrong += w
    assert wrong == 0
    assert max(made) > 1, made


def test_an_unchanged_big_array_is_compared_not_written(monkeypatch):
    """From COMPARE_MIN_BYTES a slot already holding the leaf's bytes is not
    written again; one byte changed anywhere (the last one here), another
    dtype converted into the same signature, or another layout, is written."""
    monkeypatch.setattr(_prepare, "SPECULATE_AFTER", 1 << 30)  # (compare first: tested below)

    def fn(x):
        return jnp.sum(x, axis=0), x[-1, -1] * 1

    n = _prepare.COMPARE_MIN_BYTES // 4 // 128 * 2
    x = np.ones((n, 128), np.float32)
    f, args = run_fresh(fn, lambda i: (x,), calls=4)
    pool = pool_of(f, x)
    assert is_resident(f, x) and pool.made == 1
    staging = pool.free[0][-1]
    writes = []
    original = _prepare.unchanged

    def counting(address, value, nbytes, dtype):
        same = original(address, value, nbytes, dtype)
        writes.append(not same)
        return same

    prepare = node_of(f, x).record.prepare
    prepare.__globals__["same"] = counting
    try:
        for value in (x, x, x.copy()):
            assert_same_outputs(f(value), jax.jit(fn)(value))
        assert writes == [False, False, False]
        x[-1, -1] = 7.0  # the last byte the compare reads
        assert_same_outputs(f(x), jax.jit(fn)(x))
        assert staging.view(np.float32)[n * 128 - 1] == 7.0
        for value in (x.astype(np.float64), np.asfortranarray(x), x[::-1].copy()[::-1]):
            assert_same_outputs(f(value), jax.jit(fn)(value))
        assert writes[3:] == [True, True, True, True]
    finally:
        prepare.__globals__["same"] = original


def _speculations(f, *args) -> tuple[int, int]:
    """(runs before their compare, of those the ones whose compare differed)."""
    streaks = pool_of(f, *args).streaks
    return streaks.speculated, streaks.differed


def test_unchanged_big_arrays_run_before_their_compare():
    """After SPECULATE_AFTER calls with every leaf unchanged, a call runs on the
    slot first and compares while it runs; a byte changed anywhere (first,
    last) drops that run, and the call's result is the new value's. Results
    as jax.jit's throughout; no second compile."""
    def fn(x, y):
        return jnp.sum(x, axis=0) + y[0], x[-1, -1] * y[-1, -1]

    n = _prepare.COMPARE_MIN_BYTES // 4 // 128
    x = np.ones((n, 128), np.float32)
    y = np.arange(n * 128, dtype=np.float32).reshape(n, 128)
    f, g = nbjit.jit(fn), jax.jit(fn)
    for _ in range(_prepare.SPECULATE_AFTER + 4):
        assert_same_outputs(f(x, y), g(x, y))
    assert is_resident(f, x, y)
    ran, differed = _speculations(f, x, y)
    assert ran >= 1 and differed == 0
    for where in ((0, 0), (-1, -1), (n // 2, 5)):
        x[where] += 1.0  # in place: the same array object, new bytes
        assert_same_outputs(f(x, y), g(x, y))
        # The next call writes the slot, then the streak builds again.
        for _ in range(_prepare.SPECULATE_AFTER + 2):
            assert_same_outputs(f(x, y), g(x, y))
    y2 = y.copy()  # another array with the same bytes: still unchanged
    assert_same_outputs(f(x, y2), g(x, y2))
    ran_after, differed_after = _speculations(f, x, y)
    assert differed_after == 3 and ran_after == ran + 3 * 2 + 1
    assert f.stats().misses == 1 and f.stats().slow == 0


def test_small_leaves_beside_an_unchanged_big_one():
    """A big array that stays the same runs before its compare even beside
    small leaves (an array, Python scalars) that change every call: those are
    written first. Results as jax.jit's, a float too big for float32 as
    jax.jit treats it, no second compile."""
    def fn(x, y, s, k):
        return jnp.sum(x, axis=0) * s + jnp.sum(y) + k, x[-1, -1] - s

    n = _prepare.COMPARE_MIN_BYTES // 4 // 128
    x = np.ones((n, 128), np.float32)
    f, g = nbjit.jit(fn), jax.jit(fn)

    def call(i):
        y = np.full(7, i, np.float32)
        assert_same_outputs(f(x, y, 0.5 * i, i), g(x, y, 0.5 * i, i))

    for i in range(_prepare.SPECULATE_AFTER + 8):
        call(i)
    y = np.zeros(7, np.float32)
    assert is_resident(f, x, y, 1.0, 1)
    ran, differed = _speculations(f, x, y, 1.0, 1)
    assert ran >= 3 and differed == 0, (ran, differed)
    x[n // 2, 3] = 5.0  # in place: the big leaf changes under a run
    call(20)
    for i in range(_prepare.SPECULATE_AFTER + 2):
        call(30 + i)
    big = 1e39  # above float32's range: whatever jax.jit does with it
    try:
        expected = g(x, y, big, 1)
    except Exception as e:
        with pytest.raises(type(e)):
            f(x, y, big, 1)
    else:
        assert_same_outputs(f(x, y, big, 1), expected)
    call(40)
    assert _speculations(f, x, y, 1.0, 1)[1] == 1
    # (the float too big for float32 is refused by the slot and takes JAX's path)
    assert f.stats().misses == 1 and f.stats().slow <= 1


def test_small_leaves_overwritten_beside_an_unchanged_big_one():
    """The big array unchanged, a small one new every call, both overwritten by
    the caller right after each call, computations in flight: 0 wrong of 200,
    and calls ran before their compare."""
    n = _prepare.COMPARE_MIN_BYTES // 4 * 2
    f, a, b, wrong = _overwritten_after_each_call(n, lambda i: 1.0, lambda i: i, n_b=256)
    assert wrong == 0
    assert _speculations(f, a, b)[0] > 0


def test_new_values_every_call_are_written_without_a_compare():
    """After WRITE_AFTER calls in a row with new values, leaves are written
    without a compare; one in PROBE_EVERY calls still compares, so values that
    then stay the same are noticed and run before their compare again."""
    def fn(x):
        return jnp.sum(x, axis=0)

    n = _prepare.COMPARE_MIN_BYTES // 4 // 128
    xs = [np.full((n, 128), i, np.float32) for i in range(4)]  # (4: not a multiple of ROTATE_SLOTS)
    f, g = nbjit.jit(fn), jax.jit(fn)
    for i in range(4):
        assert_same_outputs(f(xs[i % 4]), g(xs[i % 4]))
    prepare = node_of(f, xs[0]).record.prepare
    compares = []
    original = _prepare.unchanged

    def counting(address, value, nbytes, dtype):
        compares.append(1)
        return original(address, value, nbytes, dtype)

    prepare.__globals__["same"] = counting
    try:
        for i in range(2 * _prepare.PROBE_EVERY):
            assert_same_outputs(f(xs[i % 4]), g(xs[i % 4]))
        assert 1 <= len(compares) <= 2 * 2 + _prepare.WRITE_AFTER, len(compares)
        ran, _ = _speculations(f, xs[0])
        for _ in range(_prepare.PROBE_EVERY + _prepare.SPECULATE_AFTER + 2):
            assert_same_outputs(f(xs[1]), g(xs[1]))
        assert _speculations(f, xs[0])[0] > ran
    finally:
        prepare.__globals__["same"] = original


def test_signatures_that_write_every_call_rotate_through_slots():
    """A signature written on every call (leaves below the compare, or new
    values WRITE_AFTER calls in a row) from ROTATE_MIN_BYTES keeps ROTATE_SLOTS
    slots and takes them in turn; smaller ones, and the same big array every
    call, keep one. Results as jax.jit's."""
    def made(nbytes, n_values, calls=16):
        def fn(x):  # (a function of its own: nbjit functions of one function share entries)
            return jnp.sum(x, axis=0) * 2

        xs = [np.full((nbytes // 4 // 64, 64), i, np.float32) for i in range(n_values)]
        f, g = nbjit.jit(fn), jax.jit(fn)
        for i in range(calls):
            assert_same_outputs(jax.block_until_ready(f(xs[i % n_values])), g(xs[i % n_values]))
        assert is_resident(f, xs[0])
        pool = pool_of(f, xs[0])
        return pool.made, pool.free

    rotate, slots = _resident.ROTATE_MIN_BYTES, _slots.ROTATE_SLOTS
    assert made(rotate // 2, 4)[0] == 1
    written, free = made(rotate, 4)  # (below the compare: written every call)
    assert written == slots and len(free) == slots
    assert made(_prepare.COMPARE_MIN_BYTES, 4)[0] == slots  # new values: written
    assert made(_prepare.COMPARE_MIN_BYTES, 1)[0] == 1  # the same array: compared, not written
    # In turn: the slot a call takes is the one used longest ago.
    xs = [np.full((rotate // 4 // 64, 64), i, np.float32) for i in range(5)]
    f = nbjit.jit(lambda x: jnp.sum(x, axis=0) * 3)
    for x in xs:
        jax.block_until_ready(f(x))
    pool = pool_of(f, xs[0])
    order = [id(slot) for slot in pool.free]
    jax.block_until_ready(f(xs[0]))
    assert [id(slot) for slot in pool.free] == order[1:] + order[:1]


def _counting_wakes(f, *args) -> list:
    """Replaces the record's wake with one that counts (and still wakes)."""
    prepare = node_of(f, *args).record.prepare
    wake = prepare.__globals__["wake"]
    wakes: list = []

    def counting():
        wakes.append(1)
        return wake()

    prepare.__globals__["wake"] = counting
    return wakes


def test_writes_wake_the_worker_first_while_it_is_idle():
    """A call writing WAKE_MIN_BYTES to WAKE_MAX_BYTES, while the signature's
    last computation is done, dispatches the trivial computation first; not
    while that computation is still running, and never outside the range.
    Results as jax.jit's."""
    def slow(x):  # (milliseconds: calls dispatched back to back are in flight)
        y = jax.lax.fori_loop(0, 1000, lambda _, y: jnp.sin(y) * 1.0001, x)
        return jnp.sum(y, axis=0)

    def quick(x):
        return jnp.sum(jnp.sin(x), axis=0)

    xs = [np.full((_resident.WAKE_MIN_BYTES // 4 // 64, 64), i, np.float32) for i in range(4)]
    f, g = nbjit.jit(slow), jax.jit(slow)
    for i in range(16):
        assert_same_outputs(jax.block_until_ready(f(xs[i % 4])), g(xs[i % 4]))
    assert is_resident(f, xs[0])
    wakes = _counting_wakes(f, xs[0])
    for i in range(8):
        assert_same_outputs(jax.block_until_ready(f(xs[i % 4])), g(xs[i % 4]))
    assert len(wakes) == 8
    big = [np.full((1024, 256), i, np.float32) for i in range(4)]  # 1 MiB: no wake
    h = nbjit.jit(quick)
    for i in range(16):
        jax.block_until_ready(h(big[i % 4]))
    assert node_of(h, big[0]).record.prepare.__globals__.get("wake") is None
    small = [np.full((8, 64), i, np.float32) for i in range(4)]  # 2 KiB: no wake
    k = nbjit.jit(quick)
    for i in range(16):
        jax.block_until_ready(k(small[i % 4]))
    assert node_of(k, small[0]).record.prepare.__globals__.get("wake") is None
    f(xs[1])
    wakes.clear()
    # In flight: a call that finds the last one still running does not wake.
    outs = [f(xs[i % 4]) for i in range(2, 6)]
    for i, out in enumerate(outs):
        assert_same_outputs(out, g(xs[(i + 2) % 4]))
    assert len(wakes) <= 1, len(wakes)


def test_a_loop_that_waits_every_few_calls_does_not_wake_the_worker():
    """The first call after a wait finds the last computation done, but the call
    before it did not: no wake (WAKE_AFTER_IDLE), the runtime's threads start once,
    for the call's own computation. Results as jax.jit's.

    Whether a computation is still in flight is the runtime's to decide (it
    sometimes runs one on the calling thread), so the test reads it: a result
    not ready once the next call returned was in flight during that call."""
    def slow(x):
        y = jax.lax.fori_loop(0, 1000, lambda _, y: jnp.sin(y) * 1.0001, x)
        return jnp.sum(y, axis=0)

    xs = [np.full((_resident.WAKE_MIN_BYTES // 4 // 64, 64), i, np.float32) for i in range(4)]
    f, g = nbjit.jit(slow), jax.jit(slow)
    for i in range(16):
        assert_same_outputs(jax.block_until_ready(f(xs[i % 4])), g(xs[i % 4]))
    wakes = _counting_wakes(f, xs[0])
    in_flight = []  # per call of the groups after the first: its predecessor still ran
    woke = []  # per call of those groups: whether it woke the worker
    for group in range(5):
        outs = []
        for i in range(4):
            before = len(wakes)
            outs.append(f(xs[i]))  # waited for every 4 calls only
            if group:
                woke.append(len(wakes) > before)
                in_flight.append(i > 0 and not outs[i - 1].is_ready())
        jax.block_until_ready(outs)
        for i, out in enumerate(outs):
            assert_same_outputs(out, g(xs[i]))
    # A call that found its predecessor in flight does not wake, and neither
    # does the next one (the first of a group: done, but once in a row).
    for k, busy in enumerate(in_flight):
        if busy:
            assert not woke[k], (k, woke, in_flight)
            if k + 1 < len(woke):
                assert not woke[k + 1], (k, woke, in_flight)
    group_ends = in_flight[3::4]
    assert sum(group_ends) >= 2, in_flight  # (else the runtime ran nearly all inline: no test)
    wakes.clear()
    for i in range(3):  # waiting for every call again: woken from the second on
        jax.block_until_ready(f(xs[i]))
    assert len(wakes) == 2


@pytest.mark.parametrize("why", ["no compile", "synchronous runtime"])
def test_no_wake_where_none_can_be_made(monkeypatch, why):
    """A runtime where the trivial computation cannot be made, or where it
    would run on the calling thread (``jax_cpu_enable_async_dispatch`` off):
    calls write and run without it, results as jax.jit's."""
    def broken(compiled):
        raise RuntimeError("no")

    monkeypatch.setattr(_waker, "_wakers", {})
    if why == "no compile":
        monkeypatch.setattr(_jax, "compiled_execute", broken)
    else:
        monkeypatch.setattr(_jax, "cpu_async_dispatch", lambda: False)
    xs = [np.full((64, 64), i, np.float32) for i in range(4)]
    f, g = nbjit.jit(lambda x: jnp.sum(x, axis=0)), jax.jit(lambda x: jnp.sum(x, axis=0))
    for i in range(20):
        assert_same_outputs(f(xs[i % 4]), g(xs[i % 4]))
    assert is_resident(f, xs[0])
    assert node_of(f, xs[0]).record.prepare.__globals__.get("wake") is None
    assert _waker._wakers == {jax.devices()[0]: None}


def test_a_record_that_runs_before_its_compare_dies_with_its_function():
    """Its prepare calls the executable itself: still no cycle holds it, so
    the function's death frees the executable without a gc pass."""
    import gc

    from nbjit import _jax

    _waker.waker(jax.devices()[0])  # (made once per device, kept by the process)
    gc.collect()
    gc.disable()
    try:
        live = len(_jax.live_executables())
        f = nbjit.jit(lambda x: jnp.sum(x) * 2)
        x = np.ones(_prepare.COMPARE_MIN_BYTES // 4, np.float32)
        for _ in range(_prepare.SPECULATE_AFTER + 4):
            jax.block_until_ready(f(x))  # (one slot: a busy one would make another)
        assert _speculations(f, x)[0] >= 1
        assert len(_jax.live_executables()) == live + 1
        del f
        assert len(_jax.live_executables()) == live
    finally:
        gc.enable()


def test_the_floor_of_a_record_that_runs_before_its_compare():
    """compare's floor (the executable alone on prepared inputs) works on a
    record whose prepare ran the executable already."""
    from nbjit.bench.floor import floor_call

    def fn(x):
        return jnp.sum(x) * 2

    f = nbjit.jit(fn)
    x = np.arange(_prepare.COMPARE_MIN_BYTES // 4, dtype=np.float32)
    for _ in range(_prepare.SPECULATE_AFTER + 4):
        jax.block_until_ready(f(x))
    ran, _ = _speculations(f, x)
    run = floor_call(f, x)
    assert _speculations(f, x)[0] > ran  # (its prepare ran before its compare)
    for _ in range(2):
        assert_same_outputs(run()[0], jax.jit(fn)(x))


def test_runs_before_their_compare_never_see_later_writes():
    """Values that stay the same for a few calls and then change, the caller
    overwriting its arrays right after every call and restoring them before
    the next, computations in flight: 0 results wrong, and calls both ran
    before their compare and found a difference there."""
    n = _prepare.COMPARE_MIN_BYTES // 4 * 2
    f, a, b, wrong = _overwritten_after_each_call(n, lambda i: i // 7)  # new every 7 calls
    assert wrong == 0
    ran, differed = _speculations(f, a, b)
    assert ran > 0 and differed > 0, (ran, differed)
