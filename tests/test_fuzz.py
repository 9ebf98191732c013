"""Differential fuzzing: nbjit.jit(f) and jax.jit(f) agree on random calls.

Hypothesis draws a pytree (nested tuples, lists, dicts, None) of random
leaves (numpy arrays of many dtypes and shapes, 0-d and empty included; jax
arrays, committed to a random host device or not, or sharded over 2 or 4
devices; typed PRNG key arrays; Python and numpy
scalars), a static argument, and x64 on or off. Each call goes through
`nbjit.jit(f)` twice (a miss, then a hit) and `jax.jit(f)` once; the outputs
must agree leaf by leaf (value, dtype, weak type, sharding, committedness)
or both must raise the same exception type.

Compiles dominate the cost, so a handful of jitted functions live for the
whole module and every example adds signatures to the same caches: an
example can also catch nbjit confusing its signature with an earlier one.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import nbjit

pytestmark = pytest.mark.cpu_devices(
    "arguments committed to devices 0-7 or sharded over 2 or 4 of them, meshes of 8")

CI_EXAMPLES = 1000
SLOW_EXAMPLES = 10_000
CI_SIZE_EXAMPLES = 300
CI_DONATE_EXAMPLES = 200
CI_SHARDED_EXAMPLES = 500

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128, jnp.bfloat16]
SHAPES = [(), (0,), (1,), (3,), (2, 2), (0, 3), (1, 1, 2), (4,), (4, 1)]
PY_INTS = [0, 1, -3, 7, 2**31, 2**40, -(2**63), 2**64]  # the big ones overflow somewhere
NP_SCALAR_TYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint32, np.float16, np.float32,
                   np.float64, np.complex64]
STATICS = [None, 0, 1, True, False, 1.0, -2.5, "a", (1, 2), frozenset({3})]


# ---------------------------------------------------------------------------
# Leaves are drawn as recipes and made inside the example's x64 setting.


@dataclasses.dataclass(frozen=True)
class Leaf:
    kind: str  # numpy | jax | committed | sharded | key | ref | py_scalar | np_scalar
    dtype: Any = None
    shape: tuple = ()
    seed: int = 0
    nan: bool = False
    device: int = 0
    value: Any = None

    def host(self) -> np.ndarray:
        dtype = np.dtype(self.dtype)
        rng = np.random.default_rng(self.seed)
        if dtype.kind == "b":
            a = rng.integers(0, 2, self.shape).astype(dtype)
        elif dtype.kind in "iu":
            a = rng.integers(0 if dtype.kind == "u" else -5, 10, self.shape).astype(dtype)
        else:
            a = (rng.standard_normal(self.shape) * 3).astype(dtype)
            if self.nan and a.size:
                a.flat[0] = np.nan
        return a

    def make(self) -> Any:
        if self.kind == "numpy":
            return self.host()
        if self.kind == "jax":
            return jnp.asarray(self.host())
        if self.kind == "committed":
            return jax.device_put(self.host(), jax.devices()[self.device])
        if self.kind == "sharded":  # over 2 or 4 devices; split on axis 0 where it divides
            host = self.host()
            n = 2 if self.device % 2 else 4
            mesh = Mesh(np.array(jax.devices()[self.device % 4:][:n]), ("d",))
            split = host.ndim and host.shape[0] % n == 0
            spec = PartitionSpec("d") if split else PartitionSpec()
            return jax.device_put(host, NamedSharding(mesh, spec))
        if self.kind == "key":  # typed PRNG keys: jax.Arrays that are not ArrayImpl
            keys = jax.random.split(jax.random.key(self.seed), max(1, int(np.prod(self.shape))))
            keys = keys[0] if self.shape == () else keys[: int(np.prod(self.shape))].reshape(
                self.shape)
            return jax.device_put(keys, jax.devices()[self.device]) if self.nan else keys
        if self.kind == "ref":  # jax.new_ref (flax nnx ref mode): always JAX's own path
            return jax.new_ref(jnp.asarray(self.host()))
        if self.kind == "py_scalar":
            return self.value
        return np.dtype(self.dtype).type(self.value)  # np_scalar


@st.composite
def array_leaves(draw) -> Leaf:
    kind = draw(st.sampled_from(["numpy", "jax", "committed", "sharded", "key", "ref"]))
    return Leaf(kind, dtype=draw(st.sampled_from(DTYPES)), shape=draw(st.sampled_from(SHAPES)),
                seed=draw(st.integers(0, 1000)), nan=draw(st.booleans()),
                device=draw(st.integers(0, 7)))


py_scalars = st.one_of(
    st.booleans(), st.sampled_from(PY_INTS),
    st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from([float("nan"), float("inf"), 1e300]),
    st.complex_numbers(max_magnitude=10, allow_nan=False),
).map(lambda v: Leaf("py_scalar", value=v))


@st.composite
def np_scalars(draw) -> Leaf:
    dtype = np.dtype(draw(st.sampled_from(NP_SCALAR_TYPES)))
    if dtype.kind == "b":
        value = draw(st.booleans())
    elif dtype.kind in "iu":
        value = draw(st.integers(0 if dtype.kind == "u" else -100, 100))
    else:
        value = draw(st.floats(-100, 100))
    return Leaf("np_scalar", dtype=dtype, value=value)


leaves = st.one_of(array_leaves(), array_leaves(), py_scalars, np_scalars())

trees = st.recursive(
    leaves | st.none(),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3),
    ),
    max_leaves=5,
)


def _make(recipe: Any) -> Any:
    return jax.tree.map(lambda leaf: leaf.make(), recipe)


# ---------------------------------------------------------------------------
# A few long-lived functions, each jitted once by nbjit and once by jax.


def _double(tree):
    return jax.tree.map(lambda x: x * 2, tree)


def _identity(tree):
    return tree


def _first_sum(tree):
    """Uses one leaf only: the others are pruned (kept-var bit vector)."""
    leaves_ = jax.tree.leaves(tree)
    return [jnp.sum(leaves_[0])] if leaves_ else []


def _with_static(tree, s):
    bump = s if isinstance(s, int | float) else len(repr(s))
    return jax.tree.map(lambda x: x + bump, tree), len(repr(s))


def _keywords(tree, *, s, extra):
    return {"tree": _double(tree), "extra": extra, "s": len(repr(s))}


FUNCTIONS = {
    "double": (_double, {}),
    "identity": (_identity, {}),
    "first_sum": (_first_sum, {}),
    "static": (_with_static, {"static_argnums": 1}),
    "keywords": (_keywords, {"static_argnames": "s"}),
}
_PAIRS: dict[str, tuple] = {}


def _donating(tree):
    return jax.tree.map(lambda x: x + 1, tree)


DONATING = {"donate": (_donating, {"donate_argnums": 0})}  # not in FUNCTIONS: inputs die


def _pair(name: str) -> tuple:
    if name not in _PAIRS:
        fun, options = FUNCTIONS[name] if name in FUNCTIONS else DONATING[name]
        _PAIRS[name] = (nbjit.jit(fun, **options), jax.jit(fun, **options))
    return _PAIRS[name]


def _call_args(name: str, tree: Any, static: Any, extra: Any) -> tuple[tuple, dict]:
    if name == "static":
        return ((extra, tree), static), {}
    if name == "keywords":
        return (tree,), {"s": static, "extra": extra}
    return ([extra, tree],), {}


def _check_example(name: str, recipe: Any, static: Any, extra_recipe: Leaf, x64: bool) -> None:
    with jax.enable_x64(x64):
        tree, extra = _make(recipe), extra_recipe.make()
        args, kwargs = _call_args(name, tree, static, extra)
        nb, jx = _pair(name)
        first, expected = assert_same_call(nb, jx, *args, **kwargs)  # the miss (or slow path)
        again, _ = assert_same_call(nb, jx, *args, **kwargs)  # now a hit
        if not isinstance(expected, Exception):
            assert_same_outputs(first, expected)
            assert_same_outputs(again, expected)


example = dict(
    name=st.sampled_from(sorted(FUNCTIONS)),
    recipe=trees,
    static=st.sampled_from(STATICS),
    extra_recipe=leaves,
    x64=st.booleans(),
)
_common = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=CI_EXAMPLES, derandomize=True, **_common)
@given(**example)
def test_fuzz_nbjit_agrees_with_jax_jit(name, recipe, static, extra_recipe, x64):
    _check_example(name, recipe, static, extra_recipe, x64)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **_common)
@given(**example)
def test_fuzz_nbjit_agrees_with_jax_jit_at_scale(name, recipe, static, extra_recipe, x64):
    _check_example(name, recipe, static, extra_recipe, x64)


def _deleted(tree: Any) -> list[bool]:
    return [x.is_deleted() for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]


@settings(max_examples=CI_DONATE_EXAMPLES, derandomize=True, **_common)
@given(recipe=trees, x64=st.booleans())
def test_fuzz_donation_agrees_with_jax_jit(recipe, x64):
    """Donated inputs: each side gets its own copy of the inputs (donation
    deletes them); outputs agree, and so does which inputs were deleted."""
    nb, jx = _pair("donate")
    with jax.enable_x64(x64):
        for _ in range(2):  # a miss, then a hit
            t_nb, t_jax = _make(recipe), _make(recipe)
            assert_same_call(lambda: nb(t_nb), lambda: jx(t_jax))  # noqa: B023
            assert _deleted(t_nb) == _deleted(t_jax)


def test_fuzz_functions_stay_on_the_fast_path():
    """After the fuzzing, a plain call of every function is a cache hit."""
    x = jnp.arange(3.0)
    for name in FUNCTIONS:
        nb, jx = _pair(name)
        args, kwargs = _call_args(name, {"a": x}, 1, x)
        assert_same_outputs(nb(*args, **kwargs), jx(*args, **kwargs))
        misses = nb.miss_count
        assert_same_outputs(nb(*args, **kwargs), jx(*args, **kwargs))
        assert nb.miss_count == misses, name


def _cache_sizes_after(calls: list) -> list[tuple[int, int]]:
    def fresh(tree):  # a new function: caches are per Python function, as upstream
        return _double(tree)

    nb, jx = nbjit.jit(fresh), jax.jit(fresh)
    sizes = []
    for tree in calls:
        assert_same_outputs(nb(tree), jx(tree))
        sizes.append((nb._cache_size(), jx._cache_size()))
    return sizes


def test_numpy_scalar_and_0d_array_share_a_signature_as_upstream():
    """Found by the fuzzer (fixed in dc4bf19): same outputs, but nbjit kept more entries."""
    calls = [[np.bool_(True)], [np.array(True)], [np.float32(1)], [np.array(1, np.float32)],
             [np.float64(1)], [np.array(1.0)], [np.int64(3)], [np.array(3, np.int32)]]
    sizes = _cache_sizes_after(calls)
    assert [nb for nb, _ in sizes] == [jx for _, jx in sizes]


def test_cache_sizes_match_upstream_for_distinct_leaf_kinds():
    """Leaf kinds upstream keys apart: each is a new entry in both."""
    x = np.ones(2, np.float32)
    calls = [[True], [np.bool_(True)], [1], [np.int32(1)], [2.0], [np.float32(2.0)], [1j],
             [x], [jnp.asarray(x)], [jax.device_put(x, jax.devices()[1])], [x, x], ([x],),
             {"a": x}, [None, x], [np.ones((2, 1), np.float32)]]
    sizes = _cache_sizes_after(calls)
    assert [nb for nb, _ in sizes] == [jx for _, jx in sizes] == list(range(1, len(calls) + 1))


def _double_nb(tree):  # _double again, as two objects of their own (caches are per function)
    return jax.tree.map(lambda x: x * 2, tree)


def _double_jax(tree):
    return jax.tree.map(lambda x: x * 2, tree)


_SIZE_PAIR: list = []


@settings(max_examples=CI_SIZE_EXAMPLES, derandomize=True, **_common)
@given(recipe=trees, x64=st.booleans())
def test_fuzz_cache_sizes_agree_with_jax_jit(recipe, x64):
    """Caching semantics: after every call, nbjit holds as many entries as
    jax.jit. The two get distinct function objects (caches are per function),
    kept for the whole run, so entries accumulate and collide if keys differ."""
    if not _SIZE_PAIR:
        _SIZE_PAIR.extend([nbjit.jit(_double_nb), jax.jit(_double_jax)])
    nb, jx = _SIZE_PAIR
    with jax.enable_x64(x64):
        tree = _make(recipe)
        assert_same_call(nb, jx, tree)
        assert nb._cache_size() == jx._cache_size()


# ---------------------------------------------------------------------------
# Namedtuples and registered nodes too: keys read per structure (nbjit/core/structure.py)

FuzzPair = collections.namedtuple("FuzzPair", "first second")


@jax.tree_util.register_pytree_node_class
class FuzzNode:
    """A registered node whose node data (a tag) is part of the treedef."""

    def __init__(self, children, tag):
        self.children, self.tag = tuple(children), tag

    def tree_flatten(self):
        return self.children, self.tag

    @classmethod
    def tree_unflatten(cls, tag, children):
        return cls(children, tag)


structured_trees = st.recursive(
    leaves | st.none(),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3),
        st.tuples(children, children).map(lambda t: FuzzPair(*t)),
        st.tuples(st.lists(children, max_size=2), st.sampled_from(["x", "y"])).map(
            lambda t: FuzzNode(*t)),
    ),
    max_leaves=5,
)
_STRUCTURE_PAIR: list = []


def _scaled_nb(tree, by):  # one object per side (caches are per function)
    return jax.tree.map(lambda x: x * by, tree)


def _scaled_jax(tree, by):
    return jax.tree.map(lambda x: x * by, tree)


@settings(max_examples=CI_SIZE_EXAMPLES, derandomize=True, **_common)
@given(recipe=structured_trees, other=structured_trees, x64=st.booleans())
def test_fuzz_structures_agree_with_jax_jit(recipe, other, x64):
    """Two structures, the first called again after the second: outputs and
    cache sizes agree with jax.jit after every call (one pair of functions
    for the whole run, so every reader learned is tried on later structures)."""
    if not _STRUCTURE_PAIR:
        _STRUCTURE_PAIR.extend([nbjit.jit(_scaled_nb), jax.jit(_scaled_jax)])
    nb, jx = _STRUCTURE_PAIR
    with jax.enable_x64(x64):
        for r in (recipe, other, recipe):
            assert_same_call(nb, jx, _make(r), 1)
            assert nb._cache_size() == jx._cache_size()


# ---------------------------------------------------------------------------
# Explicit in_shardings: numpy inputs are sliced on the host by nbjit's own code.


def _shardings() -> dict[str, Any]:
    devices = jax.devices()
    line = Mesh(np.array(devices), ("d",))
    grid = Mesh(np.array(devices).reshape(2, 4), ("a", "b"))
    half = Mesh(np.array(devices[4:]), ("d",))
    return {
        "line_split": NamedSharding(line, PartitionSpec("d")),
        "line_replicated": NamedSharding(line, PartitionSpec()),
        "grid_2d": NamedSharding(grid, PartitionSpec("a", "b")),
        "grid_cols": NamedSharding(grid, PartitionSpec(None, "a")),
        "grid_partial": NamedSharding(grid, PartitionSpec("b")),  # replicated over "a"
        "grid_flat": NamedSharding(grid, PartitionSpec(("a", "b"))),
        "half_split": NamedSharding(half, PartitionSpec("d")),
        "one_device": jax.sharding.make_single_device_sharding(devices[5]),
    }


SHARDING_NAMES = sorted(["line_split", "line_replicated", "grid_2d", "grid_cols", "grid_partial",
                         "grid_flat", "half_split", "one_device"])  # _shardings() needs 8 devices
SHARDED_SHAPES = [(8,), (16,), (4, 8), (8, 4), (2, 4), (8, 0), (), (3,), (6, 4), (8, 2, 3)]
_SHARDED_PAIRS: dict[str, tuple] = {}


def _sharded_pair(name: str) -> tuple:
    if name not in _SHARDED_PAIRS:
        sharding = _shardings()[name]
        _SHARDED_PAIRS[name] = (nbjit.jit(_double, in_shardings=sharding),
                                jax.jit(_double, in_shardings=sharding))
    return _SHARDED_PAIRS[name]


@st.composite
def sharded_inputs(draw) -> Any:
    """A numpy array (maybe a strided or transposed view), or another leaf kind."""
    kind = draw(st.sampled_from(["numpy"] * 4 + ["view"] * 2 + [
        "jax", "committed", "py_scalar", "np_scalar"]))
    if kind == "py_scalar":
        return draw(py_scalars)
    if kind == "np_scalar":
        return draw(np_scalars())
    shape = draw(st.sampled_from(SHARDED_SHAPES))
    leaf = Leaf("numpy" if kind == "view" else kind, dtype=draw(st.sampled_from(DTYPES)),
                shape=shape, seed=draw(st.integers(0, 1000)), device=draw(st.integers(0, 7)))
    if kind != "view":
        return leaf
    return ("view", leaf, draw(st.sampled_from(["step", "transpose", "fortran"])))


def _make_sharded(item: Any) -> Any:
    if isinstance(item, Leaf):
        return item.make()
    _, leaf, how = item
    a = leaf.host()
    if how == "step":  # every other element of a twice-as-long array
        big = np.repeat(a, 2, axis=0) if a.ndim else a
        return big[::2] if a.ndim else big
    if how == "transpose":
        return np.ascontiguousarray(a.T).T  # a's shape, column-major strides
    return np.asfortranarray(a)


@settings(max_examples=CI_SHARDED_EXAMPLES, derandomize=True, **_common)
@given(name=st.sampled_from(SHARDING_NAMES),
       items=st.lists(sharded_inputs(), min_size=1, max_size=2), x64=st.booleans())
def test_fuzz_in_shardings_agree_with_jax_jit(name, items, x64):
    """numpy inputs (contiguous, strided, column-major; any dtype; shapes the
    sharding divides or not), scalars and jax arrays, against every kind of
    sharding: the same values, shardings and errors as jax.jit, miss and hit."""
    nb, jx = _sharded_pair(name)
    with jax.enable_x64(x64):
        tree = [_make_sharded(item) for item in items]
        for _ in range(2):  # a miss, then a hit
            assert_same_call(nb, jx, tree)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES // 2, **_common)
@given(name=st.sampled_from(SHARDING_NAMES),
       items=st.lists(sharded_inputs(), min_size=1, max_size=3), x64=st.booleans())
def test_fuzz_in_shardings_at_scale(name, items, x64):
    test_fuzz_in_shardings_agree_with_jax_jit.hypothesis.inner_test(name, items, x64)
