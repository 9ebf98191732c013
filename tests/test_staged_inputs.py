"""Host inputs on a device with memory of its own (an accelerator): launch records.

There a record whose host leaves go to its executable's one device hands
them to jaxlib's own put (`nbjit.core.inputs.launch`): a numpy input as a
private copy in its step's `StagingRing` (put zero copy), unless no one can
write it (`staging.immutable`: then the array itself, decided per call); a
scalar as a private 0-d copy; a big array read during the call. The program
that runs is jax.jit's own executable for the signature, always. JAX's own
path copies every numpy array. The tests run on the default backend: the
accelerator's own strategy there, plugged in for "cpu" on the CPU. Every
output is compared with jax.jit's, bit for bit.
"""

from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs, steps_of

import nbjit
from nbjit import _jax
from nbjit.core.inputs import platforms as _platforms
from nbjit.core.inputs import staging as _staging
from nbjit.core.inputs import values as _values
from nbjit.core.inputs.steps import HostInput


@pytest.fixture
def staged(monkeypatch):
    """The accelerator's strategy (launch records): its own where JAX's
    default backend is one, plugged in for the CPU otherwise."""
    monkeypatch.setitem(_platforms._plugged, jax.devices()[0].platform, _platforms.STAGED)


def _record(f, *args):
    node, _ = f._entry_for(args, {})
    assert node is not None and node.record is not None
    return node.record


def _rings(f, *args):
    return [h.transfer.stage.__self__ for h in steps_of(f, *args)["HostInput"]]


def test_host_inputs_are_staged_and_give_jax_jits_outputs(staged):
    fn = lambda a, b, s: (a * s + b, jnp.sum(a), b.astype(jnp.int32))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(0)
    for _ in range(6):
        a = rng.standard_normal((16, 8)).astype(np.float32)
        b = rng.standard_normal(8)  # float64: converted as jaxlib converts it
        assert_same_outputs(f(a, b, 1.5), g(a, b, 1.5))
    rings = _rings(f, a, b, 1.5)
    assert len(rings) == 3 and all(isinstance(r, _staging.StagingRing) for r in rings)
    assert rings[0].pool.kept.count and rings[0].dtype == np.float32
    assert rings[1].dtype == np.float32  # (x64 off: the canonical dtype)
    record = _record(f, a, b, 1.5)
    # the same 1.5 each call: a copy once, then the memo's device array (another
    # form of that leaf for jaxlib: a second entry of the launcher's)
    assert record.launch is not None and record.launch._cache_size() == 2
    a, b = a + 1, b + 1  # new values: private copies, converted; the scalar a 0-d copy
    staged = record.stage([a, b, 2.5])
    assert [type(x) for x in staged] == [np.ndarray] * 3 and staged[0] is not a
    assert staged[1].dtype == np.float32 and staged[2].shape == () and staged[2] == 2.5


def test_the_program_is_jax_jits_own_executable(staged):
    """A launch record runs the executable jax.jit compiled for the signature
    (one object: nothing compiles twice), and its launcher keeps one entry
    over a long run of new values."""
    fn = lambda x, w: (jnp.tanh(x @ w), jnp.sum(x), jnp.std(x))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    for _ in range(40):
        x = rng.standard_normal((32, 16)).astype(np.float32)
        assert_same_outputs(f(x, w), g(x, w))
    record = _record(f, x, w)
    compiled = jax.jit(fn).lower(x, w).compile()
    assert record.executable is compiled._executable.xla_executable
    assert record.launch._cache_size() == 1 and f.stats().misses == 1


