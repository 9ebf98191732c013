"""Resident host inputs (nbjit/_packed.py, "Resident slots"): fresh host
values written into device arrays that alias pooled host memory, no transfer.

A signature whose small host leaves keep bringing new values gets slots:
a staging buffer with a device array over each leaf's view, made once.
Every test compares with jax.jit, exactly (values, dtypes, weak types,
shardings, committedness, tree), and checks that the resident record really
ran (its generated preparer, `stats().resident`), with no second compile.
"""

from __future__ import annotations

import gc
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs
from _threads import run_threads
from test_packed import DTYPES, _aligned, _ops, _values

import nbjit
from nbjit import _jax, _packed

CALLS = 3 * _packed.PACK_AFTER  # enough fresh calls to go resident, then run resident


def _node(f, *args, **kwargs):
    node, _ = f._entry_for(args, kwargs)
    assert node is not None
    return node


def _is_resident(f, *args, **kwargs) -> bool:
    record = _node(f, *args, **kwargs).record
    return "<resident prepare " in record.prepare.__code__.co_filename and (
        record.fence is not None)


def _pool(f, *args, **kwargs) -> _packed.ResidentSlots:
    return _node(f, *args, **kwargs).plan.resident


def _run_fresh(fn, make_args, calls=CALLS, **jit_options):
    """Calls nbjit.jit(fn) and jax.jit(fn) with new values each call; returns the nbjit one."""
    f, g = nbjit.jit(fn, **jit_options), jax.jit(fn, **jit_options)
    for i in range(calls):
        args = make_args(i)
        assert_same_outputs(f(*args), g(*args))
    return f, args


def _fresh_pair(i):
    return np.full(3, i, np.float32), np.full(3, -i / 3, np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes_fresh_values_as_jax(dtype):
    rng = np.random.default_rng(0)
    f, args = _run_fresh(lambda a, b: _ops(a, b),
                         lambda i: (_values(rng, (5,), dtype), _values(rng, (3,), dtype)))
    assert _is_resident(f, *args)
    stats = f.stats()
    assert stats.resident == 1 and stats.packed_compiles == 0 and stats.misses == 1


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.uint64, np.complex128])
def test_64_bit_dtypes_with_x64_on_and_off(x64, dtype):
    rng = np.random.default_rng(1)
    with jax.enable_x64(x64):
        f, args = _run_fresh(lambda a, b: _ops(a, b), lambda i: (_values(rng, (4,), dtype),
                                                                 _values(rng, (1, 3), dtype)))
        assert _is_resident(f, *args)


def test_zero_d_empty_misaligned_strided_and_fortran_arrays():
    rng = np.random.default_rng(2)

    def fn(a, b, c, d, e, s):
        return a + 1, b.sum(), c * 2, d.T @ d, e + s, jnp.cumsum(d)

    def make(i):
        c = _aligned((7,), np.float32, misalign=4)
        c[:] = rng.standard_normal(7)
        return (np.float32(rng.standard_normal()),  # a numpy scalar
                np.zeros((0, 3), np.float32),  # empty: keeps its put (nothing to write)
                c,  # misaligned
                np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32)),
                rng.standard_normal(10).astype(np.float32)[::2],  # non-contiguous
                np.asarray(rng.standard_normal(), np.float32))  # 0-d array

    f, args = _run_fresh(fn, make)
    assert _is_resident(f, *args)
    assert [s.leaf for s in _pool(f, *args).slots] == [0, 2, 3, 4, 5]


def test_python_scalars_keep_weak_types():
    def fn(i, x, b, z, arr):
        return i, x, b, z, arr * x + i, jnp.where(b, arr, -arr) * z

    rng = np.random.default_rng(3)

    def make(k):
        return (1000 + k, 0.5 + k / 3, bool(k % 2), complex(k, -k / 7),
                rng.standard_normal(3).astype(np.float16))

    f, args = _run_fresh(fn, make)
    assert _is_resident(f, *args)
    out = f(*args)
    assert [o.weak_type for o in out[:4]] == [True, True, False, True]


@pytest.mark.parametrize("x64", [False, True])
def test_overflowing_ints_and_rounding_floats_as_jax(x64):
    def fn(i, x, arr):
        return i + 0, x * 1, arr

    with jax.enable_x64(x64):
        f, _ = _run_fresh(fn, lambda k: (k + 1000, k + 0.25, np.full(2, k, np.float32)))
        g = jax.jit(fn)
        arr = np.ones(2, np.float32)
        assert _is_resident(f, 5, 1.5, arr)
        big = 2 ** 63 if x64 else 2 ** 31
        for i in (big - 1, big, -big, -big - 1, 2 ** 64, True):
            assert_same_call(f, g, i, 1.0, arr)
        for x in (1e39, -1e39, float("inf"), float("nan"), 1 / 3, 5e-46, 1.0000000596046448,
                  3.4028235e38, 3.4028235677973366e38):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # jax.jit converts silently: so must we
                nb, jx = f(7, x, arr), g(7, x, arr)
            assert_same_outputs(nb, jx)
            assert np.asarray(nb[1]).tobytes() == np.asarray(jx[1]).tobytes()
        assert_same_outputs(f(8, 2.5, arr), g(8, 2.5, arr))  # the slot still works


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


