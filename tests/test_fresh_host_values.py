"""Fresh host values each call, on both fast ways: resident slots (the
CPU's host memory, `nbjit.host`) and launch records (an accelerator's:
host leaves handed to jaxlib's own put, `nbjit.core.inputs.launch`; run on
the CPU too, where the tests plug the accelerator's strategy in).

Both run jax.jit's own executable for the signature; every test compares
with jax.jit, exactly (values, dtypes, weak types, shardings, committedness,
tree), and checks that the fast way really ran (`_is_fast`).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs
from _jax_events import count_events
from _threads import run_threads

import nbjit
from nbjit.core.inputs import platforms as _platforms
from nbjit.host import policy as _policy
from nbjit.host import slots as _slots

CALLS = 3 * _policy.ARM_AFTER  # enough fresh calls to arm, then run the fast way

MODES = [pytest.param("resident", marks=pytest.mark.cpu_host_memory), "launch"]


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    """Resident slots (the CPU's), or launch records (an accelerator's own
    strategy; on the CPU, plugged in for it)."""
    if request.param == "launch":
        platform = jax.devices()[0].platform
        if platform == "cpu":
            monkeypatch.setitem(_platforms._plugged, "cpu", _platforms.STAGED)
        assert _platforms.strategy_for(platform).launches
    return request.param


def _is_fast(f, mode, *args) -> bool:
    """Whether `f`'s signature for `args` runs resident or launched, as `mode` says."""
    node, _ = f._entry_for(args, {})
    if node is None or node.record is None:
        return False
    if mode == "launch":
        return node.record.launch is not None
    return node.record.fence is not None and (
        "<resident prepare " in node.record.prepare.__code__.co_filename)


