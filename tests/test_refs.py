"""jax.Ref arguments (jax.new_ref, flax nnx ref-mode variables) and leaves that
look like arrays without being jax.Arrays: JAX's own path, with jax.jit's results.

A Ref has `.aval` and `._committed` but no `._sharding`: a binder's all-array
attempt must never half-key it. jax.jit keeps Refs on its Python path (its
cache stays empty); nbjit does the same and counts the calls as slow ("ref").
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs

import nbjit


def _bump_and_matmul(r, w, x):
    r[...] += 1
    return x @ w


def test_the_reported_ref_example_runs_twice_as_under_jax_jit():
    outs = {}
    for jit in (jax.jit, nbjit.jit):
        r = jax.new_ref(jnp.zeros(()))
        f = jit(_bump_and_matmul)
        w, x = jnp.ones((3, 4)), jnp.ones((1, 3))
        outs[jit] = [f(r, w, x), f(r, w, x)]
        assert float(r[...]) == 2.0
        assert f._cache_size() == 0  # upstream keeps Refs on its Python path
    for ours, theirs in zip(outs[nbjit.jit], outs[jax.jit], strict=True):
        assert_same_outputs(ours, theirs)


def test_ref_calls_are_slow_calls_named_ref():
    f = nbjit.jit(lambda r, w, x: _bump_and_matmul(r, w, x))  # its own counters
    r = jax.new_ref(jnp.zeros(()))
    for _ in range(3):
        f(r, jnp.ones((3, 4)), jnp.ones((1, 3)))
    stats = f.stats()
    assert (stats.hits, stats.misses, stats.slow) == (0, 0, 3)
    assert stats.slow_reasons == {"ref": 3}


def _add_to_ref(tree):
    tree["r"][...] += tree["x"].sum() + tree["h"].sum()
    return tree["x"] * 2


@pytest.mark.parametrize("host", ["numpy", "jax"])
def test_ref_inside_a_pytree_mixed_with_host_values(host):
    results, refs = {}, {}
    for jit in (jax.jit, nbjit.jit):
        r = jax.new_ref(jnp.zeros((), jnp.float32))
        f = jit(_add_to_ref)
        for i in range(3):
            h = np.full(2, i, np.float32)
            tree = {"r": r, "x": jnp.arange(3.0) + i, "h": h if host == "numpy" else jnp.asarray(h)}
            results.setdefault(jit, []).append(f(tree))
        refs[jit] = np.asarray(r[...])
    np.testing.assert_array_equal(refs[nbjit.jit], refs[jax.jit])
    for ours, theirs in zip(results[nbjit.jit], results[jax.jit], strict=True):
        assert_same_outputs(ours, theirs)


def test_donating_a_ref_behaves_as_under_jax_jit():
    def step(r, x):
        r[...] += x
        return x + 1

    nb, jx = nbjit.jit(step, donate_argnums=0), jax.jit(step, donate_argnums=0)
    r_nb, r_jax = jax.new_ref(jnp.zeros(3)), jax.new_ref(jnp.zeros(3))
    for _ in range(2):
        assert_same_call(lambda: nb(r_nb, jnp.ones(3)), lambda: jx(r_jax, jnp.ones(3)))
    np.testing.assert_array_equal(np.asarray(r_nb[...]), np.asarray(r_jax[...]))


class _LooksLikeAnArray:
    """An object with an array's `aval` and `_committed` but no `_sharding`."""

    def __init__(self) -> None:
        self.aval = jax.core.ShapedArray((2,), jnp.float32)
        self._committed = False


def _calls(leaf):
    """One call per binder form (all-array unrolled and looped, leaves, one
    sequence, pytree, keywords, static): (function, jit options, args, kwargs)."""
    a = jnp.ones(2)

    def positional(*xs):
        return [x * 1 for x in xs]

    def sequence(xs):
        return [x * 1 for x in xs]

    def tree(t):
        return jax.tree.map(lambda x: x * 1, t)

    def keywords(x, *, k, s):
        return x * 1, k * 1, s

    return [
        (positional, {}, (a, leaf), {}),
        (positional, {}, (leaf, a, a), {}),
        (positional, {}, (a,) * 16 + (leaf,), {}),  # past the unroll limit
        (positional, {}, (np.ones(2, np.float32), leaf), {}),  # host values among leaves
        (sequence, {}, ([a, leaf],), {}),
        (sequence, {}, ([a] * 17 + [leaf],), {}),
        (sequence, {}, ((leaf, a),), {}),
        (tree, {}, ({"a": a, "b": [a, leaf]},), {}),
        (tree, {}, ({"a": leaf, "b": a},), {}),
        (keywords, {"static_argnames": "s"}, (a,), {"k": leaf, "s": 3}),
        (keywords, {"static_argnames": "s"}, (leaf,), {"k": a, "s": 3}),
    ]


@pytest.mark.parametrize("make_leaf", [lambda: jax.new_ref(jnp.ones(2)), _LooksLikeAnArray],
                         ids=["ref", "array_lookalike"])
def test_every_binder_form_gives_jax_jits_answer_for_array_like_leaves(make_leaf):
    """Each form keys a call without leaving a local unassigned: nbjit answers
    as jax.jit does (results, or the same exception type), first call and again."""
    for fun, options, args, kwargs in _calls(make_leaf()):
        nb, jx = nbjit.jit(fun, **options), jax.jit(fun, **options)
        for _ in range(2):
            assert_same_call(nb, jx, *args, **kwargs)


def test_generated_sources_are_named_by_their_text():
    """Two functions whose binders differ get different source names (so
    tracebacks and inspect.getsource show the code that ran); the same source
    keeps one name (its compiled code is shared)."""
    f = nbjit.jit(lambda x: x + 1)
    g = nbjit.jit(lambda x, n: x - n, static_argnums=1)
    h = nbjit.jit(lambda x: x * 2)
    f(jnp.ones(2))
    g(jnp.ones(2), 3)
    h(jnp.ones(2))
    bf, bg, bh = (next(iter(j._binders.values())) for j in (f, g, h))
    assert bf.__code__.co_filename != bg.__code__.co_filename
    assert bf.__code__.co_filename == bh.__code__.co_filename
    assert "type(a1), a1" in inspect.getsource(bg)  # g's static argument enters its key
    assert inspect.getsource(bg) != inspect.getsource(bf)