def test_repeated_values_keep_the_memo():
    f = nbjit.jit(lambda a, b: a + b)
    a, b = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    for _ in range(CALLS):
        f(a, b)
    assert not _is_resident(f, a, b) and f.stats().resident == 0


def test_donation_big_outputs_and_switch_off_stay_per_leaf():
    f = nbjit.jit(lambda a, b, c: (a + b, c * 2), donate_argnums=2)
    for i in range(CALLS):
        f(*_fresh_pair(i), jnp.ones(3))
    assert f.stats().resident == 0
    big = _packed.FENCE_MAX_BYTES // 4 + 1  # every output too big to keep as a fence
    f, args = _run_fresh(lambda a: jnp.broadcast_to(a[0], (big,)),
                         lambda i: (np.full(3, i, np.float32),))
    assert f.stats().resident == 0 and not _is_resident(f, *args)
    f, args = _run_fresh(lambda a: (), lambda i: (np.full(3, i, np.float32),))  # no outputs
    assert f.stats().resident == 0
    _packed.set_enabled(False)
    try:
        f, args = _run_fresh(lambda a, b: a - b, _fresh_pair)
        assert f.stats().resident == 0 and not _is_resident(f, *args)
    finally:
        _packed.set_enabled(True)


def test_the_fence_is_the_smallest_output():
    """A slot keeps one output alive until it is reused: the smallest one."""
    f, args = _run_fresh(lambda a: (jnp.tile(a, 100), a.sum(), a * 2),
                         lambda i: (np.full(4, i, np.float32),))
    pool = _pool(f, *args)
    out = f(*args)
    assert pool.fence_index == 1
    assert all(slot[0] is None or slot[0].shape == () for slot in pool.free)
    assert any(slot[0] is out[1] for slot in pool.free)


@pytest.mark.parametrize("cap", [1, _packed.RESIDENT_CAP])
def test_caller_overwrites_its_arrays_right_after_each_call(cap, monkeypatch):
    """Slow computations dispatched without waiting (many in flight); the
    caller overwrites its aligned arrays right after each call, the first
    (the miss) included: no result changes, and no slot is written while a
    call in flight reads it. With one slot, reusing it without the fence
    test gave 170 wrong results of 200 (a probe)."""
    monkeypatch.setattr(_packed, "RESIDENT_CAP", cap)
    n = 1 << 12

    def fn(a, b):
        x = a
        for _ in range(30):
            x = jnp.sin(x) * 1.0001 + b
        return x, jnp.sum(b)

    f, g = nbjit.jit(fn), jax.jit(fn)
    a, b = _aligned((n,), np.float32), _aligned((n,), np.float32)
    results, expected = [], []
    for i in range(200):
        a[:] = i
        b[:] = -i / 7
        expected.append(g(a.copy(), b.copy()))
        results.append(f(a, b))
        a[:] = 12345.0
        b[:] = -99.0
    assert _is_resident(f, a, b) and f.stats().packed_compiles == 0
    wrong = sum(not np.array_equal(np.asarray(r[0]), np.asarray(e[0]))
                or not np.array_equal(np.asarray(r[1]), np.asarray(e[1]))
                for r, e in zip(results, expected, strict=True))
    assert wrong == 0


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
    assert_same_outputs(f(*_fresh_pair(3)), jax.jit(lambda a, b: a - b)(*_fresh_pair(3)))


def test_outputs_never_alias_slot_memory():
    f, args = _run_fresh(lambda a, b: (a, b, a + 0), _fresh_pair)
    pool = _pool(f, *args)
    ranges = [(s[-1].ctypes.data, s[-1].ctypes.data + s[-1].nbytes) for s in pool.free]
    for i in range(8):
        for out in f(*_fresh_pair(i)):
            p = out.unsafe_buffer_pointer()
            assert not any(lo <= p < hi for lo, hi in ranges)


def test_threads_sharing_one_function():
    def fn(a, b, s):
        return a * s + b, jnp.sum(a)

    f, g = nbjit.jit(fn), jax.jit(fn)

    def worker(seed):
        rng = np.random.default_rng(seed)
        for i in range(120):
            a = rng.standard_normal(6).astype(np.float32)
            b = rng.standard_normal(6).astype(np.float32)
            s = float(i) + seed
            expected = g(a.copy(), b.copy(), s)
            out = f(a, b, s)
            a[:] = 0  # the caller reuses its buffers at once
            b[:] = 0
            assert_same_outputs(out, expected)

    errors = run_threads(worker, 4)
    assert not errors, errors[0]
    zeros = np.zeros(6, np.float32)
    assert f.stats().resident == 1 and _is_resident(f, zeros, zeros, 1.0)


