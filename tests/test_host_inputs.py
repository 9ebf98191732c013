"""Host inputs (numpy arrays, numpy and Python scalars) bound for one device.

The memo (nbjit/core/inputs/steps.py `HostInput`): an input equal to the last one
reuses its device copy. It must be exact (bytes, not ``==``), follow mutation
of numpy inputs, never apply to donated or large inputs, and never bypass a
transfer guard (the guard tests live in test_bad_input.py). Big arrays go
through a `ShardingPlan` instead. Every test compares with jax.jit.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs, steps_of
from _threads import run_threads
from hypothesis import given, settings
from jax import lax

import nbjit
from nbjit import _jax
from nbjit.core import record as _record
from nbjit.core.inputs import plans as _plan
from nbjit.core.inputs import steps as _steps
from nbjit.core.inputs import values as _values
from nbjit.core.inputs.steps import HostInput as _HostInput
from nbjit.host import policy as _policy


def _host_inputs(f, *args):
    return steps_of(f, *args)["HostInput"]


def _bits32(x):
    return lax.bitcast_convert_type(x, np.uint32)


def test_same_scalar_object_reuses_the_device_copy():
    f = nbjit.jit(lambda x, y: x * y)
    s, a = np.float32(1.5), np.arange(4, dtype=np.float32)
    f(s, a)
    f(s, a)
    first = [h.last[2] for h in _host_inputs(f, s, a)]
    assert_same_outputs(f(s, a), jax.jit(lambda x, y: x * y)(s, a))
    assert [h.last[2] for h in _host_inputs(f, s, a)] == first
    assert all(h.memo for h in _host_inputs(f, s, a))
    assert f.miss_count == 1


def test_memo_rests_while_values_change_and_wakes_when_they_repeat(monkeypatch):
    """New values on every call: after MEMO_PATIENCE misses the memo stops
    copying bytes out for MEMO_REST calls; repeated values wake it again
    (resident inputs, which would take over the new values, are off)."""

    monkeypatch.setattr(_policy, "_enabled", False)
    f, g = nbjit.jit(lambda x: x * 2), jax.jit(lambda x: x * 2)
    for i in range(40):
        v = np.full(4, i, np.float32)
        assert_same_outputs(f(v), g(v))
    (h,) = _host_inputs(f, np.zeros(4, np.float32))
    assert h.memo and 0 < h.rest < _HostInput.MEMO_REST  # resting: plain transfers
    same = np.full(4, 7.5, np.float32)
    for _ in range(_HostInput.MEMO_REST + 2):
        assert_same_outputs(f(same), g(same))
    assert h.rest == 0 and h.misses == 0  # awake, and the last call reused its copy
    memo = h.last[2]
    same[...] = -1.0  # same object, new bytes: sent again, never the stale copy
    assert_same_outputs(f(same), g(same))
    assert h.last[2] is not memo
    assert f.miss_count == 1


def test_mutated_numpy_array_is_sent_again():
    f, g = nbjit.jit(lambda x: x + 1), jax.jit(lambda x: x + 1)
    for a in (np.arange(4, dtype=np.float32), np.array(3.0, np.float32)):
        assert_same_outputs(f(a), g(a))
        a[...] = 100  # same object, new bytes
        assert_same_outputs(f(a), g(a))
        np.testing.assert_array_equal(np.asarray(f(a)), np.full(a.shape, 101, np.float32))
    assert f.miss_count == 2


def test_signed_zeros_are_told_apart():
    f, g = nbjit.jit(lambda x: 1 / x), jax.jit(lambda x: 1 / x)
    for value in (0.0, -0.0, 0.0, np.float32(-0.0), np.float32(0.0), np.float32(-0.0)):
        out = f(value)
        assert_same_outputs(out, g(value))
        assert float(out) == (np.inf if np.copysign(1, value) > 0 else -np.inf)


def test_nan_payloads_are_told_apart():
    f = nbjit.jit(_bits32)
    for bits in (0x7FC00001, 0x7FC00002, 0x7FC00001, 0xFFC00001):
        x = np.uint32(bits).view(np.float32)
        assert int(f(x)) == bits
        assert int(f(np.array(x))) == bits
    assert f.miss_count == 1


def test_equal_values_of_types_sharing_an_entry():
    """With x64 off, float64 and float32 numpy scalars share a signature."""
    f, g = nbjit.jit(lambda x: x * 3), jax.jit(lambda x: x * 3)
    for value in (np.float32(0.5), np.float64(0.5), np.float64(0.1), np.float32(0.1),
                  np.float64(0.1)):
        assert_same_outputs(f(value), g(value))
    assert f.miss_count == 1


def test_python_scalars_of_equal_value():
    f, g = nbjit.jit(lambda x: x / 7), jax.jit(lambda x: x / 7)
    for value in (3, 3, 4, 3, 2**31 - 1, -(2**31)):
        assert_same_outputs(f(value), g(value))
    for value in (3.0, 3.0000000001, 3.0, 1e-45, 1e300):
        assert_same_outputs(f(value), g(value))


def _aligned(n: int, dtype=np.float32) -> np.ndarray:
    """A numpy array whose data starts on a 64-byte boundary (the CPU client
    uses such host memory in place under its default, zero-copy transfer)."""
    itemsize = np.dtype(dtype).itemsize
    buf = np.empty(n * itemsize + 64, np.uint8)
    offset = (-buf.ctypes.data) % 64
    return buf[offset:offset + n * itemsize].view(dtype)


@pytest.mark.parametrize("n", [4, 32, 256])
def test_memo_never_aliases_a_mutated_earlier_input(n):
    """The memo's device copy must not be the caller's memory: a 64-byte
    aligned input mutated after the call, then an equal-valued fresh input,
    must give the fresh input's values (at 125992a this returned the mutated
    ones: the zero-copy transfer aliased the first array)."""
    f, g = nbjit.jit(lambda x: x * 1), jax.jit(lambda x: x * 1)
    a = _aligned(n)
    a[:] = 1
    f(a), f(a)
    a[:] = 5
    b = _aligned(n)
    b[:] = 1
    assert_same_outputs(f(b), g(b))
    np.testing.assert_array_equal(np.asarray(f(b)), np.ones(n, np.float32))


def test_identity_output_is_not_the_memo():
    f = nbjit.jit(lambda x: x)
    a = np.arange(4, dtype=np.int32)
    f(a)
    out = f(a)
    memo = _host_inputs(f, a)[0].last[2]
    assert out is not memo
    out.delete()
    np.testing.assert_array_equal(np.asarray(f(a)), a)


def test_no_memo_for_donating_functions_or_big_inputs():
    donating = nbjit.jit(lambda x: x * 2, donate_argnums=0)
    small = np.arange(4, dtype=np.float32)
    donating(small)
    assert not _host_inputs(donating, small)[0].memo
    f = nbjit.jit(lambda x: x * 2)
    big = np.zeros(_HostInput.MEMO_MAX_BYTES // 4 + 1, np.float32)
    f(big)
    assert not _host_inputs(f, big)[0].memo
    big[0] = 5
    assert float(f(big)[0]) == 10


def test_threads_passing_different_values():
    f = nbjit.jit(lambda x, y: x * 1000 + y)
    f(np.float32(0), np.arange(3, dtype=np.float32))

    def work(t):
        y = np.arange(3, dtype=np.float32) + t
        for i in range(200):
            out = np.asarray(f(np.float32(t), y))
            expected = np.float32(t) * 1000 + y
            assert np.array_equal(out, expected), (t, i, out, expected)

    errors = run_threads(work, 4)
    assert not errors, errors[:3]
    assert f.miss_count == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=8),
       st.sampled_from(["numpy_scalar", "zero_d", "python_float"]))
def test_any_bit_pattern_round_trips(bit_patterns, kind):
    f = nbjit.jit(_bits32)
    for bits in bit_patterns:
        x = np.uint32(bits).view(np.float32)
        if kind == "zero_d":
            x = np.array(x)
        elif kind == "python_float":
            if np.isnan(x):
                continue  # float64 NaN -> float32 need not keep the payload
            x = float(x)
        assert int(f(x)) == bits


def test_big_one_device_input_is_copied_by_its_plan(monkeypatch):
    """From SINGLE_DEVICE_PLAN_MIN_BYTES a one-device numpy input goes through
    a ShardingPlan (parallel copy into aligned staging) where the platform's
    strategy plans big leaves (the CPU's; plugged in here for the default
    device's platform: an accelerator's own reads such a leaf during the
    call, tests/test_staged_inputs.py): same result as jax.jit, and the
    caller's array is never aliased."""
    from nbjit.core.inputs import platforms as _platforms

    platform = jax.devices()[0].platform
    if _platforms.strategy_for(platform).launches:
        monkeypatch.setitem(_platforms._plugged, platform, _platforms.DEFAULT)
    assert _platforms.strategy_for(platform).plans_big_leaves
    n = _plan.SINGLE_DEVICE_PLAN_MIN_BYTES // 4 + 1024
    a = np.arange(n, dtype=np.float32)
    f, g = nbjit.jit(lambda x: x * 2), jax.jit(lambda x: x * 2)
    f(a)
    steps = steps_of(f, a)
    assert not steps["HostInput"] and len(steps["_Planned"]) == 1
    out = f(a)
    assert_same_outputs(out, g(a))
    a[:] = -1  # mutating the input after the call changes nothing
    np.testing.assert_array_equal(np.asarray(out)[:5], np.arange(5, dtype=np.float32) * 2)
    assert float(f(a)[7]) == -2.0
    small = np.arange(16, dtype=np.float32)
    f(small)
    steps = steps_of(f, small)
    assert len(steps["HostInput"]) == 1 and not steps["_Planned"]