def test_a_write_right_after_the_call_changes_no_result(staged):
    fn = lambda a: jnp.sum(jnp.sin(a) * 2.0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    for n in (7, 2048, 1 << 16):
        want = g(np.full(n, 1.0, np.float32))
        for _ in range(5):
            x = np.full(n, 1.0, np.float32)
            out = f(x)
            x[:] = 5.0
            assert_same_outputs(out, want)


def test_a_staging_buffer_is_written_again_only_once_nothing_holds_it(staged):
    f = nbjit.jit(lambda a: a + 1)
    x = np.arange(64, dtype=np.float32)
    f(x)
    (ring,) = _rings(f, x)
    held = ring.stage(x)  # a holder, as the runtime holds a buffer a transfer reads
    for i in range(3 * ring.pool.cap):
        y = np.full(64, i, np.float32)
        assert_same_outputs(f(y), jax.jit(lambda a: a + 1)(y))
        assert ring.stage(y) is not held
    assert np.array_equal(held, x)  # never overwritten while held
    assert ring.pool.kept.count <= ring.pool.cap


def test_ring_stays_bounded_in_a_loop(staged):
    f = nbjit.jit(lambda a, b: a @ b)
    b = np.eye(32, dtype=np.float32)
    outs = []
    for i in range(100):
        outs.append(f(np.full((32, 32), i, np.float32), b))
        _jax.collect_garbage()
    jax.block_until_ready(outs)
    for ring in _rings(f, np.zeros((32, 32), np.float32), b):
        assert ring.pool.kept.count <= ring.pool.cap
    for i, out in enumerate(outs):
        assert float(out[0, 0]) == float(i)


def test_a_ring_keeps_a_buffer_per_call_in_flight_up_to_its_bytes():
    """Calls still in flight each hold a buffer; the ring keeps new ones (a
    new buffer's first writes fault its pages in) up to RING_CAP, RING_BYTES
    in all, at least RING_MIN, and reuses them once they are let go."""
    staged = _platforms.STAGED
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0])

    def ring(shape):
        return staged.host_transfer(_jax.ShapedArray(shape, np.float32), sharding).stage.__self__

    small, big = ring((16,)).pool, ring((1024, 784)).pool  # 64 B; 3 MiB
    assert small.cap == staged.RING_CAP
    assert big.cap == staged.RING_BYTES // (1024 * 784 * 4) and big.cap >= staged.RING_MIN
    x = np.ones(16, np.float32)
    ring16 = ring((16,))
    pool = ring16.pool
    held = [ring16.stage(x) for _ in range(pool.cap + 5)]  # in flight: none let go
    assert pool.kept.count == pool.cap and len({id(b) for b in held}) == pool.cap + 5
    kept = {id(b) for b in pool.free}
    assert len(kept) == pool.cap
    del held
    again = [ring16.stage(x) for _ in range(pool.cap)]  # let go: the same buffers again
    assert {id(b) for b in again} == kept and pool.kept.count == pool.cap


def test_jax_path_copies_every_numpy_array_on_an_accelerator(monkeypatch):
    # (where JAX's path is not known to have read a host array when the call returns)
    monkeypatch.setattr(_jax, "jax_path_reads_host_arrays_during_call", lambda: False)
    x = np.empty((1 << 15) + 3, np.float32)[3:]  # > 64 KiB and not 64-byte aligned
    assert x.__array_interface__["data"][0] % 64
    (copy,), _ = _values.private_host_copies((x,), {}, (), ())
    assert copy is not x and np.shares_memory(copy, x) is False


def _read_only(x):
    x.flags.writeable = False
    return x


def test_only_memory_no_one_can_write_is_immutable():
    owned = _read_only(np.arange(8, dtype=np.float32))
    assert _staging.immutable(owned)
    assert _staging.immutable(_read_only(owned[2:].reshape(2, 3)))  # a view of it, read-only too
    assert _staging.immutable(np.frombuffer(b"\x00" * 32, np.float32))
    writeable = np.arange(8, dtype=np.float32)
    assert not _staging.immutable(writeable)
    assert not _staging.immutable(_read_only(writeable[:4]))  # its base can still be written
    assert not _staging.immutable(np.frombuffer(bytearray(32), np.float32))
    assert not _staging.immutable(_read_only(np.frombuffer(bytearray(32), np.float32)))
    assert not _staging.immutable(3.0)


