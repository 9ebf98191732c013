"""Resident host inputs (nbjit/host/resident.py): fresh host
values written into device arrays that alias pooled host memory, no transfer.

A signature whose small host leaves keep bringing new values gets slots:
a staging buffer with a device array over each leaf's view, made once.
Every test compares with jax.jit, exactly (values, dtypes, weak types,
shardings, committedness, tree), and checks that the resident record really
ran (its generated preparer, `stats().resident`), with no second compile.
The differential tests over dtypes, layouts and scalar conversions run
resident and packed in tests/test_packed.py (its `mode` fixture).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs
from _threads import run_threads

import nbjit
from nbjit import _jax
from nbjit.host import packing as _packing
from nbjit.host import policy as _policy
from nbjit.host import resident as _resident
from nbjit.host import resident_prepare as _prepare
from nbjit.host import slots as _slots
from nbjit.host import waker as _waker
from nbjit.host.policy import TRANSITIONS, Stage

pytestmark = pytest.mark.cpu_host_memory  # tests/conftest.py

CALLS = 3 * _policy.PACK_AFTER  # enough fresh calls to go resident, then run resident


def _node(f, *args, **kwargs):
    node, _ = f._entry_for(args, kwargs)
    assert node is not None
    return node


def _is_resident(f, *args, **kwargs) -> bool:
    record = _node(f, *args, **kwargs).record
    return "<resident prepare " in record.prepare.__code__.co_filename and (
        record.fence is not None)


def _pool(f, *args, **kwargs) -> _slots.ResidentSlots:
    return _node(f, *args, **kwargs).host_policy.resident


def _run_fresh(fn, make_args, calls=CALLS, **jit_options):
    """Calls nbjit.jit(fn) and jax.jit(fn) with new values each call; returns the nbjit one."""
    f, g = nbjit.jit(fn, **jit_options), jax.jit(fn, **jit_options)
    for i in range(calls):
        args = make_args(i)
        assert_same_outputs(f(*args), g(*args))
    return f, args


def _fresh_pair(i):
    return np.full(3, i, np.float32), np.full(3, -i / 3, np.float32)


def test_one_host_leaf_and_a_static_config():
    """One host leaf gains nothing from packing, but goes resident: the
    static-config training step (a params dict, a new batch, statics)."""
    params = {"w": jnp.ones((4, 2)) * 0.5, "b": jnp.zeros(2)}

    def step(params, batch, scale, *, act):
        h = batch @ params["w"] + params["b"]
        return jax.tree.map(lambda p: p * scale, params), (jnp.tanh(h) if act else h).sum()

    rng = np.random.default_rng(4)
    f, args = _run_fresh(lambda p, x, s: step(p, x, s, act=True),
                         lambda i: (params, rng.standard_normal((8, 4)).astype(np.float32), 2.0),
                         static_argnums=(2,))
    assert _is_resident(f, *args) and f.stats().packed_compiles == 0
    g, h = nbjit.jit(step, static_argnums=(2,), static_argnames=("act",)), jax.jit(
        step, static_argnums=(2,), static_argnames=("act",))
    for i in range(CALLS):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        assert_same_outputs(g(params, x, 0.5, act=i % 2 == 0), h(params, x, 0.5, act=i % 2 == 0))
    assert g._cache_size() == 2 and g.stats().resident == 2


def test_no_second_compile_and_no_compile_log(caplog):
    """Unlike packing, resident inputs run the signature's own executable."""
    def add_pair(a, b):
        return a + b

    f = nbjit.jit(add_pair)
    before = _jax.jax_cache_misses()
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING"):
            for i in range(CALLS):
                f(*_fresh_pair(i))
    finally:
        jax.config.update("jax_log_compiles", False)
    assert _is_resident(f, *_fresh_pair(0))
    assert f.stats().packed_compiles == 0 and f.stats().misses == 1
    compiled = [r for r in caplog.records if "add_pair" in r.getMessage()
                and "Compiling" in r.getMessage()]
    assert len(compiled) == 1, [r.getMessage() for r in compiled]
    assert _jax.jax_cache_misses()[1] - before[1] <= 1


