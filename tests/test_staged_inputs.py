"""Host arrays on a device with memory of its own (an accelerator): staged.

There a numpy input is copied into a private staging buffer and put zero
copy (`nbjit.core.inputs.platforms.Staged`: each `HostInput` its own
`StagingRing`), unless no one can write it (`staging.immutable`: then it is
put in place), and JAX's own path copies every numpy array. A signature's
changing host leaves are packed into one staged put (`nbjit.host.HostStaged`
and `nbjit.host.packing`, uint32 words; ``NBJIT_PACK_ACCELERATOR=0`` leaves
them staged leaf by leaf). The tests run on the default backend: the
accelerator's own strategies there, plugged in for "cpu" on the CPU. Every
output is compared with jax.jit's, bit for bit.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs, steps_of

import nbjit
from nbjit import _jax, host
from nbjit.core.inputs import platforms as _platforms
from nbjit.core.inputs import staging as _staging
from nbjit.core.inputs import values as _values
from nbjit.host import packing as _packing
from nbjit.host import policy as _policy


@pytest.fixture
def staged(monkeypatch):
    """The accelerator's transfer, leaf by leaf (no packing): its own where
    JAX's default backend is one, plugged in for the CPU otherwise."""
    monkeypatch.setitem(_platforms._plugged, jax.devices()[0].platform, _platforms.STAGED)


@pytest.fixture
def packed(monkeypatch):
    """The accelerator's packing strategy: its own where JAX's default backend
    is one (the default there), plugged in for the CPU otherwise."""
    platform = jax.devices()[0].platform
    if platform == "cpu":
        monkeypatch.setitem(_platforms._plugged, "cpu", host.HOST_STAGED)
    assert _platforms.strategy_for(platform) is host.HOST_STAGED


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
    assert rings[0].made >= 1 and rings[0].dtype == np.float32
    assert rings[1].dtype == np.float32  # (x64 off: the canonical dtype)


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
    for i in range(3 * ring.cap):
        y = np.full(64, i, np.float32)
        assert_same_outputs(f(y), jax.jit(lambda a: a + 1)(y))
        assert held is not ring.stage(y) or sys.getrefcount(held) <= 3
    assert np.array_equal(held, x)  # never overwritten while held
    assert ring.made <= ring.cap


def test_ring_stays_bounded_in_a_loop(staged):
    f = nbjit.jit(lambda a, b: a @ b)
    b = np.eye(32, dtype=np.float32)
    outs = []
    for i in range(100):
        outs.append(f(np.full((32, 32), i, np.float32), b))
        _jax.collect_garbage()
    jax.block_until_ready(outs)
    for ring in _rings(f, np.zeros((32, 32), np.float32), b):
        assert ring.made <= ring.cap
    for i, out in enumerate(outs):
        assert float(out[0, 0]) == float(i)


def test_new_values_every_call_are_packed_in_words(packed):
    """Two changing host leaves, one big (past the CPU's packing limit): one
    put per call once packed; bool, int8 and float16 leaves come back bit
    for bit from uint32 words, and a complex one keeps its own put (a TPU
    cannot constrain a complex leaf's layout in the packed program)."""
    def fn(x, m, c, h, k):
        return x * 2, jnp.where(m, c, 0), h.astype(jnp.float32) + k

    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(1)

    def args(i):
        return (rng.standard_normal((300, 700)).astype(np.float32),  # past 64 KiB
                rng.integers(0, 2, 13).astype(bool),
                (rng.standard_normal(13) + 1j * rng.standard_normal(13)).astype(np.complex64),
                rng.standard_normal(5).astype(np.float16), rng.integers(-9, 9, 5).astype(np.int8))

    for i in range(3 * _policy.PACK_AFTER):
        if i == 2 * _policy.PACK_AFTER:
            assert _packing.wait(120)
        a = args(i)
        assert_same_outputs(f(*a), g(*a))
    node, _ = f._entry_for(a, {})
    assert node.host_policy.stage is _policy.Stage.PACKED
    assert sorted(s.leaf for s in node.host_policy.watched.layouts) == [0, 1, 3, 4]
    assert f.stats().packed_compiles == 1 and f.stats().resident == 0


def test_jax_path_copies_every_numpy_array_on_an_accelerator(monkeypatch):
    # (where JAX's path is not known to have read a host array when the call returns)
    monkeypatch.setattr(_jax, "jax_path_reads_host_arrays_during_call", lambda: False)
    x = np.empty((1 << 15) + 3, np.float32)[3:]  # > 64 KiB and not 64-byte aligned
    assert x.__array_interface__["data"][0] % 64
    (copy,), _ = _values.private_host_copies((x,), {}, (), ())
    assert copy is not x and np.shares_memory(copy, x) is False


def test_packed_results_equal_jax_jits_bit_for_bit(packed):
    """The packed program is other HLO than the original (its inputs are
    slices of one buffer): where XLA could reorder a reduction, a dot or a
    fused chain, its results must still equal jax.jit's bit for bit. (On a
    TPU, without each leaf constrained to its original parameter's layout,
    `jnp.sum` and `jnp.std` of a packed leaf came out one ulp away.)"""
    def fn(x, w, b, y):
        h = jnp.tanh(x @ w + b)
        logits = jax.nn.log_softmax(h)
        return (jnp.sum(x), jnp.mean(x, axis=0), jnp.cumsum(w, axis=1), jnp.dot(x, w),
                jnp.einsum("ij,jk->ik", h.T, x), jnp.prod(b), jnp.var(y), jnp.std(x),
                logits, jnp.max(x * w[:, :1].T), (x * 1.1 + 0.3) * x - jnp.exp(-x),
                jnp.linalg.norm(y))

    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(4)
    for i in range(8 * _policy.PACK_AFTER):  # 40 draws once packed
        if i == 2 * _policy.PACK_AFTER:
            assert _packing.wait(120)
        args = (rng.standard_normal((32, 16)).astype(np.float32),
                rng.standard_normal((16, 8)).astype(np.float32),
                rng.standard_normal(8).astype(np.float32),
                rng.standard_normal(1000).astype(np.float32))
        assert_same_outputs(f(*args), g(*args))
    node, _ = f._entry_for(args, {})
    assert node.host_policy.stage is _policy.Stage.PACKED


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


def test_a_read_only_leaf_is_never_packed(packed):
    fn = lambda a, b, c: (a * 2 + jnp.sum(b), c - 1)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    frozen = _read_only(np.linspace(0, 1, 1024, dtype=np.float32))
    for i in range(3 * _policy.PACK_AFTER):
        if i == 2 * _policy.PACK_AFTER:
            assert _packing.wait(120)
        args = (frozen, np.full(16, i, np.float32), np.full(4, i, np.int32))
        assert_same_outputs(f(*args), g(*args))
    node, _ = f._entry_for(args, {})
    assert node.host_policy.stage is _policy.Stage.PACKED
    assert sorted(s.leaf for s in node.host_policy.watched.layouts) == [1, 2]


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
