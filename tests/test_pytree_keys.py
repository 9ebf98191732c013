"""Keys read per structure (nbjit/core/structure.py): a pytree call is keyed by
the reader of its structure, and every reader agrees with JAX's treedefs.

Differential against jax.jit throughout: outputs agree leaf by leaf, and the
cache sizes agree after every call (a reader whose guards passed for a
structure JAX keys apart would show as a missing entry; one keying a call
two ways, as an extra entry).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbjit
from nbjit.core import structure

Pair = collections.namedtuple("Pair", "left right")


@jax.tree_util.register_pytree_node_class
class Box:
    """A registered node whose node data (its label) enters the treedef."""

    def __init__(self, items, label="box"):
        self.items, self.label = list(items), label

    def tree_flatten(self):
        return self.items, self.label

    @classmethod
    def tree_unflatten(cls, label, items):
        return cls(items, label)


@dataclasses.dataclass
class Layer:
    w: object
    b: object
    act: str = "tanh"


jax.tree_util.register_dataclass(Layer, data_fields=["w", "b"], meta_fields=["act"])


def _double(*trees):
    return jax.tree.map(lambda x: x * 2, trees)


def _both(fun=None, **options):
    def fresh(*args, **kwargs):  # a new function: caches are per function, as upstream
        return (fun or _double)(*args, **kwargs)

    return nbjit.jit(fresh, **options), jax.jit(fresh, **options)


def _check_calls(calls, fun=None, **options):
    """Each call through both; outputs and cache sizes agree after every one
    (and no call raises: these are all valid calls)."""
    nb, jx = _both(fun, **options)
    for args in calls:
        for _ in range(2):  # a miss (or a hit of an earlier structure), then a hit
            out, _ = assert_same_call(nb, jx, *args)
            assert not isinstance(out, Exception), out
            assert nb._cache_size() == jx._cache_size(), args
    return nb


def _readers(nb):
    return [r for split in nb._binders.splits.values() if split.readers
            for r in split.readers.tried]


# ---------------------------------------------------------------------------
# Structures


def test_a_params_dict_is_keyed_by_its_reader_and_hits():
    x = jnp.ones((2, 4))
    params = {f"l{i}": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)} for i in range(3)}
    nb = _check_calls([(params, x)])
    node, leaves = nb._entry_for((params, x), {})
    assert type(node.key[0]) is int and node.hits >= 1  # a reader's id heads the key
    assert len(leaves) == 7 and leaves[-1] is x
    assert len(_readers(nb)) == 1 and nb.miss_count == 1


def test_dict_key_order_does_not_change_the_signature():
    x, y = jnp.ones(2), jnp.zeros(3)
    nb = _check_calls([({"a": x, "b": y},), ({"b": y, "a": x},)])
    assert nb._cache_size() == 1 and nb.miss_count == 1


def test_a_dict_with_other_keys_of_the_same_length_is_a_new_signature():
    x = jnp.ones(2)
    nb = _check_calls([({"a": x, "b": x},), ({"a": x, "c": x},), ({"a": x, "b": x},)])
    assert nb._cache_size() == 2


@pytest.mark.parametrize("calls", [
    [([1.0, 2.0],), ((1.0, 2.0),), ([1.0, 2.0, 3.0],)],  # container type and length
    [((jnp.ones(2), None),), ((jnp.ones(2), jnp.ones(2)),), ((None, jnp.ones(2)),)],
    [(Pair(jnp.ones(2), 1.0),), ((jnp.ones(2), 1.0),), (Pair(jnp.ones(2), jnp.ones(1)),)],
    [(Box([jnp.ones(2)]),), (Box([jnp.ones(2)], "other"),), (Box([jnp.ones(2), 1.0]),)],
    [(Layer(jnp.ones(2), jnp.zeros(2)),), (Layer(jnp.ones(2), jnp.zeros(2), "relu"),)],
    [({"a": [jnp.ones(2)]},), ({"a": (jnp.ones(2),)},), ({"a": jnp.ones(2)},)],
    [({"a": jnp.ones(2)}, np.ones(2)), ({"a": np.ones(2)}, jnp.ones(2)),  # leaf kinds
     ({"a": 1}, 2.0), ({"a": True}, 2.0), ({"a": np.float32(1)}, 2.0)],
])
def test_structures_that_jax_keys_apart_are_keyed_apart(calls):
    nb = _check_calls(calls)
    assert nb._cache_size() == len(calls)


def test_keyword_and_static_arguments_enter_reader_keys():
    def f(p, s, *, q, t):
        return _double(p), _double(q), s, t

    x = jnp.ones(2)
    calls = [(({"a": x}, 1), {"q": [x], "t": "u"}), (({"a": x}, True), {"t": "u", "q": [x]}),
             (({"a": x}, 1), {"q": [x], "t": "v"}), (({"a": x}, 1.0), {"q": (x,), "t": "u"})]
    nb, jx = nbjit.jit(f, static_argnums=1, static_argnames="t"), jax.jit(f, static_argnums=1,
                                                                          static_argnames="t")
    for args, kwargs in calls * 2:
        assert_same_call(nb, jx, *args, **kwargs)
        assert nb._cache_size() == jx._cache_size()
    assert nb._cache_size() == 4


def test_a_raising_node_data_eq_takes_jax_path():
    class Bad:
        def __eq__(self, other):
            raise RuntimeError("no eq")

        def __hash__(self):
            return 1

    bad = Bad()
    x = jnp.ones(2)
    nb, jx = _both()
    nb(Box([x], "other label"))  # a treedef of the same type seen before
    for arg in (Box([x], bad), Box([x], bad), Box([x], Bad())):  # identity; then __eq__ raises
        out, _ = assert_same_call(nb, jx, arg)
    assert isinstance(out, ValueError)
    calls = nb.stats().calls
    assert nb._entry_for((Box([x], bad),), {}) == (None, [])  # keying only runs nothing
    assert nb.stats().calls == calls


def test_unkeyable_leaves_in_a_structure_take_jax_path():
    nb, jx = _both()
    assert_same_call(nb, jx, {"a": jnp.ones(2), "b": "text"})  # not a valid jit argument
    with pytest.raises(TypeError):
        nb({"a": "text"})

    def loss(p):
        return jnp.sum(nb(p)[0]["w"])  # tracers inside a known structure

    p = {"w": jnp.ones(3)}
    nb(p)
    np.testing.assert_array_equal(jax.grad(loss)(p)["w"], 2 * np.ones(3))


def test_equinox_modules_are_read_per_structure():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.key(0))
    params, static = eqx.partition(mlp, eqx.is_array)  # the arrays; activations left out
    x = jnp.ones(4)
    nb = _check_calls([(params, x)], fun=lambda p, x: eqx.combine(p, static)(x))
    assert nb.miss_count == 1 and len(_readers(nb)) == 1
    lin = eqx.nn.Linear(4, 2, key=jax.random.key(1))
    wider = eqx.nn.Linear(4, 2, key=jax.random.key(2))
    object.__setattr__(wider, "in_features", 5)  # only the node data (a static field) differs
    nb2 = _check_calls([(lin, x), (wider, x), (lin, x)], fun=lambda m, x: m.weight @ x)
    assert nb2._cache_size() == 2


# ---------------------------------------------------------------------------
# Namedtuples (optax's states): read by exact type and position, as JAX keys them


class AdamState(collections.namedtuple("AdamState", "count mu nu")):
    """An optimizer state as optax writes them: a step count and two trees."""


Empty = collections.namedtuple("Empty", "")


class Labelled(collections.namedtuple("Labelled", "value label")):
    """A namedtuple subclass registered with a flatten of its own: `label` is node
    data (a change recompiles), `value` the one child. Not a namedtuple node."""


jax.tree_util.register_pytree_node(Labelled, lambda t: ((t.value,), t.label),
                                   lambda label, children: Labelled(children[0], label))


def _read_by_a_reader(nb, *args):
    """Whether the call's key is a reader's (its id heads the key), not the general path's."""
    got = nb.key_of(args)
    return got is not None and type(got[1][0]) is int


