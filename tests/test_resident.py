"""Resident host inputs (nbjit/host/resident.py, nbjit/host/slots.py): fresh
host values written into device arrays that alias pooled host memory, no
transfer.

A signature whose small host leaves keep bringing new values gets slots:
a staging buffer with a device array over each leaf's view, made once.
Every test compares with jax.jit, exactly (values, dtypes, weak types,
shardings, committedness, tree), and checks that the resident record really
ran (its generated preparer, `stats().resident`), with no second compile.
Big arrays (compared, run before their compare, rotated, the worker woken)
are in tests/test_resident_big.py, the policy in tests/test_host_policy.py;
the differential tests over dtypes, layouts and scalar conversions run
resident and launched in tests/test_fresh_host_values.py (its `mode` fixture).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs
from _host import CALLS, fresh_pair, is_resident, node_of, pool_of, run_fresh
from _threads import run_threads

import nbjit
from nbjit import _jax
from nbjit.host import policy as _policy
from nbjit.host import slots as _slots
from nbjit.host.policy import Stage

pytestmark = pytest.mark.cpu_host_memory  # tests/conftest.py


def test_one_host_leaf_and_a_static_config():
    """One host leaf goes resident: the static-config training step (a params
    dict, a new batch, statics)."""
    params = {"w": jnp.ones((4, 2)) * 0.5, "b": jnp.zeros(2)}

    def step(params, batch, scale, *, act):
        h = batch @ params["w"] + params["b"]
        return jax.tree.map(lambda p: p * scale, params), (jnp.tanh(h) if act else h).sum()

    rng = np.random.default_rng(4)
    f, args = run_fresh(lambda p, x, s: step(p, x, s, act=True),
                         lambda i: (params, rng.standard_normal((8, 4)).astype(np.float32), 2.0),
                         static_argnums=(2,))
    assert is_resident(f, *args) and f.stats().misses == 1
    g, h = nbjit.jit(step, static_argnums=(2,), static_argnames=("act",)), jax.jit(
        step, static_argnums=(2,), static_argnames=("act",))
    for i in range(CALLS):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        assert_same_outputs(g(params, x, 0.5, act=i % 2 == 0), h(params, x, 0.5, act=i % 2 == 0))
    assert g._cache_size() == 2 and g.stats().resident == 2


def test_no_second_compile_and_no_compile_log(caplog):
    """Resident inputs run the signature's own executable: nothing compiles again."""
    def add_pair(a, b):
        return a + b

    f = nbjit.jit(add_pair)
    before = _jax.jax_cache_misses()
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING"):
            for i in range(CALLS):
                f(*fresh_pair(i))
    finally:
        jax.config.update("jax_log_compiles", False)
    assert is_resident(f, *fresh_pair(0))
    assert f.stats().misses == 1
    compiled = [r for r in caplog.records if "add_pair" in r.getMessage()
                and "Compiling" in r.getMessage()]
    assert len(compiled) == 1, [r.getMessage() for r in compiled]
    assert _jax.jax_cache_misses()[1] - before[1] <= 1


def test_donation_no_outputs_and_switch_off_stay_per_leaf():
    f = nbjit.jit(lambda a, b, c: (a + b, c * 2), donate_argnums=2)
    for i in range(CALLS):
        f(*fresh_pair(i), jnp.ones(3))
    assert f.stats().resident == 0
    f, args = run_fresh(lambda a: (), lambda i: (np.full(3, i, np.float32),))  # no outputs
    assert f.stats().resident == 0
    _policy.set_enabled(False)
    try:
        f, args = run_fresh(lambda a, b: a - b, fresh_pair)
        assert f.stats().resident == 0 and not is_resident(f, *args)
    finally:
        _policy.set_enabled(True)


def test_the_fence_is_the_smallest_output():
    """A slot keeps one output alive while its call may run: the smallest one."""
    f, args = run_fresh(lambda a: (jnp.tile(a, 100), a.sum(), a * 2),
                         lambda i: (np.full(4, i, np.float32),))
    pool = pool_of(f, *args)
    out = f(*args)
    assert pool.fence_index == 1
    assert all(slot[0] is None or slot[0].shape == () for slot in pool.free)
    assert any(slot[0] is out[1] for slot in pool.free)


