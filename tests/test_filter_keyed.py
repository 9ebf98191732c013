"""nbjit.filter_jit's keyed calls: a reader keys the call in one pass and the
binder's hit path runs it (nbjit/filter/jit.py `_keyed`).

Each case calls a wrapper often enough that later calls are keyed, and checks
outputs, trace counts and exception types against equinox.filter_jit, and that
the keyed calls skipped the general path (`_prepare`) where they should.
"""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox", reason="nbjit.filter_jit needs equinox (nbjit[equinox])")

from _diff import assert_same_outputs, counted  # noqa: E402

import nbjit  # noqa: E402
from nbjit import _jax  # noqa: E402
from nbjit.filter import jit as filter_impl  # noqa: E402

WRAPS = (nbjit.filter_jit, eqx.filter_jit)


@pytest.fixture
def prepares(monkeypatch):
    """How many calls took the general path (worked out the inner arguments)."""
    calls = []
    real = filter_impl._prepare

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(filter_impl, "_prepare", counting)
    return calls


class Block(eqx.Module):
    linear: eqx.nn.Linear
    activation: object = eqx.field(static=True)
    scale: float = 1.0

    def __call__(self, x):
        return self.activation(self.linear(x)) * self.scale


def _block(activation=jax.nn.relu, scale=1.0, key=0):
    return Block(eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(key)), activation, scale)


def test_repeated_calls_are_keyed_and_skip_the_general_path(prepares):
    f = nbjit.filter_jit(lambda m, x, n: (m(x) * n, m, "done"))
    m, x = _block(), jnp.ones(3)
    first = f(m, x, 2)
    prepares.clear()
    for _ in range(5):
        out = f(m, x, 2)
    assert prepares == []  # every call after the first was keyed
    assert_same_outputs(out, first)
    assert out[1].activation is m.activation and out[2] == "done"
    stats = f._cached.pjit.stats()
    assert (stats.hits, stats.misses, stats.slow) == (5, 1, 0)
    assert len(f._cached.keys) == 1


def test_randomised_calls_match_equinox_outputs_and_traces():
    """Seeded sequences of calls mixing what keys a call: static values (1, True,
    1.0 share a trace in equinox), shapes, dtypes, numpy or jax inputs, Module
    static fields and float fields; outputs and trace counts as equinox's."""
    statics = [1, True, 1.0, 2, "a", None, (1, 2)]
    blocks = [_block(), _block(jax.nn.tanh), _block(scale=2.0), _block(key=1)]
    rng = random.Random(0)
    calls = []
    for _ in range(120):
        shape = rng.choice([(3,), (2, 3)])
        dtype = rng.choice([np.float32, np.int32])
        value = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
        x = value if rng.random() < 0.3 else jnp.asarray(value)
        calls.append((rng.choice(blocks), x, rng.choice(statics)))
    results, traces_of = [], []
    for wrap in WRAPS:
        fn, traces = counted(lambda m, x, s: (jax.vmap(m)(jnp.atleast_2d(x).astype(jnp.float32)),
                                               s, m.scale))
        f = wrap(fn)
        outs = []
        for m, x, s in calls:
            outs.append(f(m, x, s))
            outs.append(len(traces))
        results.append(outs)
        traces_of.append(len(traces))
    assert traces_of[0] == traces_of[1]
    assert_same_outputs(results[0], results[1])


def test_after_the_cache_is_cleared_a_keyed_call_compiles_again():
    fn, traces = counted(lambda x, n: x * n)
    f = nbjit.filter_jit(fn)
    x = jnp.arange(3.0)
    f(x, 2)
    f(x, 2)
    f._cached.pjit.clear_cache()
    assert f._cached.keys  # the reader key is still known: the call is keyed
    np.testing.assert_array_equal(f(x, 2), x * 2)
    assert len(traces) == 2 and f._cached.pjit._cache_size() == 1
    np.testing.assert_array_equal(f(x, 2), x * 2)
    assert f._cached.pjit.stats().misses == 2


def test_a_deleted_input_raises_as_equinox():
    errors = []
    for wrap in WRAPS:
        f = wrap(lambda x, n: x * n)
        x = jnp.ones(3)
        f(x, 2)
        f(x, 2)
        y = jnp.ones(3)
        y.delete()
        with pytest.raises(Exception) as info:
            f(y, 2)
        errors.append(type(info.value))
        np.testing.assert_array_equal(f(x, 2), 2 * np.ones(3))
    assert errors[0] is errors[1]


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]