@pytest.mark.parametrize("level", ["log", "disallow"])
def test_transfer_guards_as_jax(level, caplog):
    f, g = nbjit.jit(lambda a, b: a + b), jax.jit(lambda a, b: a + b)
    for i in range(CALLS):
        f(*_fresh_pair(i))
    a, b = np.full(3, 5, np.float32), np.full(3, 6, np.float32)
    assert _is_resident(f, a, b)
    with jax.transfer_guard(level):
        nb, jx = assert_same_call(f, g, a, b)
    if level == "disallow":
        assert isinstance(nb, Exception) and type(nb) is type(jx)
    else:
        assert_same_outputs(nb, jx)
    assert f.stats().slow_reasons.get("input_refused", 0) == 1
    assert_same_outputs(f(a, b), g(a, b))  # unguarded again: resident


def test_cache_clearing_and_trace_context():
    f = nbjit.jit(lambda a, b: a * 2 + b)
    g = jax.jit(lambda a, b: a * 2 + b)

    def run():
        for i in range(CALLS):
            args = _fresh_pair(i)
            assert_same_outputs(f(*args), g(*args))
        return args

    assert _is_resident(f, *run())
    f.clear_cache()
    assert f._cache_size() == 0
    run()
    jax.clear_caches()
    assert f._cache_size() == 0
    assert _is_resident(f, *run()) and f.stats().resident == 3
    with jax.enable_x64(True):  # another trace context: its own node and slots
        for i in range(CALLS):
            a = (np.full(3, i, np.float64), np.full(3, -i, np.float64))
            assert_same_outputs(f(*a), g(*a))
        assert _is_resident(f, *a)
    assert f._cache_size() == 2 and f.stats().resident == 4


def test_slots_die_with_the_function_without_a_gc_pass():
    """No reference cycle holds an executable: the function's death frees its
    executables without a gc pass, and its slots' device arrays with one (a
    generated function and its scope form a cycle); so does clear_cache."""
    def make():
        f = nbjit.jit(lambda a, b: a * b)
        for i in range(CALLS):
            f(1000 + i, 0.5 + i)  # memo misses announce new values
        for i in range(CALLS):
            f(np.full(3000, i, np.float32), np.ones(3000, np.float32))  # no memo: counted
        assert f.stats().resident == 2
        return f

    gc.collect()
    gc.disable()
    try:
        live, arrays = len(_jax.live_executables()), len(jax.live_arrays())
        f = make()
        assert len(_jax.live_executables()) == live + 2
        del f
        assert len(_jax.live_executables()) == live
        gc.collect()
        assert len(jax.live_arrays()) == arrays
        f = make()
        f.clear_cache()
        assert len(_jax.live_executables()) == live
        gc.collect()
        assert len(jax.live_arrays()) == arrays
    finally:
        gc.enable()


def test_a_device_whose_puts_copy_gets_packing_instead(monkeypatch):
    """Where a zero-copy put does not alias host memory (a GPU), no slot is
    made: two or more leaves are packed (a second compile), one stays per-leaf."""
    monkeypatch.setattr(_jax, "ZERO_COPY", _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    f, args = _run_fresh(lambda a, b: a * b, _fresh_pair)
    assert _packed.wait(120)
    assert_same_outputs(f(*args), jax.jit(lambda a, b: a * b)(*args))
    assert not _is_resident(f, *args) and f.stats().resident == 0
    assert f.stats().packed_compiles == 1
    f, args = _run_fresh(lambda a: a + 1, lambda i: (np.full(3, i, np.float32),))
    assert f.stats().resident == 0 and f.stats().packed_compiles == 0


def test_stats_and_the_run_report_name_resident_and_packed_signatures(monkeypatch):
    from nbjit import _report

    f, args = _run_fresh(lambda a, b: a - b, _fresh_pair)
    text = str(f.stats())
    assert f"fresh host inputs of {f.stats().name}: resident 1 (signatures)" in text
    assert "resident 1" in f.stats()._repr_html_()
    monkeypatch.setattr(_packed, "RESIDENT", False)
    g, args = _run_fresh(lambda a, b: a * b - 1, _fresh_pair)
    assert _packed.wait(120)
    assert "packed 1 (" in str(g.stats()) and ": resident" not in str(g.stats())
    report = _report.build(None)
    rows = {r["name"]: r for r in report["functions"]}
    assert rows[f.stats().name]["resident"] == 1 and rows[g.stats().name]["packed_compiles"] == 1
    out = _report.format_text(report)
    assert f"fresh host inputs of {f.stats().name}: resident 1" in out
    assert f"fresh host inputs of {g.stats().name}: packed 1 (" in out
    h = nbjit.jit(lambda a: a + 1)
    h(jnp.ones(2))
    assert "fresh host inputs" not in str(h.stats())
