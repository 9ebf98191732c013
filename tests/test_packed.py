"""Packed host inputs (nbjit/host/packing.py): fresh host values in one transfer per call.

Resident inputs are switched off here (`_packing_only`): they come first
on the CPU and are tested in tests/test_resident.py; the differential tests
over dtypes, layouts and scalar conversions run both ways (`mode`).

A signature whose small host leaves keep bringing new values gets a second
executable that unpacks them from one staging buffer. Every test compares
with jax.jit, exactly (values, dtypes, weak types, shardings, committedness,
tree), and checks that the packed record really ran (`packed_compiles`, the
record's generated preparer).
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
from _threads import run_threads

import nbjit
from nbjit.host import packing as _packing
from nbjit.host import policy as _policy
from nbjit.host import slots as _slots
from nbjit.host import staging as _host_staging
from nbjit.host import watch as _watch

pytestmark = pytest.mark.cpu_host_memory  # tests/conftest.py

CALLS = 3 * _policy.PACK_AFTER  # enough fresh calls to pack, then run packed


@pytest.fixture(autouse=True)
def _packing_only(monkeypatch):
    """Packing as where resident inputs are not possible (a GPU): on the CPU
    resident inputs come first (tests/test_resident.py)."""
    monkeypatch.setattr(_policy, "RESIDENT", False)


@pytest.fixture(params=["packed", "resident"])
def mode(request, monkeypatch):
    """For the differential tests both ways share: packing, or resident slots."""
    monkeypatch.setattr(_policy, "RESIDENT", request.param == "resident")
    return request.param


def _is_fast(f, mode, *args) -> bool:
    """Whether `f`'s signature for `args` runs packed or resident, as `mode` says."""
    if mode == "packed":
        return _is_packed(f, *args)
    node, _ = f._entry_for(args, {})
    return node is not None and node.record.fence is not None and (
        "<resident prepare " in node.record.prepare.__code__.co_filename)


def _is_packed(f, *args, **kwargs) -> bool:
    node, _ = f._entry_for(args, kwargs)
    return node is not None and "<packed prepare " in node.record.prepare.__code__.co_filename


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
        if i == _policy.PACK_AFTER + 2:
            assert _packing.wait(120)  # the background compile done: the rest run packed
        args = make_args(i)
        assert_same_outputs(f(*args), g(*args))
    assert _packing.wait(120)
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
    if mode == "packed":
        assert stats.packed_compiles == 1 and stats.packed_seconds > 0 and stats.resident == 0
    else:
        assert stats.resident == 1 and stats.packed_compiles == 0 and stats.misses == 1


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
        assert_same_outputs(f(8, 2.5, arr), g(8, 2.5, arr))  # still packed or resident


def test_reductions_dots_and_fused_chains_bit_for_bit():
    """The packed program is other HLO than the original: its results must
    still equal jax.jit's bit for bit where XLA could reorder."""
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
    assert _is_packed(f, *args)


def test_convolutions_scans_sorts_and_half_precision_bit_for_bit():
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
    assert _is_packed(f, *args)


def test_log_compiles_shows_the_packed_compile(caplog):
    """A deliberate difference from jax.jit: packing compiles a second
    executable (named packed_<function>), which jax.log_compiles reports."""
    def add_pair(a, b):
        return a + b

    f = nbjit.jit(add_pair)
    jax.config.update("jax_log_compiles", True)  # (a thread-local setting: not in the thread)
    try:
        with caplog.at_level("WARNING"):
            for i in range(CALLS):
                f(np.full(3, i, np.float32), np.ones(3, np.float32))
            assert _packing.wait(120)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert f.stats().packed_compiles == 1
    assert any("packed_add_pair" in r.getMessage() for r in caplog.records)


def test_train_step_several_small_batch_leaves():
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
    assert _is_packed(f, *args)


def test_repeated_values_keep_the_memo_and_do_not_pack(mode):
    f = nbjit.jit(lambda a, b: a + b)
    a, b = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    for _ in range(CALLS):
        f(a, b)
    assert not _is_fast(f, mode, a, b)
    assert f.stats().packed_compiles == 0 and f.stats().resident == 0
    for s in range(CALLS):
        f(1000 + s, 2.5)  # another signature, fresh values: packed or resident
    assert _packing.wait(120)
    assert _is_fast(f, mode, 1, 2.5) and not _is_fast(f, mode, a, b)


def test_one_host_leaf_is_not_packed():
    f, args = _run_fresh(lambda x, y: x * y, lambda i: (np.full(3, i, np.float32), jnp.ones(3)))
    assert not _is_packed(f, *args) and f.stats().packed_compiles == 0


def test_donation_big_leaves_and_switch_off_are_not_packed():
    f = nbjit.jit(lambda a, b, c: (a + b, c * 2), donate_argnums=2)
    for i in range(CALLS):
        f(np.full(3, i, np.float32), np.ones(3, np.float32), jnp.ones(3))
    assert _packing.wait(120)
    assert f.stats().packed_compiles == 0
    big = _watch.SLOT_MAX_BYTES // 4 + 1
    f, args = _run_fresh(lambda a, b: a[:3] + b, lambda i: (
        np.full(big, i, np.float32), np.full(3, -i, np.float32)))
    assert f.stats().packed_compiles == 0
    _policy.set_enabled(False)
    try:
        f, args = _run_fresh(lambda a, b: a - b, lambda i: (np.full(3, i, np.float32),
                                                            np.full(3, -i, np.float32)))
        assert f.stats().packed_compiles == 0 and not _is_packed(f, *args)
    finally:
        _policy.set_enabled(True)