def _adam(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return (AdamState(jnp.zeros((), jnp.int32), zeros, zeros), Empty())


def test_namedtuple_states_are_read_by_their_reader():
    params = {f"l{i}": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)} for i in range(2)}
    x = np.ones((2, 4), np.float32)
    state = _adam(params)
    nb = _check_calls([(params, state, x), (params, state, x)])
    assert nb.miss_count == 1 and _read_by_a_reader(nb, params, state, x)
    assert len(_readers(nb)) == 1


@pytest.mark.parametrize("calls", [
    # field values: array / None / Python scalar / another structure
    [(AdamState(jnp.ones(()), None, None),), (AdamState(jnp.ones(()), jnp.ones(2), None),),
     (AdamState(1.0, None, None),), (AdamState(jnp.ones(()), [jnp.ones(2)], None),)],
    # the same fields in another type, and a plain tuple of the same length
    [(AdamState(jnp.ones(()), None, None),),
     (collections.namedtuple("AdamState", "count mu nu")(jnp.ones(()), None, None),),
     ((jnp.ones(()), None, None),), (Empty(),), ((),)],
    # a registered namedtuple subclass: its node data (the label) is keyed, by value
    [(Labelled(jnp.ones(2), "a"),), (Labelled(jnp.ones(2), "b"),), (Labelled(jnp.ones(3), "a"),),
     (Labelled(jnp.ones(2), "a"),)],
])
def test_namedtuple_structures_key_as_jax_keys_them(calls):
    nb = _check_calls(calls)
    distinct = {jax.tree_util.tree_structure(c) for c in calls}
    for args in calls:  # (a call without leaves is keyed without a reader)
        assert _read_by_a_reader(nb, *args) or not jax.tree.leaves(args), args
    assert nb._cache_size() >= len(distinct)