def test_donation_no_outputs_and_switch_off_stay_per_leaf():
    f = nbjit.jit(lambda a, b, c: (a + b, c * 2), donate_argnums=2)
    for i in range(CALLS):
        f(*_fresh_pair(i), jnp.ones(3))
    assert f.stats().resident == 0
    f, args = _run_fresh(lambda a: (), lambda i: (np.full(3, i, np.float32),))  # no outputs
    assert f.stats().resident == 0
    _policy.set_enabled(False)
    try:
        f, args = _run_fresh(lambda a, b: a - b, _fresh_pair)
        assert f.stats().resident == 0 and not _is_resident(f, *args)
    finally:
        _policy.set_enabled(True)


def test_the_fence_is_the_smallest_output():
    """A slot keeps one output alive until it is reused: the smallest one."""
    f, args = _run_fresh(lambda a: (jnp.tile(a, 100), a.sum(), a * 2),
                         lambda i: (np.full(4, i, np.float32),))
    pool = _pool(f, *args)
    out = f(*args)
    assert pool.fence_index == 1
    assert all(slot[0] is None or slot[0].shape == () for slot in pool.free)
    assert any(slot[0] is out[1] for slot in pool.free)


def test_a_busy_slot_is_never_written_and_the_cap_falls_back(monkeypatch):
    """A slot whose fence is not ready is skipped: another slot is made, up to
    the cap; beyond it calls take the per-leaf path. (Readiness is forced
    here: whether the runtime runs a small call inline is its business.)"""
    f, g = nbjit.jit(lambda a, b: (a * b, a.sum())), jax.jit(lambda a, b: (a * b, a.sum()))
    for i in range(CALLS):
        f(*_fresh_pair(i))
    pool = _pool(f, *_fresh_pair(0))
    prepare = _node(f, *_fresh_pair(0)).record.prepare
    monkeypatch.setitem(prepare.__globals__, "ready", lambda fence: False)
    monkeypatch.setattr(jax.Array, "is_ready", lambda self: False, raising=False)
    monkeypatch.setattr(_jax.ArrayImpl, "is_ready", lambda self: False)
    made = pool.made
    outs = []
    for i in range(pool.cap + 3):
        args = _fresh_pair(100 + i)
        outs.append((f(*args), g(*args)))
    assert pool.made == pool.cap > made  # a new slot per busy one, then no more
    for nb, jx in outs:
        assert_same_outputs(nb, jx)
    monkeypatch.undo()
    for i in range(4):  # ready again: the slots are reused, none made
        assert_same_outputs(f(*_fresh_pair(i)), g(*_fresh_pair(i)))
    assert pool.made == pool.cap and _is_resident(f, *_fresh_pair(0))


def test_deleted_fences_retire_slots_then_the_signature_gives_them_up():
    """The fence donated elsewhere (or deleted) says nothing about its call:
    its slot is never used again; after MAX_RETIRED such slots the
    signature goes back to per-leaf puts."""
    f = nbjit.jit(lambda a, b: (a + b, b * 2))
    g = jax.jit(lambda a, b: (a + b, b * 2))
    consume = jax.jit(lambda x: x + 1, donate_argnums=0)
    for i in range(CALLS):
        f(*_fresh_pair(i))
    pool = _pool(f, *_fresh_pair(0))
    for i in range(pool.MAX_RETIRED + 2):
        args = _fresh_pair(i)
        nb, jx = f(*args), g(*args)
        assert_same_outputs(nb, jx)
        consume(nb[0])  # the fence (the smallest output; here the first) is donated
        assert nb[0].is_deleted()
    assert pool.broken and pool.retired >= pool.MAX_RETIRED
    assert not _is_resident(f, *_fresh_pair(0))
    node = _node(f, *_fresh_pair(0))
    assert node.host_policy.stage is Stage.GIVEN_UP and node.record is node.host_policy.per_leaf
    for i in range(4):
        assert_same_outputs(f(*_fresh_pair(i)), g(*_fresh_pair(i)))