def test_caller_may_write_its_array_right_after_the_call():
    """jaxlib uses a 64-byte aligned numpy input in place (zero copy), so with
    jax.jit writing to it right after the call can change the result of work
    still queued; nbjit copies host inputs during the call: never."""
    n = 1 << 20  # 4 MB: no memo, one-device HostInput
    buf = np.empty(n * 4 + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    a = buf[start:start + n * 4].view(np.float32)
    assert a.ctypes.data % 64 == 0
    f = nbjit.jit(lambda x: jnp.sin(x) * 2 + jnp.cos(x))
    a[:] = 1
    expected = np.asarray(f(a))
    for _ in range(10):
        a[:] = 1
        result = f(a)
        a[:] = 7
        np.testing.assert_array_equal(np.asarray(result), expected)


@pytest.mark.parametrize("reads_during_call", [True, False])
def test_jax_path_gets_copies_of_what_it_may_read_after_the_call(reads_during_call,
                                                                monkeypatch):
    """JAX's own path (a miss, a slow call) gets private copies of numpy arrays:
    small and 64-byte-aligned ones always; the others only where JAX may read
    them after the call returned (the CPU before jaxlib 0.11.2: a write right
    after the call changed a miss's result; an accelerator), since elsewhere
    jaxlib copies them while the call runs."""
    monkeypatch.setattr(_jax, "_reads_during_call", [reads_during_call])
    raw = np.zeros((1 << 20) + 128, np.uint8)
    start = (-raw.ctypes.data) % 64
    aligned = raw[start:start + (1 << 20)].view(np.float32)
    unaligned = raw[start + 16:start + 16 + (1 << 20)].view(np.float32)
    small = np.ones(4, np.float32)
    (p_unaligned, p_aligned, p_small), _ = _values.private_host_copies(
        (unaligned, aligned, small), {}, (), ())
    assert p_aligned is not aligned and p_small is not small
    assert (p_unaligned is unaligned) == reads_during_call
    np.testing.assert_array_equal(p_aligned, aligned)
    # An array no one can write goes as it is, whatever its size and alignment;
    # a read-only view of a writeable one is copied (its base can be written).
    owned = np.arange(1 << 18, dtype=np.float32)
    owned.flags.writeable = False
    view = aligned[: 1 << 10]
    view.flags.writeable = False
    tiny = np.ones(4, np.float32)
    tiny.flags.writeable = False
    (p_owned, p_view, p_tiny), kw = _values.private_host_copies(
        (owned, view, tiny), {"k": owned}, (), ())
    assert p_owned is owned and p_tiny is tiny and kw["k"] is owned
    assert p_view is not view and p_view.flags.writeable
    np.testing.assert_array_equal(p_view, view)


@pytest.fixture
def per_leaf(monkeypatch):
    """The per-leaf records themselves (the policy would replace them:
    test_fresh_host_values.py)."""
    monkeypatch.setattr(_policy, "_enabled", False)


@pytest.mark.parametrize("extra", [2, _record.PREPARE_UNROLL_MAX + 2])
def test_generated_and_looped_preparers_give_jax_outputs(extra, per_leaf):
    """A record with up to PREPARE_UNROLL_MAX inputs prepares them with
    generated code (host arrays transferred inline while the memo rests),
    a bigger one with the loop over its steps. Both: a closed-over constant,
    a pruned argument, host arrays with and without a memo, Python and numpy
    scalars, jax.Arrays; new values on every call, then the same values."""
    table = np.linspace(0, 1, 5).astype(np.float32)

    def fn(a, unused, s, big, small, n, *rest):
        return a * s + big[:5] + small * n + table + sum(rest)

    f, g = nbjit.jit(fn), jax.jit(fn)
    rest = [jnp.full(5, i, jnp.float32) for i in range(extra)]
    big_size = _HostInput.MEMO_MAX_BYTES // 4 + 8
    for i in range(_HostInput.MEMO_PATIENCE + 4):  # new values: the memo goes to rest
        args = (jnp.ones(5) * i, jnp.zeros(2), 0.5 * i, np.full(big_size, i, np.float32),
                np.full(5, -i, np.float32), np.int32(i), *rest)
        assert_same_outputs(f(*args), g(*args))
    for _ in range(3):  # the same values again
        assert_same_outputs(f(*args), g(*args))
    node, _ = f._entry_for(args, {})
    generated = "<prepare " in node.record.prepare.__code__.co_filename
    assert generated == (extra + 5 <= _record.PREPARE_UNROLL_MAX)
    assert node.record.kept is not None  # `unused` is pruned
    hosts = _host_inputs(f, *args)
    assert sorted(h.memo for h in hosts) == [False, True, True, True]
    assert f.miss_count == 1


@pytest.mark.cpu_devices("a constant on a second device (a _Copy step)")
def test_preparer_applies_steps_to_consts_and_kept_leaves(monkeypatch):
    """Closed-over constants can need a step too (a numpy constant, an array on
    another device): the generated preparer and the loop give the same inputs,
    every one a jax.Array on the executable's device with the input's value."""
    dev0, dev1 = jax.devices()[:2]
    target = jax.sharding.make_single_device_sharding(dev0)
    consts = (np.arange(3, dtype=np.float32), jax.device_put(jnp.ones(2), dev1),
              jax.device_put(jnp.zeros(1), dev0))
    leaves = [jax.device_put(jnp.ones(4), dev0), np.full(2, 5, np.int32), 2.5]
    kept = (0, 2)  # leaves[1] is pruned
    expected = [*consts, leaves[0], leaves[2]]
    steps = {}
    for i, x in enumerate(expected):
        step = _steps.input_step(i, x, target, False)
        if step is not None:
            steps[i] = step
    assert [type(s).__name__ for s in steps.values()] == ["HostInput", "_Copy", "HostInput"]
    generated = _record._make_preparer(consts, kept, len(leaves), steps, None)
    monkeypatch.setattr(_record, "PREPARE_UNROLL_MAX", 0)
    looped = _record._make_preparer(consts, kept, len(leaves), steps, None)
    assert "<prepare " in generated.__code__.co_filename
    assert "<prepare " not in looped.__code__.co_filename
    for prepare in (generated, looped):
        for _ in range(_HostInput.MEMO_PATIENCE + 2):  # the memo awake, then resting
            inputs = prepare(leaves)
            assert len(inputs) == len(expected)
            for got, want in zip(inputs, expected, strict=True):
                assert isinstance(got, jax.Array) and got.devices() == {dev0}
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_record_says_where_each_leaf_goes():
    """A `FastPath` answers in leaves, whatever its consts and pruning: the
    executable input a leaf is (None: pruned), the step that moves it, its
    host leaves (a closed-over constant's step is no leaf's); `replaced`
    keeps every other field and runs the new prepare."""
    target = jax.sharding.make_single_device_sharding(jax.devices()[0])
    consts = (np.arange(3, dtype=np.float32),)
    leaves = [jnp.ones(4), np.full(2, 5, np.int32), 2.5, np.ones(3, np.float32)]
    kept = (0, 2, 3)  # leaves[1] is pruned
    inputs = [*consts, *[leaves[j] for j in kept]]
    steps = {i: step for i, x in enumerate(inputs)
             if (step := _steps.input_step(i, x, target, False)) is not None}
    record = _record.FastPath(
        executable=object(), execute=print, out_handlers=[], out_tree=None, single_output=True,
        consts=consts, kept=kept, steps=tuple(s.apply for _, s in sorted(steps.items())),
        leaves_are_inputs=False,
        prepare=_record._make_preparer(consts, kept, len(leaves), steps, None))
    assert [record.input_of(j) for j in range(4)] == [1, None, 2, 3]
    hosts = record.host_inputs()
    assert list(hosts) == [2, 3] and [h.index for h in hosts.values()] == [2, 3]
    assert [record.step_of(j) for j in range(4)] == [None, None, hosts[2], hosts[3]]
    assert not record.uses_shard_args()
    everything = [f.name for f in dataclasses.fields(record)]

    def prepare(leaves):
        return record.prepare(leaves)

    copy = record.replaced(prepare=prepare, fence=print)
    assert copy.prepare is prepare and copy.fence is print and not copy.leaves_are_inputs
    assert all(getattr(copy, name) is getattr(record, name) for name in everything
               if name not in ("prepare", "fence", "leaves_are_inputs"))