def test_a_registered_namedtuple_subclass_is_flattened_by_its_own_function():
    """`Labelled` has `_fields`, but JAX flattens it with its registered function:
    its label is node data, not a leaf. Read as a namedtuple, a new label would be
    a new leaf value (no recompile); as JAX keys it, a new signature."""
    nb, jx = _both(lambda t: t.value * 2 if t.label == "double" else t.value)
    for label in ("double", "same", "double"):
        assert_same_call(nb, jx, Labelled(jnp.ones(2), label))
        assert nb._cache_size() == jx._cache_size()
    assert nb._cache_size() == 2
    source = inspect.getsource(_readers(nb)[0])
    assert "flatten_one_level" in source


def test_a_namedtuple_registered_after_its_reader_was_built_keys_as_jax_does():
    Late = collections.namedtuple("Late", "value label")
    nb, jx = _both(lambda t: t)
    assert_same_call(nb, jx, Late(jnp.ones(2), jnp.zeros(2)))
    assert _read_by_a_reader(nb, Late(jnp.ones(2), jnp.zeros(2)))
    jax.tree_util.register_pytree_node(Late, lambda t: ((t.value,), None),
                                       lambda _, children: Late(children[0], None))
    out, _ = assert_same_call(nb, jx, Late(jnp.ones(2), jnp.zeros(2)))  # (the label: dropped)
    assert out.label is None
    assert nb._cache_size() == jx._cache_size() == 2


class _Unhashable(type):
    __hash__ = None  # type: ignore[assignment]

    def __eq__(cls, other):
        return cls is other


class OddPair(tuple, metaclass=_Unhashable):
    """A namedtuple-like node whose type cannot be hashed (JAX reads it as a namedtuple)."""

    _fields = ("a", "b")


def test_which_nodes_are_read_as_namedtuples():
    """Only a namedtuple that jax.tree_util did not register, with the type alone
    as node data; a registered subclass, a type that cannot be hashed (looked up
    among the registrations: read by the one-level path) are not."""
    assert structure._namedtuple_node(AdamState, None)
    assert structure._namedtuple_node(Empty, None)
    assert not structure._namedtuple_node(Labelled, None)  # registered: its own flatten
    assert not structure._namedtuple_node(AdamState, "aux")
    assert not structure._namedtuple_node(OddPair, None)
    assert not structure._namedtuple_node(tuple, None) and not structure._namedtuple_node(Box, None)


def test_optax_states_are_read_by_their_reader():
    optax = pytest.importorskip("optax")
    params = {"l0": {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}, "l1": {"w": jnp.ones((3, 2))}}
    x = np.ones((5, 4), np.float32)

    def loss(p, x):
        return jnp.sum(jnp.tanh(x @ p["l0"]["w"] + p["l0"]["b"]) @ p["l1"]["w"])

    for opt in (optax.adam(1e-2), optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2)),
                optax.sgd(1e-2, momentum=0.9)):
        def step(p, s, x, opt=opt):
            grads = jax.grad(loss)(p, x)
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        nb, jx = nbjit.jit(step), jax.jit(step)
        pn = pj = params
        sn = sj = opt.init(params)
        for _ in range(3):
            (pn, sn), (pj, sj) = nb(pn, sn, x), jx(pj, sj, x)
            assert_same_outputs((pn, sn), (pj, sj))
        assert nb._cache_size() == jx._cache_size() == 1
        assert _read_by_a_reader(nb, pn, sn, x), opt