def test_an_output_aliasing_a_slot_gives_slots_up():
    """Checked on the first resident call (never seen: outputs are new buffers)."""
    f = nbjit.jit(lambda a, b: a - b)
    for i in range(CALLS):
        f(*_fresh_pair(i))
    pool = _pool(f, *_fresh_pair(0))
    slot = pool.free[0]

    class Aliasing:
        size = 1

        def unsafe_buffer_pointer(self):
            return slot[-1].ctypes.data

    assert not pool._check_outputs(slot, [Aliasing()])
    assert pool.broken and not _is_resident(f, *_fresh_pair(0))
    assert _node(f, *_fresh_pair(0)).host_policy.stage is Stage.GIVEN_UP
    assert_same_outputs(f(*_fresh_pair(3)), jax.jit(lambda a, b: a - b)(*_fresh_pair(3)))


def test_outputs_never_alias_slot_memory():
    f, args = _run_fresh(lambda a, b: (a, b, a + 0), _fresh_pair)
    pool = _pool(f, *args)
    ranges = [(s[-1].ctypes.data, s[-1].ctypes.data + s[-1].nbytes) for s in pool.free]
    for i in range(8):
        for out in f(*_fresh_pair(i)):
            p = out.unsafe_buffer_pointer()
            assert not any(lo <= p < hi for lo, hi in ranges)