def test_environment_switch():
    code = ("import nbjit.host.policy as p, sys; sys.exit(0 if p.enabled() is False else 1)")
    env = {"NBJIT_PACK_HOST_INPUTS": "0", "PATH": "/usr/bin:/bin",
           **{k: v for k, v in __import__("os").environ.items() if k.startswith(("PYTHON", "JAX"))}}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0


@pytest.mark.parametrize("way", ["packed", "resident", "resident, one slot"])
def test_caller_overwrites_its_arrays_right_after_each_call(way, monkeypatch):
    """Slow computations dispatched without waiting (calls in flight); the
    caller overwrites its (64-byte aligned) arrays right after each call, the
    first (the miss) included: no result changes, and no staging buffer or
    slot is written while a call in flight reads it. With one slot, reusing
    it without the fence test gave 170 wrong results of 200 (a probe)."""
    monkeypatch.setattr(_policy, "RESIDENT", way != "packed")
    if way == "resident, one slot":
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
        if i == _policy.PACK_AFTER + 2:
            assert _packing.wait(120)  # the rest run packed
    assert _is_fast(f, "packed" if way == "packed" else "resident", a, b)
    assert f.stats().packed_compiles == (way == "packed")
    wrong = sum(not np.array_equal(np.asarray(r[0]), np.asarray(e[0]))
                or not np.array_equal(np.asarray(r[1]), np.asarray(e[1]))
                for r, e in zip(results, expected, strict=True))
    assert wrong == 0


def test_pool_is_capped_and_reused(monkeypatch):
    monkeypatch.setattr(_packing, "POOL_CAP", 3)
    n = 1 << 12

    def fn(a, b):
        x = a
        for _ in range(20):
            x = jnp.cos(x) + b
        return x

    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(7)
    before = _host_staging.host_staging_size()
    pending = []
    for i in range(60):  # many calls in flight: beyond the cap, fresh unpooled buffers
        if i == _policy.PACK_AFTER + 2:
            assert _packing.wait(120)
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        pending.append((f(a, b), g(a, b)))
    assert _is_packed(f, a, b)
    assert _host_staging.host_staging_size() - before <= 3
    for nb, jx in pending:
        assert_same_outputs(nb, jx)
    node, _ = f._entry_for((a, b), {})
    staging = node.record.prepare.__globals__["staging"]
    del pending
    jax.effects_barrier()
    for _ in range(10):
        a = rng.standard_normal(n).astype(np.float32)
        assert_same_outputs(f(a, b), g(a, b))
    assert staging.made <= 3 and len(staging.free) >= 1  # free buffers are reused


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
    assert _packing.wait(120)
    assert not errors, errors[0]
    stats = f.stats()
    assert (stats.packed_compiles, stats.resident) == ((1, 0) if mode == "packed" else (0, 1))
    zeros = np.zeros(6, np.float32)
    assert _is_fast(f, mode, zeros, zeros, 1.0)


@pytest.mark.parametrize("level", ["log", "disallow"])
def test_transfer_guards_as_jax(level, caplog, mode):
    f, g = nbjit.jit(lambda a, b: a + b), jax.jit(lambda a, b: a + b)
    for i in range(CALLS):
        f(np.full(3, i, np.float32), np.ones(3, np.float32))
    assert _packing.wait(120)
    a, b = np.full(3, 5, np.float32), np.full(3, 6, np.float32)
    assert _is_fast(f, mode, a, b)
    with jax.transfer_guard(level):
        nb, jx = assert_same_call(f, g, a, b)
    if level == "disallow":
        assert isinstance(nb, Exception) and type(nb) is type(jx)
    else:
        assert_same_outputs(nb, jx)
    assert f.stats().slow_reasons.get("input_refused", 0) == 1
    assert_same_outputs(f(a, b), g(a, b))  # unguarded again: packed or resident


def test_failed_and_interrupted_compiles_leave_the_function_working(monkeypatch):
    real = _packing.compile_packed

    def failing(watched, record, leaves):
        raise RuntimeError("compile failed")

    monkeypatch.setattr(_packing, "compile_packed", failing)
    f, args = _run_fresh(lambda a, b: a - b, lambda i: (np.full(3, i, np.float32),
                                                        np.full(3, 2 * i, np.float32)))
    assert not _is_packed(f, *args)

    calls = []

    def interrupted(watched, record, leaves):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(watched, record, leaves)

    monkeypatch.setattr(_packing, "compile_packed", interrupted)
    for background in (True, False):  # on its thread: the calls never see it
        monkeypatch.setattr(_policy, "BACKGROUND", background)
        calls.clear()
        f, g = nbjit.jit(lambda a, b: a * b), jax.jit(lambda a, b: a * b)
        raised = 0
        for i in range(3 * CALLS):
            args = (np.full(3, i, np.float32), np.full(3, 2 * i, np.float32))
            try:
                out = f(*args)
            except KeyboardInterrupt:
                raised += 1
                continue
            assert_same_outputs(out, g(*args))
            if i % 4 == 0:
                assert _packing.wait(120)
        assert _packing.wait(120)
        assert raised == (0 if background else 1) and len(calls) == 2 and _is_packed(f, *args)