# ---------------------------------------------------------------------------
# Random structures: every pair the readers see agrees with JAX


names = st.sampled_from(["a", "b", "c", "w"])
leaf_values = st.sampled_from(["jax", "jax2", "numpy", "float", "int", "np32"])


def _leaf(kind):
    return {"jax": jnp.ones(2), "jax2": jnp.zeros((1, 2)), "numpy": np.ones(2, np.float32),
            "float": 1.5, "int": 3, "np32": np.float32(2)}[kind]


structures = st.recursive(
    leaf_values | st.none(),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.lists(children, max_size=3).map(tuple),
        st.dictionaries(names, children, max_size=3),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        st.tuples(st.lists(children, max_size=2), st.sampled_from(["x", "y"])).map(
            lambda t: Box(*t)),
    ),
    max_leaves=6,
)


def _build(recipe):
    return jax.tree.map(_leaf, recipe, is_leaf=lambda r: isinstance(r, str))


_FUZZ: list = []


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(first=structures, second=structures)
def test_random_structures_agree_with_jax_jit(first, second):
    """Two functions live for the whole run, so readers of earlier examples
    are tried (and must refuse or agree) on every later structure."""
    if not _FUZZ:
        _FUZZ.extend(_both())
    nb, jx = _FUZZ
    for recipe in (first, second, first):
        tree = _build(recipe)
        assert_same_call(nb, jx, tree, 1.0)
        assert nb._cache_size() == jx._cache_size()
        if not jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)):  # (a leaf: no reader)
            assert _read_by_a_reader(nb, tree, 1.0)  # every structure here has a reader


# ---------------------------------------------------------------------------
# The partition policy (for nbjit.filter_jit) and generated source


def test_partition_keys_static_leaves_by_equality_and_arrays_by_signature():
    readers = structure.Readers(["fun", "a0"], form="test", policy=structure.PARTITION)
    x = jnp.ones(2)
    keys = []
    for static in (1, True, 1.0):
        key, shardings, dynamic = readers.read(_double, {"x": x, "n": static, "h": np.ones(3)})
        assert type(dynamic[0]) is np.ndarray and dynamic[1] is x and len(dynamic) == 2  # h, x
        keys.append(key)
    assert keys[0] == keys[1] == keys[2] and hash(keys[0]) == hash(keys[2])  # equinox: 1 == True
    assert readers.read(_double, {"x": x, "n": 2, "h": np.ones(3)})[0] != keys[0]
    assert readers.read(_double, {"x": x, "n": 1, "h": np.ones(4)})[0] != keys[0]
    assert readers.read(_double, {"x": x, "m": 1, "h": np.ones(3)})[0] != keys[0]
    assert readers.read(_double, {"x": 1, "n": 1, "h": np.ones(3)})[0] != keys[0]

    def traced(y):  # a tracer leaf: no reader reads it (the caller's general path does)
        assert readers.read(_double, {"x": y, "n": 1, "h": np.ones(3)}) is None
        return y

    strings = np.array(["a"])  # a numpy array no key can hold: unkeyable, as in jax.jit
    assert readers.read(_double, {"x": x, "n": 1, "h": strings}) is structure.UNKEYABLE

    jax.jit(traced)(x)