def test_an_array_no_one_can_write_is_put_in_place(staged):
    """No copy for an array no write can reach (the zero-copy way, documented
    in docs/host-inputs.md); a read-only view of a writeable array is still
    copied, and a write to its base right after the call changes nothing."""
    fn = lambda a: jnp.sum(jnp.sin(a) * 2.0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    x = _read_only(np.linspace(0, 1, 4096, dtype=np.float32))
    assert_same_outputs(f(x), g(x))
    (ring,) = _rings(f, x)
    assert ring.stage(x) is x
    base = np.full(4096, 1.0, np.float32)
    want = g(base.copy())
    for _ in range(5):
        view = _read_only(base[:])
        staged_view = ring.stage(view)
        assert staged_view is not view and not np.shares_memory(staged_view, base)
        out = f(view)
        base[:] = 5.0
        assert_same_outputs(out, want)
        base[:] = 1.0
    wide = _read_only(np.linspace(0, 1, 4096))  # float64, x64 off: converted, so copied
    assert ring.stage(wide) is not wide
    assert_same_outputs(f(wide), g(wide))


@pytest.mark.parametrize("n", [3, 40])
def test_a_launch_stages_every_host_leaf_in_place_of_many(staged, n):
    """A record of a few leaves stages them in generated code, one of many in
    a loop (`launch.STAGE_UNROLL_MAX`): either way every host leaf (arrays,
    a scalar) is staged in its place among device arrays, and the results
    are jax.jit's even when the caller writes right after the call."""
    fn = lambda *xs: [x * (i + 1) for i, x in enumerate(xs)]  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(n)
    for _ in range(4):
        xs = [rng.standard_normal(5).astype(np.float32) if i % 3 else
              jnp.asarray(rng.standard_normal(5).astype(np.float32)) for i in range(n - 1)]
        xs.append(float(rng.standard_normal()))
        want = g(*xs)
        out = f(*xs)
        for x in xs:
            if isinstance(x, np.ndarray):
                x[:] = 9.0
        assert_same_outputs(out, want)
    stats = f.stats()
    assert (stats.misses, stats.hits, stats.slow) == (1, 3, 0)
    record = _record(f, *xs)
    assert record.launch is not None
    xs[-1] += 1.0  # a new scalar (the one of the last call is the memo's device array)
    staged = record.stage(xs)
    assert len(staged) == n
    for x, y in zip(xs, staged, strict=True):
        if isinstance(x, np.ndarray):  # a private copy, in its place
            assert type(y) is np.ndarray and not np.shares_memory(x, y)
            assert np.array_equal(x, y)
        elif isinstance(x, float):  # a private 0-d copy
            assert type(y) is np.ndarray and y.shape == () and y == np.float32(x)
        else:
            assert y is x


@pytest.mark.parametrize("first", ["writeable", "read-only"])
def test_read_only_batches_go_in_place_per_call_whatever_came_first(staged, first):
    """Whether a batch is copied is decided per call and per leaf: a read-only
    batch goes to jaxlib's put as it is (zero copy) after writeable ones and
    before them, a writeable one is copied; the results are jax.jit's."""
    fn = lambda x, y: (jnp.sum(x * 2.0, axis=0), jnp.mean(y))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(8)

    def batch(read_only):
        x = rng.standard_normal((64, 16)).astype(np.float32)
        y = rng.integers(0, 9, 64).astype(np.int32)
        return (_read_only(x), y) if read_only else (x, y)

    order = [first == "read-only"] * 10 + [first != "read-only"] * 10
    for read_only in order:
        x, y = batch(read_only)
        record = _record(f, x, y) if f._cache_size() else None
        if record is not None:
            staged_x, staged_y = record.stage([x, y])
            assert (staged_x is x) == read_only and staged_y is not y  # y stays writeable
        assert_same_outputs(f(x, y), g(x, y))
    assert f.stats().misses == 1 and f._cache_size() == 1


def test_new_scalars_go_as_private_copies_with_jax_jits_types(staged):
    """Python scalars with new values: private 0-d copies for jaxlib's put
    (its own scalar put waits for the transfer), outputs with jax.jit's weak
    types; an int beyond int32 takes JAX's own path, which raises as jax.jit."""
    fn = lambda a, b, c: (a * 2, b + 1, jnp.where(c, a, b))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    for i in range(20):
        args = (0.5 + i, 1000 + i, bool(i % 2))
        assert_same_outputs(f(*args), g(*args))
    # (new objects: the same objects again would be the memo's, put once and kept)
    staged_args = _record(f, *args).stage([float(i) + 0.25, 2000 + i, not args[2]])
    assert all(type(x) is np.ndarray and x.shape == () for x in staged_args)
    assert [o.weak_type for o in f(*args)] == [o.weak_type for o in g(*args)]
    assert_same_call(f, g, 1.0, 2**40, True)
    assert f.stats().slow_reasons == {"input_refused": 1}
    assert_same_outputs(f(1e39, 2, True), g(1e39, 2, True))  # float32's inf, as jaxlib's cast


def test_donated_params_and_a_new_batch(staged):
    """A training step donating its params and taking a numpy batch: jax.jit's
    outputs and donation; a donated array used again raises as jax.jit."""
    def step(p, x):
        return jax.tree.map(lambda w: w - 0.1 * jnp.sum(x), p), jnp.sum(x @ p["w"])

    f, g = nbjit.jit(step, donate_argnums=0), jax.jit(step, donate_argnums=0)
    p = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    q = jax.tree.map(jnp.copy, p)
    for i in range(6):
        x = np.full((3, 4), i, np.float32)
        old = p
        p, loss = f(p, x)
        q, want = g(q, x)
        assert_same_outputs((p, loss), (q, want))
        assert old["w"].is_deleted()
    assert _record(f, p, x).launch is not None
    assert_same_call(f, g, old, x)


def test_big_copies_stream(staged, monkeypatch):
    """From `STREAM_MIN_BYTES` a same-dtype contiguous leaf is copied with
    non-temporal stores (`nbjit.core.inputs.stream`), a converted or strided
    one by numpy; the bits are jax.jit's either way."""
    from nbjit.core.inputs import stream as _stream

    copy = _stream.stream_copy()
    streamed = []
    monkeypatch.setattr(_stream, "_compiled",
                        lambda dst, src: (streamed.append(src.nbytes), copy(dst, src)))
    n = _stream.STREAM_MIN_BYTES // 4 + 5
    fn = lambda a: (a[::7] * 3.0, jnp.sum(a))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    for i in range(4):
        x = np.random.default_rng(i).standard_normal(n).astype(np.float32)
        assert_same_outputs(f(x), g(x))
    # the miss's call takes JAX's own path; the launcher's first call, its own
    # miss, runs the record's steps on the staged copy (one copy more)
    assert streamed == [4 * n] * 4
    wide = np.random.default_rng(9).standard_normal(n)  # float64, x64 off: converted
    assert_same_outputs(f(wide), g(wide))
    assert len(streamed) == 4
    small = nbjit.jit(lambda a: a + 1)
    for _ in range(3):
        assert_same_outputs(small(np.ones(64, np.float32)), jax.jit(lambda a: a + 1)(np.ones(64)))
    assert len(streamed) == 4  # below the threshold: numpy's copy


def test_no_call_waits_for_the_streamed_copys_compile(staged, monkeypatch):
    """While the streamed copy compiles (on its own thread), a ring copies
    with numpy, and the results are jax.jit's; the first call after the
    compile is done takes the streamed copy, and a ring made once it failed
    copies with numpy for good."""
    from nbjit.core.inputs import stream as _stream

    copy = _stream.stream_copy()
    monkeypatch.setattr(_stream, "_compiled", _stream.PENDING)
    n = _stream.STREAM_MIN_BYTES // 4
    fn = lambda a: a * 2.0  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for _ in range(3):
        assert_same_outputs(f(x), g(x))
    (ring,) = _rings(f, x)
    assert ring.stream is None and ring.stream_pending
    streamed = []
    monkeypatch.setattr(_stream, "_compiled",
                        lambda dst, src: (streamed.append(src.nbytes), copy(dst, src)))
    for i in range(3):  # new values (the first loop's again would be the held copy's)
        x = np.random.default_rng(i + 1).standard_normal(n).astype(np.float32)
        assert_same_outputs(f(x), g(x))
    assert streamed == [4 * n] * 3 and not ring.stream_pending
    monkeypatch.setattr(_stream, "_compiled", None)  # no streamed copy in this process
    h = nbjit.jit(lambda a: a * 3.0)
    for _ in range(3):
        assert_same_outputs(h(x), jax.jit(lambda a: a * 3.0)(x))
    (ring,) = _rings(h, x)
    assert ring.stream is None and not ring.stream_pending and len(streamed) == 3


@pytest.mark.parametrize("strategy", ["staged", "the CPU's"])
def test_the_streamed_copy_compiles_while_jax_does(strategy, monkeypatch):
    """The streamed copy's compile begins as the first miss on a launching
    platform begins, before JAX traces the function, whatever its leaves
    (a later signature's big leaf finds it ready), once; not where the
    default device's strategy does not launch (the CPU's own)."""
    from nbjit.core.inputs import stream as _stream

    platform = jax.devices()[0].platform
    if strategy == "staged":
        monkeypatch.setitem(_platforms._plugged, platform, _platforms.STAGED)
    elif platform == "cpu":
        from nbjit import host

        monkeypatch.setitem(_platforms._plugged, "cpu", host.HOST_MEMORY)
    else:
        pytest.skip("the CPU's own strategy")
    events = []
    _stream.stream_copy()  # (a compile begun earlier ends before its globals are replaced)
    monkeypatch.setattr(_stream, "_compiled", _stream._UNTRIED)

    def start():  # (as `start`, but no compile)
        events.append("start")
        _stream._compiled = _stream.PENDING

    monkeypatch.setattr(_stream, "start", start)

    def fn(a):
        events.append("trace")
        return a + 1

    small = np.ones(16, np.float32)
    big = np.ones(_stream.STREAM_MIN_BYTES // 4, np.float32)
    nbjit.jit(fn)(small)
    assert events == [*(["start"] if strategy == "staged" else []), "trace"]
    nbjit.jit(fn)(big)
    assert events == [*(["start"] if strategy == "staged" else []), "trace", "trace"]


@pytest.mark.parametrize(("env", "expected"), [
    ({"JAX_PLATFORMS": "cpu"}, False),
    ({"JAX_PLATFORMS": "cpu", "TPU_LIBRARY_PATH": "/nowhere/libtpu.so"}, False),
    ({"TPU_LIBRARY_PATH": "/nowhere/libtpu.so"}, True),
    ({"JAX_PLATFORMS": "tpu,cpu"}, True),
    ({}, None),  # as this machine's plugins say
])
def test_import_begins_the_streamed_copy_where_an_accelerator_is_expected(env, expected):
    """``import nbjit`` begins the streamed copy's compile where JAX's default
    backend will likely be an accelerator's, judged without initializing a
    backend: `jax_platforms` first, then where JAX looks for a plugin."""
    import subprocess
    import sys

    code = ("import nbjit\n"
            "from jax._src import xla_bridge\n"
            "from nbjit.core.inputs import platforms, stream\n"
            "print(stream.started(), platforms.accelerator_expected(),"
            " xla_bridge.backends_are_initialized())\n")
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("JAX_PLATFORMS", "TPU_LIBRARY_PATH", "PJRT_NAMES_AND_LIBRARY_PATHS")}
    child_env.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    started, guessed, initialized = (word == "True" for word in out[-3:])
    assert not initialized  # the guess initialized no backend
    assert started == guessed
    if expected is not None:
        assert started is expected


def test_a_forked_child_forgets_a_compile_in_flight(monkeypatch):
    """A compile the parent had running has no thread in a forked child: the
    child's `ready()` begins its own instead of answering PENDING forever."""
    from nbjit.core.inputs import stream as _stream

    _stream.stream_copy()  # (a compile begun earlier ends before its globals are replaced)
    monkeypatch.setattr(_stream, "_compiled", _stream.PENDING)
    monkeypatch.setattr(_stream, "_done", threading.Event())
    begun = []
    monkeypatch.setattr(_stream, "start", lambda: begun.append(1))
    _stream._forget_a_compile_in_flight()
    assert not _stream.started() and not _stream._done.is_set()
    _stream.ready()
    assert begun == [1]


def test_a_big_leaf_is_read_during_the_call_not_copied(staged):
    """From `Staged.DIRECT_MIN_BYTES` a leaf's put reads the caller's array
    during the call (no private copy, no ring of that size); a write right
    after the call changes nothing."""
    n = _platforms.Staged.DIRECT_MIN_BYTES // 4
    small = _jax.ShapedArray((n - 1,), np.float32)
    big = _jax.ShapedArray((n,), np.float32)
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0])
    assert _platforms.STAGED.host_transfer(small, sharding).stage is not None
    assert _platforms.STAGED.host_transfer(big, sharding) is _platforms.DIRECT
    fn = lambda a: jnp.sum(a[::4096] * 2.0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    want = g(np.full(n, 1.0, np.float32))
    for _ in range(3):
        x = np.full(n, 1.0, np.float32)
        out = f(x)
        x[:] = 5.0
        assert_same_outputs(out, want)
    assert [h.transfer for h in steps_of(f, x)["HostInput"]] == [_platforms.DIRECT]


def test_a_leaf_past_the_plans_threshold_is_read_during_the_call_too(staged):
    """Where the strategy launches, a one-device leaf of
    `SINGLE_DEVICE_PLAN_MIN_BYTES` or more is no `ShardingPlan`'s (whose copy
    came on top of the runtime's own read there) but a `DIRECT` leaf of the
    launch record; the CPU's own strategies keep the plan
    (tests/test_host_inputs.py)."""
    from nbjit.core.inputs import plans as _plan

    assert _platforms.DEFAULT.plans_big_leaves and not _platforms.STAGED.plans_big_leaves
    n = _plan.SINGLE_DEVICE_PLAN_MIN_BYTES // 4 + 1024
    fn = lambda a, b: (a[::4096] * 2.0 + b, jnp.sum(a[::512]))  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    x = np.arange(n, dtype=np.float32)
    want = g(x.copy(), 1.5)
    for _ in range(3):
        x[:] = np.arange(n, dtype=np.float32)
        out = f(x, 1.5)
        x[:] = -5.0  # right after the call
        assert_same_outputs(out, want)
    steps = steps_of(f, x, 1.5)
    assert not steps["_Planned"]
    assert [h.transfer for h in steps["HostInput"] if h.aval.shape] == [_platforms.DIRECT]
    assert _record(f, x, 1.5).launch is not None


def _compare_step(f, *args):
    (step,) = [h for h in steps_of(f, *args)["HostInput"] if h.compare]
    return step


def test_the_same_bytes_again_reuse_a_device_array_of_the_held_copy(staged):
    """An array bigger than a memo takes is compared with the held copy of
    the last one: the same bytes again go to the executable as a device
    array of that copy, put once (no copy, no transfer per call); a write
    into the caller's array, between calls or right after one, is seen by
    the next call only."""
    fn = lambda w, x: jnp.sum(x * w, axis=0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    w = jnp.float32(2.0)
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)  # 64 KiB
    for _ in range(4):
        assert_same_outputs(f(w, x), g(w, x))
    step = _compare_step(f, w, x)
    assert step.held is not None and step.held[2] is not None and step.misses == 0
    assert not np.shares_memory(step.held[0], x)  # a private copy, not the caller's array
    (staged_w, staged_x) = _record(f, w, x).stage([w, x])
    assert staged_x is step.held[2] and type(staged_x) is _jax.ArrayImpl
    x[3, 5] = 100.0  # in place: other bytes, so a private copy again
    assert_same_outputs(f(w, x), g(w, x))
    assert step.held[2] is None and np.array_equal(step.held[0], x)
    want = jax.block_until_ready(g(w, x.copy()))  # (jax.jit may read x in place, later)
    out = f(w, x)  # held copy's bytes: its device array
    x[:] = 7.0  # right after the call
    assert_same_outputs(out, want)
    assert_same_outputs(f(w, x), g(w, x))


def test_new_arrays_each_call_rest_the_compare(staged):
    """New bytes every call: the compare stops at the first byte that
    differs; after `MEMO_PATIENCE` misses in a row it rests for `MEMO_REST`
    calls and holds no copy meanwhile; values that repeat again are held
    and reused once it looks again."""
    fn = lambda x: jnp.cumsum(x, axis=1)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(1)
    # (the first call is the miss, JAX's own path: the step sees the others)
    xs = [rng.standard_normal((64, 32)).astype(np.float32)
          for _ in range(HostInput.MEMO_PATIENCE + 1)]
    for x in xs:
        assert_same_outputs(f(x), g(x))
    step = _compare_step(f, xs[0])
    assert step.rest == step.MEMO_REST and step.held is None
    for _ in range(step.MEMO_REST):  # rests: private copies, whatever comes
        assert_same_outputs(f(xs[0]), g(xs[0]))
    assert step.rest == 0 and step.held is None
    for _ in range(3):
        assert_same_outputs(f(xs[1]), g(xs[1]))
    assert step.held is not None and step.held[2] is not None


@pytest.mark.parametrize("level", ["log", "disallow"])
def test_the_held_copys_device_array_keeps_transfer_guards(staged, level):
    """The same bytes again under a host-to-device transfer guard: jax.jit
    transfers (logs or refuses), so nbjit does not hand over its held
    device array unguarded: it logs, or refuses as jax.jit does."""
    fn = lambda x: x * 3.0  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    x = np.arange(4096, dtype=np.float32)
    for _ in range(3):
        assert_same_outputs(f(x), g(x))
    assert _compare_step(f, x).held[2] is not None
    with jax.transfer_guard(level):
        nb, jx = assert_same_call(f, g, x)
    if level == "disallow":
        assert isinstance(nb, Exception) and type(nb) is type(jx)
    else:
        assert_same_outputs(nb, jx)
    assert_same_outputs(f(x), g(x))


def test_only_canonical_c_order_arrays_are_compared(staged):
    """An array that needs converting (float64 with x64 off) or a strided
    view is copied every call, converted as jaxlib converts it, even when
    its values repeat."""
    fn = lambda x: x + 1  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    x64 = np.random.default_rng(2).standard_normal((64, 32))
    for _ in range(3):
        assert_same_outputs(f(x64), g(x64))
    assert _compare_step(f, x64).held[2] is None
    base = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    view = base[:, ::2]
    h, k = nbjit.jit(lambda x: x * 2), jax.jit(lambda x: x * 2)
    for _ in range(3):
        assert_same_outputs(h(view), k(view))
    assert _compare_step(h, view).held[2] is None