def _arrays_over(pool: _slots.ResidentSlots) -> list:
    """The live arrays whose buffers lie in `pool`'s slots."""
    spans = [(s[-1].ctypes.data, s[-1].ctypes.data + s[-1].nbytes) for s in pool.free]
    return [a for a in jax.live_arrays()
            if any(lo <= _jax.buffer_address(a) < hi for lo, hi in spans)]


def test_live_arrays_list_each_slot_array_once_and_no_dropped_output():
    """jax.live_arrays() lists each slot's device arrays once (asking a buffer's
    address made jaxlib keep a second array over it), and, once the calls are
    done and a collection ran, none of the outputs the caller dropped."""
    import gc

    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    f, args = run_fresh(lambda a, b: (a * b, (a + b).sum()), fresh_pair)
    pool = pool_of(f, *args)
    jax.block_until_ready(f(*args))
    assert any(slot[0] is not None for slot in pool.free)  # fences held while calls may run
    _slots.sweep_ready_fences()  # what the sweeper thread does every SWEEP_EVERY_S
    assert all(slot[0] is None for slot in pool.free)
    gc.collect()
    over = _arrays_over(pool)
    assert len(over) == len({id(a) for a in over}) == pool.made * len(pool.layouts)
    new = [a for a in jax.live_arrays() if id(a) not in before]
    assert sorted(map(id, new)) == sorted(map(id, over))  # nothing else of this function's
    assert_same_outputs(f(*args), jax.jit(lambda a, b: (a * b, (a + b).sum()))(*args))


def test_the_sweeper_thread_drops_ready_fences_while_pools_live():
    """Nothing asks a loop's last fences again until the signature's next call: a
    daemon thread drops them once ready (and stops when no pool is left)."""
    import threading
    import time

    f, args = run_fresh(lambda a, b: (a * b).sum(), fresh_pair)
    pool = pool_of(f, *args)
    jax.block_until_ready(f(*args))
    assert [t for t in threading.enumerate() if t.name == "nbjit-resident-fences"]
    deadline = time.monotonic() + 30  # a wait for the thread, not a timing claim
    while any(slot[0] is not None for slot in pool.free) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(slot[0] is None for slot in pool.free)


def test_a_collected_function_gives_its_slots_back_at_once():
    """A re-defined function (the old one collected): its slots and their arrays
    go with it, by reference counting, without waiting for a collection."""
    import gc
    import weakref

    gc.collect()
    count, held = len(jax.live_arrays()), _slots.resident_bytes()
    gc.disable()
    try:
        for _ in range(3):  # a notebook cell run three times
            f, args = run_fresh(lambda a, b: a * b + 1, fresh_pair)
            pool = weakref.ref(pool_of(f, *args))
            assert pool() is not None and _slots.resident_bytes() > held
            del f, args
            assert pool() is None
            assert (len(jax.live_arrays()), _slots.resident_bytes()) == (count, held)
    finally:
        gc.enable()


def test_a_busy_slot_is_never_written_and_the_cap_falls_back(monkeypatch):
    """A slot whose fence is not ready is skipped: another slot is made, up to
    the cap; beyond it calls take the per-leaf path. (Readiness is forced
    here: whether the runtime runs a small call inline is its business.)"""
    f, g = nbjit.jit(lambda a, b: (a * b, a.sum())), jax.jit(lambda a, b: (a * b, a.sum()))
    for i in range(CALLS):
        f(*fresh_pair(i))
    pool = pool_of(f, *fresh_pair(0))
    prepare = node_of(f, *fresh_pair(0)).record.prepare
    monkeypatch.setitem(prepare.__globals__, "ready", lambda fence: False)
    monkeypatch.setattr(jax.Array, "is_ready", lambda self: False, raising=False)
    monkeypatch.setattr(_jax.ArrayImpl, "is_ready", lambda self: False)
    made = pool.made
    outs = []
    for i in range(pool.cap + 3):
        args = fresh_pair(100 + i)
        outs.append((f(*args), g(*args)))
    assert pool.made == pool.cap > made  # a new slot per busy one, then no more
    for nb, jx in outs:
        assert_same_outputs(nb, jx)
    monkeypatch.undo()
    for i in range(4):  # ready again: the slots are reused, none made
        assert_same_outputs(f(*fresh_pair(i)), g(*fresh_pair(i)))
    assert pool.made == pool.cap and is_resident(f, *fresh_pair(0))