def test_generated_readers_are_lint_clean():
    nb, _ = _both()
    calls = [({"a": jnp.ones(2), "b": [1.0, None, (np.float32(2), jnp.ones(3))]}, np.ones(2)),
             (Pair(Box([jnp.ones(2)], "x"), {"k": 3}), 2), ([()], {})]
    for args in calls:
        nb(*args)
    readers = structure.Readers(["fun", "a0"], form="lint", policy=structure.PARTITION)
    readers.read(_double, {"x": jnp.ones(2), "n": 1, "m": Pair(2, np.ones(1))})
    sources = [inspect.getsource(r) for r in _readers(nb) + readers.tried]
    assert len(sources) == 4
    ruff = [sys.executable, "-m", "ruff"]
    if subprocess.run([*ruff, "--version"], capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed")
    for source in sources:
        with tempfile.NamedTemporaryFile("w", suffix=".py") as fh:
            fh.write(source)
            fh.flush()
            run = subprocess.run([*ruff, "check", "--no-cache", "--isolated", "--line-length",
                                  "100", "--select", "E,F,W,B,UP", "--ignore", "F821", fh.name],
                                 capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + source


def test_outputs_do_not_depend_on_the_reader():
    """The same structure keyed by a reader (hit) and by the general path (miss)."""
    p = {"w": jnp.arange(3.0), "b": np.arange(3, dtype=np.float32)}
    nb, jx = _both()
    first = nb(p)
    assert_same_outputs(first, jx(p))
    assert_same_outputs(nb(p), first)


def test_keyword_calls_found_by_positional_count_check_their_names():
    """A keyword call's binder is found by its positional count alone (``~nargs``);
    the binder checks the names, and a call with other names (or another count of
    them) runs the binder of its own call shape: each keys as jax.jit does."""
    def f(x, n, *, y=None, mode="mul", z=None):
        out = x * n if mode == "mul" else x + n
        return out if y is None else out + y if z is None else out + y * z

    nb = nbjit.jit(f, static_argnums=1, static_argnames=("mode",))
    jx = jax.jit(f, static_argnums=1, static_argnames=("mode",))
    x, y = jnp.arange(3.0), jnp.ones(3)
    calls = [{"y": y, "mode": "mul"}, {"mode": "mul", "y": y}, {"z": y, "mode": "add"},
             {"y": y, "z": y}, {"y": y, "mode": "add", "z": 2.0}, {"y": y}, {"mode": "add"}]
    for _ in range(2):
        for kwargs in calls:
            assert_same_call(nb, jx, x, 2, **kwargs)
            assert nb._cache_size() == jx._cache_size()
    assert nb._binders[~2] is nb._binders[(2, "y", "mode")]  # the first names seen
    assert nb.stats().misses == jx._cache_size()
    for jitted in (nb, jx):  # an unknown keyword: JAX's error (each caches the failed entry)
        with pytest.raises(TypeError, match="'q'"):
            jitted(x, 2, y=y, q=1)
    assert nb._cache_size() == jx._cache_size()
    assert_same_call(nb, jx, x, 2, y=y, mode="mul")  # and the first names still hit
    assert nb.stats().misses == 6


def test_equinox_modules_are_read_by_field_as_equinox_flattens_them():
    """A Module's fields are read from its ``__dict__`` (no one-level flatten),
    with guards as strict as equinox's flatten and JAX's treedef equality: a
    changed static field, an extra ``__dict__`` entry (equinox then puts wrapper
    fields in the node data), a subclass, a missing field each key as jax.jit
    keys them."""
    eqx = pytest.importorskip("equinox")

    class Scale(eqx.Module):
        w: jax.Array
        b: jax.Array
        name: str = eqx.field(static=True)
        act: object = eqx.field(static=True)

    class Sub(Scale):
        pass

    def fun(m, x):
        return m.act(m.w * x + m.b) * len(m.name)

    def make(cls=Scale, name="s", act=jnp.tanh):  # w and b differ: leaf order shows
        return cls(jnp.ones(2), jnp.full(2, 3.0), name, act)

    extra = make()
    object.__setattr__(extra, "__doc__", "a wrapper field")  # node data holds wrapper fields
    missing = make()
    del missing.__dict__["b"]  # equinox flattens it as MISSING
    renamed = make()
    object.__setattr__(renamed, "name", "t")  # behind equinox's back: a new static value
    x = jnp.arange(2.0)
    m = make()
    nb = _check_calls([(m, x), (make(), x), (make(name="t"), x), (renamed, x),
                       (make(act=jnp.sin), x), (extra, x), (make(Sub), x), (m, x),
                       (make(name="s"), x)], fun=fun)
    assert nb._cache_size() == 5  # s/tanh, t/tanh, s/sin, wrapper fields, Sub
    readers = _readers(nb)
    assert any("__dict__" in inspect.getsource(r) for r in readers)
    assert nb.miss_count == 5
    jx = jax.jit(fun)
    for arg in (missing, make()):  # JAX's path for a missing field; then the reader again
        assert_same_call(nb, jx, arg, x)
    mlp = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.key(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    nb2 = _check_calls([(params, jnp.arange(4.0))], fun=lambda p, x: eqx.combine(p, static)(x))
    source = inspect.getsource(_readers(nb2)[0])
    assert "flatten_one_level" not in source and source.count("__dict__") == 4  # MLP, 3 Linear
