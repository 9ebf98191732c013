"""How nbjit.jit keys a call, against jax.jit: every key form (the arrays,
host leaves, flattened pytrees, one list or tuple of arrays, mixed leaves
and their keyers, a structure's reader) hits on new values of the same kinds;
a leaf nothing keys takes JAX's path; a hit never enters JAX's Python.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_exception, assert_same_outputs, steps_of
from _jit_pairs import both

from nbjit.core import keys as _keys
from nbjit.core.inputs.values import canonical_dtypes

# ---------------------------------------------------------------------------
# Key forms and the hit path


@pytest.mark.cpu_devices("an input on a second device (a _Copy step)")
def test_hits_never_enter_jax_python_for_moved_or_host_inputs(monkeypatch):
    """Uncommitted arrays on another device, numpy and scalars: the hit path is
    nbjit's own (C++ copies and transfers), never JAX's Python shard_args."""
    from jax._src.interpreters import pxla

    with jax.default_device(jax.devices()[5]):
        moved = jnp.arange(3.0) + 0  # uncommitted, on device 5
    f_nb, f_jax = both(lambda a, b, c: a * b + c)
    args = (moved, np.float32(2), 1.0)
    assert_same_call(f_nb, f_jax, *args)  # miss

    def forbidden(*_a, **_k):
        raise AssertionError("JAX's Python shard_args called on a hit")

    monkeypatch.setattr(pxla, "shard_args", forbidden)
    monkeypatch.setattr(f_nb, "_slow", forbidden)
    nb_out = f_nb(*args)
    monkeypatch.undo()
    assert_same_outputs(nb_out, f_jax(*args))
    steps = steps_of(f_nb, *args)
    assert len(steps["_Copy"]) == 1 and len(steps["HostInput"]) == 2 and not steps["ShardArgs"]


def test_a_call_path_does_not_depend_on_earlier_calls():
    """JAX's api_benchmark builds jit_trivial_dispatch as `a, b = f(1, 2)` then
    times `f(a, b)`: the all-array calls must take the binder's path whatever
    came first (at 125992a the scalar call latched the function onto its
    pytree path for good), and pytree/host calls keep working in between."""
    def swap(a, b):
        return b, a

    f_nb, f_jax = both(swap)
    a, b = f_nb(1, 2)
    assert_same_call(f_nb, f_jax, a, b)  # miss
    assert_same_call(f_nb, f_jax, np.float32(3), 4.0)
    node, _ = f_nb._entry_for((a, b), {})
    assert node is not None and node.key == (a.aval, a._committed, b.aval, b._committed)
    hits = node.hits  # the all-array key form: read from the arrays, no flatten
    for _ in range(3):
        assert_same_outputs(f_nb(a, b), f_jax(a, b))
    assert node.hits == hits + 3
    assert_same_call(f_nb, f_jax, {"x": a}, [b])  # pytrees still keyed, from flattened leaves
    assert f_nb.slow_count == 0


def _form_add(x, y, s, *, z, mode):
    out = jax.tree.map(lambda v: v * s, (x, y, z)) if mode == "mul" else (x, y, z)
    return out


@pytest.mark.parametrize("form", ["arrays", "host leaves", "pytrees", "mixed pytree"])
def test_every_key_form_hits_on_new_values(form):
    """A binder keys a call from the arrays (all jax.Arrays), from the values
    as leaves (host values), or from flattened pytrees: each form hits on the
    second call with new values of the same kinds, as jax.jit."""
    def make(i):
        v = {"arrays": jnp.full(3, float(i)), "host leaves": np.full(3, i, np.float32),
             "pytrees": [jnp.full(3, float(i))], "mixed pytree": {"a": np.float32(i), "b": i}}
        return v[form]

    f_nb, f_jax = both(_form_add, static_argnums=(2,), static_argnames=("mode",))
    for i in range(3):
        assert_same_call(f_nb, f_jax, make(i), make(i + 1), 2, z=make(i + 2), mode="mul")
    assert f_nb.miss_count == 1 and f_nb.slow_count == 0
    assert f_nb._cache_size() == f_jax._cache_size() == 1
    node, _ = f_nb._entry_for((make(7), make(8), 2), {"z": make(9), "mode": "mul"})
    assert node is not None and node.hits == 2
    # Another static value is another signature, in every form.
    assert_same_call(f_nb, f_jax, make(0), make(1), 3, z=make(2), mode="mul")
    assert f_nb.miss_count == 2


def _by_container(xs, scale=2.0):
    if isinstance(xs, list):
        return [x * scale for x in xs]
    return tuple(x + scale for x in xs)


@pytest.mark.parametrize("n", [4, _keys.UNROLL_MAX + 1])
@pytest.mark.parametrize("static", [False, True])
def test_one_list_or_tuple_of_arrays_is_keyed_without_flatten(static, n):
    """f(xs), the many-args case: a list or tuple of jax.Arrays is keyed from its
    elements (no flatten; flat signatures up to UNROLL_MAX elements, pairs
    beyond). List and tuple trace differently, so they are two signatures;
    an element that is not a jax.Array takes the flattened form."""
    if static:
        f_nb, f_jax = both(_by_container, static_argnums=(1,))
        args = lambda xs: (xs, 3.0)  # noqa: E731
    else:
        f_nb, f_jax = both(lambda xs: _by_container(xs))
        args = lambda xs: (xs,)  # noqa: E731
    xs = [jnp.full(3, float(i)) for i in range(n)]
    for i in range(3):  # new values on every call
        ys = [x + i for x in xs]
        assert_same_call(f_nb, f_jax, *args(ys))
        assert_same_call(f_nb, f_jax, *args(tuple(ys)))
    assert f_nb.miss_count == 2 and f_nb._cache_size() == 2
    for container in (list, tuple):
        node, _ = f_nb._entry_for(args(container(xs)), {})
        assert node.key[0] is _keys.SEQUENCE and node.key[3] is container and node.hits == 2
        assert len(node.key[4]) == (2 * n if n <= _keys.UNROLL_MAX else n)
    assert_same_call(f_nb, f_jax, *args([xs[0], np.ones(3, np.float32), *xs[2:]]))
    assert_same_call(f_nb, f_jax, *args([*xs[:-1], np.ones(3, np.float32)]))  # the last one
    assert_same_call(f_nb, f_jax, *args((xs[0], [xs[1]])))  # x + [...] raises: a failed compile
    assert_same_call(f_nb, f_jax, *args([]))
    assert f_nb.miss_count == 5 and f_nb.stats().raised == 1 and not f_nb.stats().slow


def test_a_leaf_nothing_keys_takes_jax_path():
    class Weird(int):  # an int subclass: JAX takes it, nbjit's keys do not
        pass

    f_nb, f_jax = both(lambda x, y: x + y)
    x = jnp.arange(3)
    for args in [(x, Weird(2)), ([x], Weird(2)), (x, {"k": Weird(2)})]:
        assert_same_call(f_nb, f_jax, *args)
    assert f_nb.slow_count == 3 and f_nb.stats().slow_reasons == {"unknown_leaf_type": 3}
    assert f_nb._cache_size() == 0
    for args in [(x, object()), ([x], object())]:
        assert_same_exception(f_nb, f_jax, *args)
    assert f_nb._cache_size() == 0


def test_leaves_keyed_inline_have_leaf_signatures():
    """The binder keys leaves inline (one expression per argument) and
    `mixed_signatures` keys them in a loop: both give `leaf_signature` for
    every kind of leaf, numpy dtypes never seen before and numpy scalars too."""
    canonical = canonical_dtypes[False]
    kinds = [jnp.ones(2), np.ones(2, np.float32), np.ones(2, np.float64),
             np.ones(2, ml_dtypes.float8_e4m3b11fnuz), np.float16(1), True, 3, 2.5, 1j]
    for a, b in itertools.product(kinds, repeat=2):
        f_nb, f_jax = both(lambda x, y: (x, y))
        assert_same_call(f_nb, f_jax, a, b)
        node, leaves = f_nb._entry_for((a, b), {})
        expected = tuple(_keys.leaf_signature(x, canonical) for x in (a, b))
        if all(isinstance(x, jax.Array) for x in (a, b)):
            continue  # the all-array form: bare (aval, committed) pairs
        assert node.key[0] is _keys.LEAVES and node.key[-1] == expected
        assert _keys.mixed_signatures([a, b])[0] == expected


def test_mixed_keyers_key_as_mixed_signatures():
    """A treedef's mixed leaves are keyed by a keyer unrolled for the types its
    first mixed call had: the same signatures and shardings as
    `mixed_signatures` for every kind of leaf; leaves of other types take
    `mixed_signatures`. No keyer for numpy scalars or for a dtype whose
    canonical form depends on x64 (float64)."""
    kinds = [jnp.ones(2), np.ones(2, np.float32), np.ones(2, np.float64), np.ones((1, 2), bool),
             np.ones(2, ml_dtypes.bfloat16), np.float16(1), True, 3, 2.5, 1j]

    def pattern(leaves):
        return [(type(u), getattr(u, "dtype", None)) for u in leaves]

    for tid, (a, b) in enumerate(itertools.product(kinds, repeat=2), start=1 << 40):
        _keys.learn_mixed_keyer(tid, [a, b])
        keyer = _keys.mixed_keyers.pop(tid)
        learnt = not any(isinstance(u, np.generic) or getattr(u, "dtype", None) == np.float64
                         for u in (a, b) if not isinstance(u, jax.Array))
        assert (keyer is not _keys._no_keyer) == learnt, (a, b)
        for x64 in (False, True):
            with jax.enable_x64(x64):
                for c, d in itertools.product(kinds, repeat=2):
                    got = keyer([c, d])
                    if learnt and pattern([c, d]) == pattern([a, b]):
                        assert got == _keys.mixed_signatures([c, d]), (a, b, c, d)
                    else:
                        assert got is None, (a, b, c, d)


def test_a_pytree_with_host_leaves_is_keyed_by_its_keyer():
    """The first call of a structure learns its reader (nbjit.core.structure);
    a hit then keys through it (same key), and another leaf type still hits
    its own entry."""
    f_nb, f_jax = both(lambda p, x: (p["w"] * x, p["b"] + 1))
    params = {"w": jnp.ones(3), "b": jnp.zeros(3)}
    x = np.arange(3, dtype=np.float32)
    assert_same_call(f_nb, f_jax, params, x)
    node, _ = f_nb._entry_for((params, x), {})
    assert type(node.key[0]) is int  # a reader's id heads the key
    for _ in range(3):
        assert_same_call(f_nb, f_jax, params, x + 1)
    assert_same_call(f_nb, f_jax, params, 2.5)  # a Python float: the keyer refuses, a miss
    assert_same_call(f_nb, f_jax, params, 3.5)
    assert f_nb.miss_count == 2 and node.hits == 3