def test_deleted_fences_retire_slots_then_the_signature_gives_them_up():
    """The fence donated elsewhere (or deleted) says nothing about its call:
    its slot is never used again; after MAX_RETIRED such slots the
    signature goes back to per-leaf puts."""
    f = nbjit.jit(lambda a, b: (a + b, b * 2))
    g = jax.jit(lambda a, b: (a + b, b * 2))
    consume = jax.jit(lambda x: x + 1, donate_argnums=0)
    for i in range(CALLS):
        f(*fresh_pair(i))
    pool = pool_of(f, *fresh_pair(0))
    for i in range(pool.MAX_RETIRED + 2):
        args = fresh_pair(i)
        nb, jx = f(*args), g(*args)
        assert_same_outputs(nb, jx)
        consume(nb[0])  # the fence (the smallest output; here the first) is donated
        assert nb[0].is_deleted()
    assert pool.broken and pool.retired >= pool.MAX_RETIRED
    assert not is_resident(f, *fresh_pair(0))
    node = node_of(f, *fresh_pair(0))
    assert node.host_policy.stage is Stage.GIVEN_UP and node.record is node.host_policy.per_leaf
    for i in range(4):
        assert_same_outputs(f(*fresh_pair(i)), g(*fresh_pair(i)))


def test_an_output_aliasing_a_slot_gives_slots_up():
    """Checked on the first resident call (never seen: outputs are new buffers)."""
    f = nbjit.jit(lambda a, b: a - b)
    for i in range(CALLS):
        f(*fresh_pair(i))
    pool = pool_of(f, *fresh_pair(0))
    slot = pool.free[0]

    class Aliasing:
        size = 1

        def unsafe_buffer_pointer(self):
            return slot[-1].ctypes.data

    assert not pool._check_outputs(slot, [Aliasing()])
    assert pool.broken and not is_resident(f, *fresh_pair(0))
    assert node_of(f, *fresh_pair(0)).host_policy.stage is Stage.GIVEN_UP
    assert_same_outputs(f(*fresh_pair(3)), jax.jit(lambda a, b: a - b)(*fresh_pair(3)))


def test_outputs_never_alias_slot_memory():
    f, args = run_fresh(lambda a, b: (a, b, a + 0), fresh_pair)
    pool = pool_of(f, *args)
    ranges = [(s[-1].ctypes.data, s[-1].ctypes.data + s[-1].nbytes) for s in pool.free]
    for i in range(8):
        for out in f(*fresh_pair(i)):
            p = out.unsafe_buffer_pointer()
            assert not any(lo <= p < hi for lo, hi in ranges)