class _RaisingEq:
    def __hash__(self):
        return 7

    def __eq__(self, other):
        raise RuntimeError("no eq")


@pytest.mark.parametrize("bad", [_Unhashable, _RaisingEq], ids=["unhashable", "raising_eq"])
def test_a_bad_static_leaf_after_keyed_calls_raises_as_equinox(bad):
    if bad is _RaisingEq and _jax.JAX_VERSION < (0, 11):
        pytest.skip("jax 0.10 compares a call's static leaves with those of earlier calls of "
                    "the same structure: f(x, 1) after f(x, _RaisingEq()) raises in JAX's "
                    "path, under equinox.filter_jit as under nbjit's")
    errors = []
    for wrap in WRAPS:
        f = wrap(lambda x, s: x + 1)
        x = jnp.ones(2)
        f(x, bad() if bad is _RaisingEq else 1)
        f(x, 1)
        f(x, 1)
        try:
            f(x, bad())
            errors.append(None)
        except Exception as error:
            errors.append(type(error))
        np.testing.assert_array_equal(f(x, 1), 2 * np.ones(2))
    assert errors[0] is errors[1]


def test_error_if_raises_on_a_keyed_call():
    def step(x):
        return eqx.error_if(x, x < 0, "negative")

    errors = []
    for wrap in WRAPS:
        f = wrap(step)
        good, bad = jnp.ones(2), -jnp.ones(2)
        f(good)
        f(good)
        with pytest.raises(Exception) as info:
            f(bad)
        errors.append(type(info.value))
        np.testing.assert_array_equal(f(good), good)
    assert errors == [eqx.EquinoxRuntimeError, eqx.EquinoxRuntimeError]


def test_module_as_the_function_is_keyed(prepares):
    m = _block()
    f = nbjit.filter_jit(m)
    x = jnp.ones(3)
    expected = eqx.filter_jit(m)(x)
    f(x)
    prepares.clear()
    np.testing.assert_array_equal(f(x), expected)
    assert prepares == []
    g = jax.tree_util.tree_map(lambda a: a * 2 if eqx.is_array(a) else a, f)  # a clone
    np.testing.assert_array_equal(g(x), jax.tree_util.tree_map(
        lambda a: a * 2 if eqx.is_array(a) else a, eqx.filter_jit(m))(x))


def test_keywords_and_a_profile_take_the_general_path(prepares):
    f = nbjit.filter_jit(lambda x, n=1: x * n)
    x = jnp.ones(2)
    f(x, n=2)
    prepares.clear()
    f(x, n=2)
    assert prepares == [1]
    f(x, 3)
    f(x, 3)
    prepares.clear()
    hits = f._cached.pjit.stats().hits
    with nbjit.profile():
        f(x, 3)
    assert prepares == [1] and f._cached.pjit.stats().hits == hits + 1


def test_a_node_only_equinox_flattens_is_never_keyed_by_its_eq(prepares):
    """A pytree node registered in JAX's default registry alone (the one
    equinox partitions with) is a leaf to jit's registry, which the readers
    use; with a loose ``__eq__`` a reader key would ignore its arrays. Such a
    call keeps the general path, and its outputs follow its arrays."""
    from jax._src import tree_util as jax_tree_util

    class Box:
        def __init__(self, a, tag):
            self.a, self.tag = a, tag

        def __eq__(self, other):
            return type(other) is Box

        def __hash__(self):
            return 1

    jax_tree_util.default_registry.register_node(
        Box, lambda b: ((b.a,), b.tag), lambda tag, children: Box(children[0], tag))
    outs = []
    for wrap in WRAPS:
        f = wrap(lambda b, n: b.a * n)
        outs.append([f(Box(jnp.ones(2), "x"), 2), f(Box(jnp.arange(2.0), "y"), 2),
                     f(Box(jnp.full(2, 5.0), "x"), 2)])
    assert_same_outputs(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0][2], [10.0, 10.0])
    f = nbjit.filter_jit(lambda b: b.a + 1)
    f(Box(jnp.ones(2), "x"))
    prepares.clear()
    f(Box(jnp.ones(2), "x"))
    assert prepares == [1] and not f._cached.keys