def _aligned(shape, dtype, misalign: int = 0) -> np.ndarray:
    """A C-contiguous ndarray whose data pointer is `misalign` mod 64."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = (-raw.ctypes.data + misalign) % 64
    return raw[start:start + n].view(dtype).reshape(shape)


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def _run_fresh(fn, make_args, calls=CALLS, **jit_options):
    """Calls nbjit.jit(fn) and jax.jit(fn) with new values each call; returns the nbjit one."""
    f, g = nbjit.jit(fn, **jit_options), jax.jit(fn, **jit_options)
    for i in range(calls):
        args = make_args(i)
        assert_same_outputs(f(*args), g(*args))
    return f, args


def _ops(a, b):
    if a.dtype == jnp.bool_:
        return a, b, a[:3] & b, jnp.sum(a)
    return a, b, a[:3] + b, a[:3] * b, jnp.sum(a), jnp.real(a).astype(jnp.float32)


DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint32, np.int32, np.float16,
          ml_dtypes.bfloat16, np.float32, np.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes_fresh_values_as_jax(dtype, mode):
    rng = np.random.default_rng(0)
    f, args = _run_fresh(lambda a, b: _ops(a, b),
                         lambda i: (_values(rng, (5,), dtype), _values(rng, (3,), dtype)))
    assert _is_fast(f, mode, *args)
    stats = f.stats()
    assert stats.resident == (mode == "resident") and stats.misses == 1


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.uint64, np.complex128])
def test_64_bit_dtypes_with_x64_on_and_off(x64, dtype, mode):
    rng = np.random.default_rng(1)
    with jax.enable_x64(x64):
        f, args = _run_fresh(lambda a, b: _ops(a, b), lambda i: (_values(rng, (4,), dtype),
                                                                 _values(rng, (1, 3), dtype)))
        assert _is_fast(f, mode, *args)


def test_zero_d_empty_misaligned_strided_and_fortran_arrays(mode):
    rng = np.random.default_rng(2)

    def fn(a, b, c, d, e, s):
        return a + 1, b.sum(), c * 2, d.T @ d, e + s, jnp.cumsum(d)

    def make(i):
        c = _aligned((7,), np.float32, misalign=4)
        c[:] = rng.standard_normal(7)
        return (np.float32(rng.standard_normal()),  # a numpy scalar
                np.zeros((0, 3), np.float32),  # empty
                c,  # misaligned
                np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32)),
                rng.standard_normal(10).astype(np.float32)[::2],  # non-contiguous
                np.asarray(rng.standard_normal(), np.float32))  # 0-d array

    f, args = _run_fresh(fn, make)
    assert _is_fast(f, mode, *args)
    if mode == "resident":  # the empty leaf keeps its put (nothing to write)
        node, _ = f._entry_for(args, {})
        assert [s.leaf for s in node.host_policy.resident.layouts] == [0, 2, 3, 4, 5]


def test_python_scalars_keep_weak_types(mode):
    def fn(i, x, b, z, arr):
        return i, x, b, z, arr * x + i, jnp.where(b, arr, -arr) * z

    rng = np.random.default_rng(3)

    def make(k):
        return (1000 + k, 0.5 + k / 3, bool(k % 2), complex(k, -k / 7),
                rng.standard_normal(3).astype(np.float16))

    f, args = _run_fresh(fn, make)
    assert _is_fast(f, mode, *args)
    out = f(*args)
    assert [o.weak_type for o in out[:4]] == [True, True, False, True]


@pytest.mark.parametrize("x64", [False, True])
def test_overflowing_ints_and_rounding_floats_as_jax(x64, mode):
    def fn(i, x, arr):
        return i + 0, x * 1, arr

    with jax.enable_x64(x64):
        f, _ = _run_fresh(fn, lambda k: (k + 1000, k + 0.25, np.full(2, k, np.float32)))
        g = jax.jit(fn)
        arr = np.ones(2, np.float32)
        assert _is_fast(f, mode, 5, 1.5, arr)
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
        assert_same_outputs(f(8, 2.5, arr), g(8, 2.5, arr))  # still resident or launched


def test_reductions_dots_and_fused_chains_bit_for_bit(mode):
    """jax.jit's own executable runs: results equal jax.jit's bit for bit
    where XLA could reorder."""
    def fn(x, w, b, y):
        h = jnp.tanh(x @ w + b)
        logits = jax.nn.log_softmax(h)
        return (jnp.sum(x), jnp.mean(x, axis=0), jnp.cumsum(w, axis=1), jnp.dot(x, w),
                jnp.einsum("ij,jk->ik", h.T, x), jnp.prod(b), jnp.var(y), jnp.std(x),
                logits, jnp.max(x * w[:, :1].T), (x * 1.1 + 0.3) * x - jnp.exp(-x),
                jnp.linalg.norm(y))

    rng = np.random.default_rng(4)

    def make(i):
        return (rng.standard_normal((32, 16)).astype(np.float32),
                rng.standard_normal((16, 8)).astype(np.float32),
                rng.standard_normal(8).astype(np.float32),
                rng.standard_normal(1000).astype(np.float32))

    f, args = _run_fresh(fn, make, calls=CALLS + 16)
    assert _is_fast(f, mode, *args)


def test_convolutions_scans_sorts_and_half_precision_bit_for_bit(mode):
    def fn(x, y, h, z):
        c = jax.lax.conv_general_dilated(x[None, None], y[None, None, :3, :3], (1, 1), "SAME")

        def body(carry, v):
            return carry * 0.9 + jnp.sum(v), carry

        s, _ = jax.lax.scan(body, 0.0, x)
        return (jnp.sum(x), jnp.sum(x, axis=1), jnp.sum(z), jnp.sum(h), jnp.dot(h, h.T),
                jnp.cumsum(z), jnp.cumprod(z[:50] * 0.01 + 1), jnp.sort(z), jnp.argmax(z), c, s,
                jax.nn.logsumexp(x), jax.nn.softmax(y, axis=0), jnp.mean(y ** 2),
                jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 2), (2, 2), "VALID"),
                jax.lax.top_k(z, 5)[0], jnp.fft.fft(z[:64]).real, x @ y,
                jnp.linalg.norm(x, axis=0), jnp.var(z), jnp.sum(h.astype(jnp.float16)))

    rng = np.random.default_rng(9)

    def make(i):
        return (rng.standard_normal((64, 64)).astype(np.float32),
                rng.standard_normal((64, 64)).astype(np.float32),
                rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16),
                rng.standard_normal(1000).astype(np.float32))

    f, args = _run_fresh(fn, make, calls=CALLS + 8)
    assert _is_fast(f, mode, *args)


def test_no_second_compile_in_a_long_run(mode):
    """The signature's program is jax.jit's, compiled once: a long run of new
    values compiles nothing more (JAX's own compile events)."""
    def add_pair(a, b):
        return a + b

    f = nbjit.jit(add_pair)
    with count_events() as events:
        for i in range(4 * CALLS):
            f(np.full(3, i, np.float32), np.ones(3, np.float32))
    assert events["lower_jaxpr_to_module"] == 1 and events["jit_cpp_cache_miss"] == 1
    assert _is_fast(f, mode, np.ones(3, np.float32), np.ones(3, np.float32))


def test_train_step_several_small_batch_leaves(mode):
    params = {"w": jnp.ones((8, 2)) * 0.1, "b": jnp.zeros(2)}

    def step(params, x, y, mask, weights):
        def loss(p):
            pred = x @ p["w"] + p["b"]
            return jnp.sum(weights * mask * jnp.sum((pred - y) ** 2, axis=1)) / jnp.sum(mask)
        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    rng = np.random.default_rng(5)

    def make(i):
        return (params, rng.standard_normal((16, 8)).astype(np.float32),
                rng.standard_normal((16, 2)).astype(np.float32),
                (rng.random(16) > 0.2).astype(np.float32), rng.random(16).astype(np.float32))

    f, args = _run_fresh(step, make)
    assert _is_fast(f, mode, *args)


@pytest.mark.cpu_host_memory
def test_repeated_values_keep_the_memo_and_are_not_resident():
    f = nbjit.jit(lambda a, b: a + b)
    a, b = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    for _ in range(CALLS):
        f(a, b)
    assert not _is_fast(f, "resident", a, b) and f.stats().resident == 0
    for s in range(CALLS):
        f(1000 + s, 2.5)  # another signature, fresh values: resident
    assert _is_fast(f, "resident", 1, 2.5) and not _is_fast(f, "resident", a, b)


def test_repeated_values_are_put_once_by_the_memo_when_launched(mode):
    """A launch record hands jaxlib the memo's device array for a small value
    seen again (no put at all), and a private copy for a new one."""
    if mode != "launch":
        pytest.skip("the launch record's memo")
    f, g = nbjit.jit(lambda a, b: a + b), jax.jit(lambda a, b: a + b)
    a, b = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    for _ in range(3):
        assert_same_outputs(f(a, b), g(a, b))
    node, _ = f._entry_for((a, b), {})
    staged = node.record.stage([a, b])
    assert all(type(x) is type(jnp.ones(1)) for x in staged)  # memo arrays: no put
    c = np.full(4, 7, np.float32)
    staged = node.record.stage([c, b])
    assert type(staged[0]) is np.ndarray and staged[0] is not c and np.array_equal(staged[0], c)
    assert_same_outputs(f(c, b), g(c, b))


def test_environment_switch():
    code = ("import nbjit.host.policy as p, sys; sys.exit(0 if p.enabled() is False else 1)")
    env = {"NBJIT_PACK_HOST_INPUTS": "0", "PATH": "/usr/bin:/bin",
           **{k: v for k, v in __import__("os").environ.items() if k.startswith(("PYTHON", "JAX"))}}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0


@pytest.mark.parametrize("one_slot", [False, True])
def test_caller_overwrites_its_arrays_right_after_each_call(mode, one_slot, monkeypatch):
    """Slow computations dispatched without waiting (calls in flight); the
    caller overwrites its (64-byte aligned) arrays right after each call, the
    first (the miss) included: no result changes, and no staging buffer or
    slot is written while a call in flight reads it. With one slot, reusing
    it without the fence test gave 170 wrong results of 200 (a probe)."""
    if one_slot and mode != "resident":
        pytest.skip("slots are resident's")
    if one_slot:
        monkeypatch.setattr(_slots, "RESIDENT_CAP", 1)
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
    assert _is_fast(f, mode, a, b)
    wrong = sum(not np.array_equal(np.asarray(r[0]), np.asarray(e[0]))
                or not np.array_equal(np.asarray(r[1]), np.asarray(e[1]))
                for r, e in zip(results, expected, strict=True))
    assert wrong == 0


def test_threads_sharing_one_function(mode):
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
    assert f.stats().resident == (mode == "resident")
    zeros = np.zeros(6, np.float32)
    assert _is_fast(f, mode, zeros, zeros, 1.0)


@pytest.mark.parametrize("level", ["log", "disallow"])
def test_transfer_guards_as_jax(level, caplog, mode):
    f, g = nbjit.jit(lambda a, b: a + b), jax.jit(lambda a, b: a + b)
    for i in range(CALLS):
        f(np.full(3, i, np.float32), np.ones(3, np.float32))
    a, b = np.full(3, 5, np.float32), np.full(3, 6, np.float32)
    assert _is_fast(f, mode, a, b)
    with jax.transfer_guard(level):
        nb, jx = assert_same_call(f, g, a, b)
    if level == "disallow":
        assert isinstance(nb, Exception) and type(nb) is type(jx)
    else:
        assert_same_outputs(nb, jx)
    # a resident call puts nothing, so the guard sends it to JAX's path; a
    # launch record's jaxlib put applies the guard itself, as jax.jit's: it
    # logs and runs, or refuses, and then (as jax.jit's fast path) the call
    # goes to JAX's own path, which raises with JAX's traceback
    assert f.stats().slow_reasons.get("input_refused", 0) == (
        mode == "resident" or level == "disallow")
    assert_same_outputs(f(a, b), g(a, b))  # unguarded again: resident or launched


def test_cache_clearing_the_lru_and_trace_context(mode):
    f = nbjit.jit(lambda a, b: a * 2 + b)
    g = jax.jit(lambda a, b: a * 2 + b)

    def run():
        for i in range(CALLS):
            args = (np.full(3, i, np.float32), np.full(3, -i, np.float32))
            assert_same_outputs(f(*args), g(*args))
        return args

    args = run()
    assert _is_fast(f, mode, *args)
    f.clear_cache()
    assert f._cache_size() == 0
    run()
    jax.clear_caches()
    assert f._cache_size() == 0
    args = run()
    assert _is_fast(f, mode, *args) and f.stats().resident == 3 * (mode == "resident")
    with jax.enable_x64(True):  # another trace context: its own node, resident or launched
        for i in range(CALLS):
            a = (np.full(3, i, np.float64), np.full(3, -i, np.float64))
            assert_same_outputs(f(*a), g(*a))
        assert _is_fast(f, mode, *a)
    assert f._cache_size() == 2 and f.stats().resident == 4 * (mode == "resident")


def test_slow_path_gets_private_copies():
    """A function with effects takes JAX's path on every call; the caller's
    aligned array is overwritten right after each call: no result changes."""
    n = 1 << 12

    def fn(a):
        jax.debug.callback(lambda: None)
        x = a
        for _ in range(30):
            x = jnp.sin(x) * 1.0001
        return x

    f, g = nbjit.jit(fn), jax.jit(fn)
    a = _aligned((n,), np.float32)
    results, expected = [], []
    for i in range(40):
        a[:] = i
        expected.append(g(a.copy()))
        results.append(f(a))
        a[:] = 12345.0
    assert f.stats().slow_reasons.get("effects", 0) >= 39
    assert all(np.array_equal(np.asarray(r), np.asarray(e))
               for r, e in zip(results, expected, strict=True))


def test_executables_slots_and_launchers_die_with_the_function_and_clear_cache(mode):
    """No reference cycle holds an executable: the function's death frees its
    executables (a launcher's jaxlib entries included) without a gc pass;
    its slots' and memos' device arrays with one (a generated function and
    its scope form a cycle); so does clear_cache."""
    import gc

    from nbjit import _jax

    def make():
        f = nbjit.jit(lambda a, b: a * b)
        for i in range(CALLS):
            f(1000 + i, 0.5 + i)  # memo misses announce new values
        for i in range(CALLS):
            f(np.full(3000, i, np.float32), np.ones(3000, np.float32))  # no memo: counted
        assert f.stats().resident == 2 * (mode == "resident")
        assert _is_fast(f, mode, 1, 0.5) and _is_fast(f, mode, *[np.ones(3000, np.float32)] * 2)
        return f

    from nbjit.host import waker as _waker

    _waker.waker(jax.devices()[0])  # (made once per device, kept by the process)
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