def test_a_context_the_thread_cannot_enter_compiles_on_the_calling_thread(monkeypatch):
    """The compile thread runs only in the caller's exact trace context; one
    it cannot enter (here: no State known to it, x64 on in the caller; in
    practice a context manager that is not a config State) makes it hand
    the compile back to the calling thread."""
    from nbjit import _jax

    monkeypatch.setattr(_jax, "trace_context_states", [None] * len(_jax.trace_context_states))
    with jax.enable_x64(True):
        f, args = _run_fresh(lambda a, b: a * 2 - b, lambda i: (np.full(3, i, np.float64),
                                                               np.full(3, -i, np.float64)))
        assert _is_packed(f, *args) and f.stats().packed_compiles == 1
        node, _ = f._entry_for(args, {})
        assert node.host_policy.sync
        assert f(*args).dtype == np.float64


def test_config_options_registered_after_import_still_pack_off_thread(monkeypatch):
    """A library imported after nbjit may register config options that enter
    jit's trace context (seen with equinox's test suite loaded): the compile
    thread reads the states again rather than giving the signature up."""
    from nbjit import _jax

    monkeypatch.setattr(_policy, "RESIDENT", False)
    monkeypatch.setattr(_jax, "trace_context_states", _jax.trace_context_states[:-1])  # stale
    f, args = _run_fresh(lambda a, b: a * 3 - b, lambda i: (np.full(3, i, np.float32),
                                                            np.full(3, -i, np.float32)))
    assert _is_packed(f, *args) and f.stats().packed_compiles == 1
    node, _ = f._entry_for(args, {})
    assert not node.host_policy.sync  # compiled on its own thread, not handed back
    assert len(_jax.trace_context_states) == len(_jax.trace_context())


def test_cache_clearing_the_lru_and_trace_context(mode):
    f = nbjit.jit(lambda a, b: a * 2 + b)
    g = jax.jit(lambda a, b: a * 2 + b)

    def run():
        for i in range(CALLS):
            args = (np.full(3, i, np.float32), np.full(3, -i, np.float32))
            assert_same_outputs(f(*args), g(*args))
        assert _packing.wait(120)
        return args

    count = "packed_compiles" if mode == "packed" else "resident"
    args = run()
    assert _is_fast(f, mode, *args)
    f.clear_cache()
    assert f._cache_size() == 0
    run()
    jax.clear_caches()
    assert f._cache_size() == 0
    args = run()
    assert _is_fast(f, mode, *args) and getattr(f.stats(), count) == 3
    with jax.enable_x64(True):  # another trace context: its own node, packed or resident on its own
        for i in range(CALLS):
            a = (np.full(3, i, np.float64), np.full(3, -i, np.float64))
            assert_same_outputs(f(*a), g(*a))
        assert _packing.wait(120)
        assert _is_fast(f, mode, *a)
    assert f._cache_size() == 2 and getattr(f.stats(), count) == 4

    cache = nbjit.PjitFunctionCache(1) if hasattr(nbjit, "PjitFunctionCache") else None
    if cache is not None:  # the LRU: an evicted node takes its packed or resident record
        h = nbjit.core.dispatch.PjitFunction(lambda a, b: a - b, {}, cache)
        for i in range(CALLS):
            h(np.full(2, i, np.float32), np.ones(2, np.float32))
        h(1, 2.0)
        assert _packing.wait(120)
        assert h._cache_size() == 1 and h.stats().evictions == 1


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


def test_packed_executables_and_slots_die_with_the_function_and_clear_cache(mode):
    """No reference cycle holds an executable: the function's death frees its
    executables, packed ones included (and JAX's caches keyed on them),
    without a gc pass; its slots' and memos' device arrays with one (a
    generated function and its scope form a cycle); so does clear_cache."""
    import gc

    from nbjit import _jax

    def make():
        f = nbjit.jit(lambda a, b: a * b)
        for i in range(CALLS):
            f(1000 + i, 0.5 + i)  # memo misses announce new values
        for i in range(CALLS):
            f(np.full(3000, i, np.float32), np.ones(3000, np.float32))  # no memo: counted
        assert _packing.wait(120)
        assert getattr(f.stats(), "packed_compiles" if mode == "packed" else "resident") == 2
        return f

    from nbjit.host import waker as _waker

    _waker.waker(jax.devices()[0])  # (made once per device, kept by the process)
    gc.collect()
    gc.disable()
    try:
        live, arrays = len(_jax.live_executables()), len(jax.live_arrays())
        f = make()
        assert len(_jax.live_executables()) == live + (4 if mode == "packed" else 2)
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