def test_a_device_whose_puts_copy_gets_packing_instead(monkeypatch):
    """Where a zero-copy put does not alias host memory (a GPU), no slot is
    made: two or more leaves are packed (a second compile), one stays per-leaf."""
    monkeypatch.setattr(_jax, "ZERO_COPY", _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    f, args = _run_fresh(lambda a, b: a * b, _fresh_pair)
    assert _packing.wait(120)
    assert_same_outputs(f(*args), jax.jit(lambda a, b: a * b)(*args))
    assert not _is_resident(f, *args) and f.stats().resident == 0
    assert f.stats().packed_compiles == 1 and _node(f, *args).host_policy.stage is Stage.PACKED
    f, args = _run_fresh(lambda a: a + 1, lambda i: (np.full(3, i, np.float32),))
    assert f.stats().resident == 0 and f.stats().packed_compiles == 0
    assert _node(f, *args).host_policy.stage is Stage.GIVEN_UP  # one leaf, no slots


def test_stats_and_the_run_report_name_resident_and_packed_signatures(monkeypatch):
    from nbjit.observe import report as _report

    f, args = _run_fresh(lambda a, b: a - b, _fresh_pair)
    text = str(f.stats())
    resident = ("1 signature keeps them in reused device buffers (resident: no transfer, "
                "written when they change)")
    assert f"host inputs of {f.stats().name}: {resident}" in text
    assert resident in f.stats()._repr_html_()
    monkeypatch.setattr(_policy, "RESIDENT", False)
    g, args = _run_fresh(lambda a, b: a * b - 1, _fresh_pair)
    assert _packing.wait(120)
    assert "1 signature packs new values into one transfer per call (" in str(g.stats())
    assert "(resident: " not in str(g.stats())
    report = _report.build(None)
    rows = {r["name"]: r for r in report["functions"]}
    assert rows[f.stats().name]["resident"] == 1 and rows[g.stats().name]["packed_compiles"] == 1
    out = _report.format_text(report)
    assert f"host inputs of {f.stats().name}: {resident}" in out
    assert f"host inputs of {g.stats().name}: 1 signature packs" in out
    h = nbjit.jit(lambda a: a + 1)
    h(jnp.ones(2))
    assert "host inputs of" not in str(h.stats())


def test_the_same_big_arrays_every_call_get_slots():
    """Leaves too big for the memo put a copy of themselves on every call, a
    new value or not: slots cost less (one copy into host memory the device
    reads), so such a signature gets them at its first hit, whether its
    values are new, the same, or written into the same array."""
    from nbjit.core.inputs.steps import HostInput

    n = HostInput.MEMO_MAX_BYTES // 4 * 2  # float32: twice the memo's limit
    same = (np.ones(n, np.float32), np.full(n, 2, np.float32))
    f, args = _run_fresh(lambda a, b: a @ b, lambda i: same, calls=2)
    assert _is_resident(f, *args) and f.stats().resident == 1
    assert _node(f, *args).host_policy.stage is Stage.RESIDENT
    g, args = _run_fresh(lambda a, b: a @ b - 1,
                         lambda i: (np.full(n, i, np.float32), np.ones(n, np.float32)))
    assert _is_resident(g, *args) and g.stats().resident == 1
    buffer = np.zeros(n, np.float32)

    def written_in_place(i):
        buffer[:] = i
        return buffer, same[1]

    h, args = _run_fresh(lambda a, b: a @ b + 1, written_in_place)
    assert _is_resident(h, *args) and h.stats().resident == 1


def test_small_same_values_keep_the_memo():
    """Leaves within the memo's limit: the same values reuse their device copy
    (no copy at all), so they get no slots; new values do (tests above)."""
    same = (np.ones(8, np.float32), np.full(8, 2, np.float32))
    f, args = _run_fresh(lambda a, b: a @ b, lambda i: same)
    assert not _is_resident(f, *args) and f.stats().resident == 0


@pytest.mark.parametrize("nbytes", [64 << 10, 1 << 20, 4 << 20], ids=["64K", "1M", "4M"])
@pytest.mark.parametrize("aligned", [False, True], ids=["unaligned", "aligned"])
def test_big_arrays_any_alignment_and_layout_as_jax(nbytes, aligned):
    """Big host arrays, the same or new, C order, Fortran order, strided, another
    dtype (converted as jaxlib converts): resident, results as jax.jit's."""
    rows = nbytes // (4 * 256)

    def fn(p, x):
        return jnp.sum(x * p, axis=1), x[:2] + 1

    p = jnp.linspace(0, 1, 256)
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + (0 if aligned else 16)
    x = raw[start:start + nbytes].view(np.float32).reshape(rows, 256)
    x[...] = np.random.default_rng(0).standard_normal((rows, 256))
    f, args = _run_fresh(fn, lambda i: (p, x), calls=4)
    assert _is_resident(f, *args) and f.stats().misses == 1
    f, args = _run_fresh(fn, lambda i: (p, x * i), calls=4)
    assert _is_resident(f, *args)
    fortran = np.asfortranarray(x)
    strided = np.repeat(x, 2, axis=1)[:, ::2]
    wide = x.astype(np.float64)  # x64 off: converted to float32, as jaxlib does
    for y in (fortran, strided, wide):
        assert_same_outputs(f(p, y), jax.jit(fn)(p, y))
    assert f.stats().misses == 1


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
        assert _is_resident(f, a, b)
        made.append(_pool(f, a, b).made)
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
    f, args = _run_fresh(fn, lambda i: (x,), calls=4)
    pool = _pool(f, x)
    assert _is_resident(f, x) and pool.made == 1
    staging = pool.free[0][-1]
    writes = []
    original = _prepare.unchanged

    def counting(address, value, nbytes, dtype):
        same = original(address, value, nbytes, dtype)
        writes.append(not same)
        return same

    prepare = _node(f, x).record.prepare
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
    return tuple(_pool(f, *args).counts)


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
    assert _is_resident(f, x, y)
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
    assert _is_resident(f, x, y, 1.0, 1)
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
    prepare = _node(f, xs[0]).record.prepare
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
        assert _is_resident(f, xs[0])
        pool = _pool(f, xs[0])
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
    pool = _pool(f, xs[0])
    order = [id(slot) for slot in pool.free]
    jax.block_until_ready(f(xs[0]))
    assert [id(slot) for slot in pool.free] == order[1:] + order[:1]


def _counting_wakes(f, *args) -> list:
    """Replaces the record's wake with one that counts (and still wakes)."""
    prepare = _node(f, *args).record.prepare
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
    assert _is_resident(f, xs[0])
    wakes = _counting_wakes(f, xs[0])
    for i in range(8):
        assert_same_outputs(jax.block_until_ready(f(xs[i % 4])), g(xs[i % 4]))
    assert len(wakes) == 8
    big = [np.full((1024, 256), i, np.float32) for i in range(4)]  # 1 MiB: no wake
    h = nbjit.jit(quick)
    for i in range(16):
        jax.block_until_ready(h(big[i % 4]))
    assert _node(h, big[0]).record.prepare.__globals__.get("wake") is None
    small = [np.full((8, 64), i, np.float32) for i in range(4)]  # 2 KiB: no wake
    k = nbjit.jit(quick)
    for i in range(16):
        jax.block_until_ready(k(small[i % 4]))
    assert _node(k, small[0]).record.prepare.__globals__.get("wake") is None
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
    for the call's own computation. Results as jax.jit's."""
    def slow(x):
        y = jax.lax.fori_loop(0, 1000, lambda _, y: jnp.sin(y) * 1.0001, x)
        return jnp.sum(y, axis=0)

    xs = [np.full((_resident.WAKE_MIN_BYTES // 4 // 64, 64), i, np.float32) for i in range(4)]
    f, g = nbjit.jit(slow), jax.jit(slow)
    for i in range(16):
        assert_same_outputs(jax.block_until_ready(f(xs[i % 4])), g(xs[i % 4]))
    wakes = _counting_wakes(f, xs[0])
    for group in range(5):
        if group == 1:  # (the first group's first call still follows the waited calls above)
            assert len(wakes) <= 1
            wakes.clear()
        outs = [f(xs[i]) for i in range(4)]  # waited for every 4 calls only
        jax.block_until_ready(outs)
        for i, out in enumerate(outs):
            assert_same_outputs(out, g(xs[i]))
    assert wakes == []
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
    assert _is_resident(f, xs[0])
    assert _node(f, xs[0]).record.prepare.__globals__.get("wake") is None
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


def test_same_big_arrays_from_threads():
    """Threads, each with the same array every call and its own values, share
    one signature's slots: a slot holding another thread's bytes differs at
    the compare. Results as jax.jit's."""
    def fn(a, s):
        return jnp.sum(a * s, axis=0)

    f, g = nbjit.jit(fn), jax.jit(fn)

    def worker(seed):
        a = np.full((256, 256), seed, np.float32)  # 256 KiB
        for i in range(60):
            if i % 20 == 19:
                a[seed % 256, :] += 1.0
            s = jnp.float32(i % 3)
            assert_same_outputs(f(a, s), g(a.copy(), s))

    errors = run_threads(worker, 4)
    assert not errors, errors[0]
    a = np.zeros((256, 256), np.float32)
    assert _is_resident(f, a, jnp.float32(0)) and f.stats().misses == 1


def test_big_arrays_from_threads():
    def fn(a, s):
        return jnp.sum(a * s, axis=0)

    f, g = nbjit.jit(fn), jax.jit(fn)

    def worker(seed):
        rng = np.random.default_rng(seed)
        a = np.empty((256, 256), np.float32)  # 256 KiB, the same array each call
        for i in range(60):
            a[...] = rng.standard_normal((256, 256))
            s = jnp.float32(i)
            expected = g(a.copy(), s)
            out = f(a, s)
            a[...] = 0  # the caller reuses its buffer at once
            assert_same_outputs(out, expected)

    errors = run_threads(worker, 4)
    assert not errors, errors[0]
    a = np.zeros((256, 256), np.float32)
    assert _is_resident(f, a, jnp.float32(0)) and f.stats().resident == 1


def test_slot_memory_is_bounded(monkeypatch):
    """Per signature: slots and fences within SIGNATURE_MAX_BYTES (one slot at
    least); per process: PROCESS_MAX_BYTES, beyond which calls take the puts;
    a function's slots are given back when it dies."""
    import gc

    def fn(a):
        return a * 2  # the fence is the only output: as big as the input

    n = 1 << 18  # 1 MiB
    f, args = _run_fresh(fn, lambda i: (np.full(n, i, np.float32),), calls=3)
    pool = _pool(f, *args)
    assert pool.slot_bytes >= 2 * 4 * n
    assert pool.cap == min(_slots.RESIDENT_CAP, _slots.SIGNATURE_MAX_BYTES // pool.slot_bytes)
    held = _slots.resident_bytes()
    assert held >= pool.made * pool.slot_bytes
    f.clear_cache()
    del f, pool
    gc.collect()
    assert _slots.resident_bytes() <= held - 2 * 4 * n
    monkeypatch.setattr(_slots, "PROCESS_MAX_BYTES", 0)  # (others may free theirs meanwhile)
    def fn2(a):
        return a * 3

    g, args = _run_fresh(fn2, lambda i: (np.full(n, -i, np.float32),), calls=6)
    assert not _is_resident(g, *args) and g.stats().resident == 0  # no room: puts
    assert_same_outputs(g(*args), jax.jit(fn2)(*args))


def test_a_device_whose_puts_copy_keeps_puts_for_big_leaves(monkeypatch):
    """Where a zero-copy put does not alias host memory (a GPU), a big leaf
    keeps its own put (a copy to the device in any case): no slots, nothing
    packed, the same results."""
    monkeypatch.setattr(_jax, "ZERO_COPY", _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    n = 1 << 16
    f, args = _run_fresh(lambda a, b: a * b[0], lambda i: (
        np.full(n, i, np.float32), np.full(4, -i, np.float32)))
    assert _packing.wait(120)
    assert not _is_resident(f, *args) and f.stats().resident == 0
    assert f.stats().packed_compiles == 0


# ---------------------------------------------------------------------------
# The policy: one compare-and-swap, along its table


def test_the_policy_swaps_in_its_watching_record_built_with_on_fresh():
    """On the miss the policy replaces the miss's record with one whose host
    steps were built with `on_fresh` (never patched on afterwards)."""
    f = nbjit.jit(lambda a, b: a * b)
    args = _fresh_pair(0)
    f(*args)
    node = _node(f, *args)
    policy = node.host_policy
    assert policy.stage is Stage.PER_LEAF and node.record is policy.per_leaf
    hosts = [s for s in node.record.step_objects() if type(s).__name__ == "HostInput"]
    assert len(hosts) == 2 and all(h.on_fresh is not None for h in hosts)
    assert all(h.on_fresh() == policy.fresh for h in hosts)  # weak: the policy's method
    for i in range(1, CALLS):
        f(*_fresh_pair(i))
    assert policy.stage is Stage.RESIDENT and _is_resident(f, *args)


def test_the_swap_is_a_compare_and_swap_along_the_table():
    f, args = _run_fresh(lambda a, b: a + b, _fresh_pair)
    node = _node(f, *args)
    policy, resident = node.host_policy, node.record
    assert policy.stage is Stage.RESIDENT
    # Not what the node holds: refused, nothing changes.
    assert not policy._swap(policy.builder, Stage.GIVEN_UP, policy.per_leaf)
    assert node.record is resident and policy.stage is Stage.RESIDENT
    # A move the table does not have: refused.
    assert (Stage.RESIDENT, Stage.PACKED) not in TRANSITIONS
    assert not policy._swap(resident, Stage.PACKED, policy.per_leaf)
    assert node.record is resident and policy.stage is Stage.RESIDENT
    # Its own move: made.
    assert policy._swap(resident, Stage.GIVEN_UP, policy.per_leaf)
    assert node.record is policy.per_leaf and policy.stage is Stage.GIVEN_UP
    g = jax.jit(lambda a, b: a + b)
    for i in range(4):  # given up: per-leaf puts, for good
        assert_same_outputs(f(*_fresh_pair(i)), g(*_fresh_pair(i)))
    assert policy.stage is Stage.GIVEN_UP and not _is_resident(f, *args)


def test_only_the_cache_assigns_a_nodes_record():
    """`node.record` is set when the node is made (cache.Node) and replaced by the
    cache's `Namespace.replace_record` (which the policy's `_swap` calls); nowhere
    else in nbjit."""
    import pathlib
    import re

    root = pathlib.Path(nbjit.__file__).parent
    places = sorted(f"{p.relative_to(root)}:{line.strip()}"
                    for p in root.rglob("*.py")
                    for line in p.read_text().splitlines()
                    if re.search(r"\.record(: [^=]*)? = ", line))
    assert places == ["core/cache.py:node.record = new",
                      "core/cache.py:self.record: FastPath | None = record  "
                      "# replaced only by `Namespace.replace_record`"], places


def test_on_miss_never_raises_into_the_miss_path():
    """`on_miss` is what the miss path calls after a compile with a record: a
    jitted object it cannot read, or no node, leaves the miss alone."""
    import types

    from nbjit.host import watch

    assert watch.on_miss(object()) is None
    f = nbjit.jit(lambda a, b: a + b)
    args = _fresh_pair(0)
    f(*args)
    node = _node(f, *args)
    record = node.record
    outcome = types.SimpleNamespace(jitted=f, node=node, record=None, fastpath=None,
                                    leaves=list(args), args=args, kwargs={})
    assert watch.on_miss(outcome) is None
    assert node.record is record  # nothing swapped