def test_a_device_whose_puts_copy_keeps_its_puts(monkeypatch):
    """Where a zero-copy put does not alias host memory, no slot is made: the
    signature keeps a put per leaf (jax.jit's executable, nothing compiled)."""
    monkeypatch.setattr(_jax, "ZERO_COPY", _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    for fn, make in ((lambda a, b: a * b, fresh_pair),
                     (lambda a: a + 1, lambda i: (np.full(3, i, np.float32),))):
        f, args = run_fresh(fn, make)
        assert_same_outputs(f(*args), jax.jit(fn)(*args))
        assert not is_resident(f, *args) and f.stats().resident == 0
        assert node_of(f, *args).host_policy.stage is Stage.GIVEN_UP and f.stats().misses == 1


def test_stats_and_the_run_report_name_resident_signatures():
    from nbjit.observe import report as _report

    f, args = run_fresh(lambda a, b: a - b, fresh_pair)
    text = str(f.stats())
    resident = ("1 signature keeps them in reused device buffers (resident: no transfer, "
                "written when they change)")
    assert f"host inputs of {f.stats().name}: {resident}" in text
    assert resident in f.stats()._repr_html_()
    report = _report.build(None)
    rows = {r["name"]: r for r in report["functions"]}
    assert rows[f.stats().name]["resident"] == 1
    out = _report.format_text(report)
    assert f"host inputs of {f.stats().name}: {resident}" in out
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
    f, args = run_fresh(lambda a, b: a @ b, lambda i: same, calls=2)
    assert is_resident(f, *args) and f.stats().resident == 1
    assert node_of(f, *args).host_policy.stage is Stage.RESIDENT
    g, args = run_fresh(lambda a, b: a @ b - 1,
                         lambda i: (np.full(n, i, np.float32), np.ones(n, np.float32)))
    assert is_resident(g, *args) and g.stats().resident == 1
    buffer = np.zeros(n, np.float32)

    def written_in_place(i):
        buffer[:] = i
        return buffer, same[1]

    h, args = run_fresh(lambda a, b: a @ b + 1, written_in_place)
    assert is_resident(h, *args) and h.stats().resident == 1


def test_small_same_values_keep_the_memo():
    """Leaves within the memo's limit: the same values reuse their device copy
    (no copy at all), so they get no slots; new values do (tests above)."""
    same = (np.ones(8, np.float32), np.full(8, 2, np.float32))
    f, args = run_fresh(lambda a, b: a @ b, lambda i: same)
    assert not is_resident(f, *args) and f.stats().resident == 0


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
    f, args = run_fresh(fn, lambda i: (p, x), calls=4)
    assert is_resident(f, *args) and f.stats().misses == 1
    f, args = run_fresh(fn, lambda i: (p, x * i), calls=4)
    assert is_resident(f, *args)
    fortran = np.asfortranarray(x)
    strided = np.repeat(x, 2, axis=1)[:, ::2]
    wide = x.astype(np.float64)  # x64 off: converted to float32, as jaxlib does
    for y in (fortran, strided, wide):
        assert_same_outputs(f(p, y), jax.jit(fn)(p, y))
    assert f.stats().misses == 1


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
    assert is_resident(f, a, jnp.float32(0)) and f.stats().misses == 1


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
    assert is_resident(f, a, jnp.float32(0)) and f.stats().resident == 1


def test_slot_memory_is_bounded(monkeypatch):
    """Per signature: slots and fences within SIGNATURE_MAX_BYTES (one slot at
    least); per process: PROCESS_MAX_BYTES, beyond which calls take the puts;
    a function's slots are given back when it dies."""
    import gc

    def fn(a):
        return a * 2  # the fence is the only output: as big as the input

    n = 1 << 18  # 1 MiB
    f, args = run_fresh(fn, lambda i: (np.full(n, i, np.float32),), calls=3)
    pool = pool_of(f, *args)
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

    g, args = run_fresh(fn2, lambda i: (np.full(n, -i, np.float32),), calls=6)
    assert not is_resident(g, *args) and g.stats().resident == 0  # no room: puts
    assert_same_outputs(g(*args), jax.jit(fn2)(*args))


def test_a_device_whose_puts_copy_keeps_puts_for_big_leaves(monkeypatch):
    """Where a zero-copy put does not alias host memory (a GPU), a big leaf
    keeps its own put (a copy to the device in any case): no slots, the same
    results."""
    monkeypatch.setattr(_jax, "ZERO_COPY", _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    n = 1 << 16
    f, args = run_fresh(lambda a, b: a * b[0], lambda i: (
        np.full(n, i, np.float32), np.full(4, -i, np.float32)))
    assert not is_resident(f, *args) and f.stats().resident == 0
