"""nbjit.jit against jax.jit: same outputs, errors and caching, miss and hit.

Every differential case calls each jitted function twice: the first call is
the miss (JAX's own outputs), the second the hit (nbjit's own fast path), and
both must agree with jax.jit leaf by leaf (value, dtype, weak type, sharding,
committedness). Here: dtypes, pytrees, static arguments, donation, shardings
and devices, pruning, constants, methods. The Python surface, transformations,
the cache and bad input are in test_jit_surface.py, how a call is keyed in
test_jit_keys.py; `both` and `check` in tests/_jit_pairs.py.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import NamedTuple

import _devices
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_exception, assert_same_outputs
from _jit_pairs import add_one, both, check, mul, power
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import nbjit
from nbjit import _jax
from nbjit.core import keys as _keys

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
          np.uint32, np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
          np.complex64, np.complex128]


# ---------------------------------------------------------------------------
# Scalars and dtypes


@pytest.mark.parametrize("value", [0, 7, -3, 1.5, True, False, 2 + 3j])
def test_python_scalars(value):
    check(add_one, value)


@pytest.mark.parametrize("value", [0, 7, 1.5, True, 2 + 3j])
def test_python_scalars_x64(x64, value):
    check(add_one, value)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_scalars(dtype):
    check(lambda x: x * 2, dtype(1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_arrays_every_dtype(dtype):
    x = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    check(lambda a: (a, a + a), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_arrays_every_dtype_x64(x64, dtype):
    x = (np.arange(4) % 2).astype(dtype)
    check(lambda a: a * 3, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_jax_arrays_every_dtype(dtype):
    x = jnp.asarray((np.arange(6) % 2).astype(dtype))
    check(lambda a: a - a, x)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 2, 1)])
@pytest.mark.parametrize("kind", ["numpy", "jax"])
def test_zero_d_and_empty(shape, kind):
    x = np.ones(shape, np.float32)
    check(lambda a: a * 2, jnp.asarray(x) if kind == "jax" else x)


def test_x64_toggle_is_a_different_signature():
    f = nbjit.jit(add_one)
    x = np.arange(3, dtype=np.int64)
    assert f(x).dtype == jnp.int32
    with jax.enable_x64(True):
        assert f(x).dtype == jnp.int64
        assert f(x).dtype == jnp.int64
    assert f(x).dtype == jnp.int32
    assert f.miss_count == 2 and f._cache_size() == 2


def test_weak_types_follow_python_scalars():
    f = nbjit.jit(mul)
    out = f(jnp.ones(3, jnp.bfloat16), 2.0)
    assert out.dtype == jnp.bfloat16
    assert f(2.0, 3.0).weak_type and not f(np.float32(2), 3.0).weak_type


# ---------------------------------------------------------------------------
# Pytrees


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    name: str = dataclasses.field(metadata=dict(static=True), default="p")


def tree_fun(t):
    return jax.tree_util.tree_map(lambda v: v * 2, t)


@pytest.mark.parametrize("tree", [
    (jnp.ones(2), jnp.zeros(3)),
    [jnp.ones(2), np.ones(2, np.float32), 3.0],
    {"b": jnp.ones(2), "a": {"c": np.zeros(1, np.int32)}},
    Pair(jnp.ones(2), jnp.arange(3)),
    Params(jnp.ones((2, 2)), jnp.zeros(2)),
    (None, jnp.ones(2), [None, {"x": None}]),
], ids=["tuple", "list", "dict", "namedtuple", "dataclass", "none_leaves"])
def test_pytrees(tree):
    check(tree_fun, tree)


def test_pytree_structure_change_is_a_new_signature():
    f_nb, f_jax = both(tree_fun)
    for tree in [(jnp.ones(2),), [jnp.ones(2)], {"a": jnp.ones(2)}, (jnp.ones(2),)]:
        assert_same_call(f_nb, f_jax, tree)
    assert f_nb.miss_count == 3 and f_nb._cache_size() == 3


# ---------------------------------------------------------------------------
# Static arguments and keywords


def test_static_argnums():
    f = check(power, jnp.arange(3.0), 3, options=dict(static_argnums=1))
    assert f._cache_size() == 1


def test_static_argnums_negative():
    check(power, jnp.arange(3.0), 2, options=dict(static_argnums=-1))


def test_static_argnames_and_kwargs():
    check(power, jnp.arange(3.0), n=2, scale=jnp.float32(0.5),
          options=dict(static_argnames="n"))


def test_static_args_exact_type():
    trace = []

    def f(x, n):
        trace.append(type(n))
        return x * n

    f_nb = nbjit.jit(f, static_argnums=1)
    x = jnp.ones(2)
    for n in (2, 2.0, True, 2, 2.0):
        f_nb(x, n)
    assert trace == [int, float, bool], "1, 1.0 and True are distinct static values"


def test_static_and_dynamic_keywords_in_every_call_shape(monkeypatch):
    """Which arguments are static is worked out once per call shape (number of
    positional arguments, keyword names in order) and remembered, at most
    MAX_CALL_SHAPES of them: every shape must split as jax.jit does."""
    from nbjit.core import binders as _binders

    monkeypatch.setattr(_binders, "MAX_CALL_SHAPES", 4)

    def f(x, n, *, scale=1.0, mode="mul", y=None):
        out = x * scale if mode == "mul" else x + scale
        return out ** n if y is None else out ** n + y

    f_nb, f_jax = both(f, static_argnums=1, static_argnames=("mode",))
    x, y = jnp.arange(3.0), jnp.ones(3)
    calls = [((x, 2), {}), ((x, 2), {"mode": "add"}), ((x, 3), {"y": y, "mode": "mul"}),
             ((x, 3), {"mode": "mul", "y": y}), ((x, 2), {"scale": 2.0, "mode": "add", "y": y}),
             ((x,), {"n": 2, "mode": "add"}), ((x, 2), {"y": y}), ((x, 2), {"scale": 3.0})]
    for _ in range(2):
        for args, kwargs in calls:
            assert_same_call(f_nb, f_jax, *args, **kwargs)
    assert len(f_nb._binders) <= 4 and len(f_nb._binders.splits) <= 4
    assert f_nb._cache_size() == f_jax._cache_size()


@pytest.mark.parametrize("n", [_keys.UNROLL_MAX, _keys.UNROLL_MAX + 1])
def test_many_positional_arguments_either_side_of_the_unroll_limit(n):
    """Binders unroll up to UNROLL_MAX dynamic arguments and loop beyond it:
    both forms key arrays, host values, pytrees and static arguments as
    jax.jit does, and a changed argument is a new signature in either."""

    def f(*xs, scale):
        leaves = jax.tree.leaves(xs)
        return sum(leaf * scale for leaf in leaves[1:]) - leaves[0]

    f_nb, f_jax = both(f, static_argnames="scale")
    arrays = [jnp.full(3, float(i)) for i in range(n)]
    calls = [
        arrays,
        [np.arange(3.0, dtype=np.float32), *arrays[1:]],  # a host leaf among arrays
        [*arrays[:-1], 2.5],  # a weakly typed Python scalar last
        [{"a": arrays[0], "b": (arrays[1],)}, *arrays[1:]],  # a pytree argument (still n)
        [*arrays[:-1], jnp.full(3, 1, jnp.int32)],  # another dtype in the last position
    ]
    for scale in (2.0, 3):
        for args in calls:
            for _ in range(2):
                assert_same_call(f_nb, f_jax, *args, scale=scale)
    assert f_nb.miss_count == 2 * len(calls) == f_jax._cache_size()
    assert f_nb.slow_count == 0


def test_kwargs_order_does_not_matter():
    f_nb, f_jax = both(lambda a, b: a - b)
    x, y = jnp.ones(2), jnp.arange(2.0)
    assert_same_call(f_nb, f_jax, a=x, b=y)
    assert_same_call(f_nb, f_jax, b=y, a=x)
    assert f_nb.miss_count == 1


def test_positional_and_keyword_are_different_signatures():
    f_nb, f_jax = both(mul)
    x = jnp.ones(2)
    assert_same_call(f_nb, f_jax, x, x)
    assert_same_call(f_nb, f_jax, x, y=x)
    assert f_nb.miss_count == 2


# ---------------------------------------------------------------------------
# Donation


def test_donation_deletes_and_second_use_raises():
    f_nb, f_jax = both(add_one, donate_argnums=0)
    for f in (f_nb, f_jax):
        x = jnp.ones(3)
        f(x)  # miss
        y = jnp.ones(3)
        out = f(y)  # hit
        assert y.is_deleted() and not out.is_deleted()
    a, b = jnp.ones(3), jnp.ones(3)
    f_nb(a), f_jax(b)
    # `a` was donated: deleted (before jaxlib 0.11.2 the runtime rejects it: ValueError)
    e_nb, e_jax = assert_same_exception(lambda: f_nb(a), lambda: f_jax(b))
    assert isinstance(e_nb, ValueError if _jax.RUNTIME_REJECTS_DONATED_INPUTS else RuntimeError)
    # jax.jit's words, whichever the runtime's: "Array has been deleted", or on a
    # TPU with jaxlib 0.10.2 "... Donation requested for invalid buffer"
    assert _no_addresses(str(e_nb)) == _no_addresses(str(e_jax))
    assert re.search("deleted|donat", str(e_nb), re.IGNORECASE), str(e_nb)
    assert f_nb(jnp.ones(3)).shape == (3,)  # and the entry still works


def _no_addresses(message: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", message)


def _aligned_arange(n, misalign):
    """np.arange(n) float32 in a buffer at a chosen offset from 64-byte alignment
    (aligned host buffers are the ones XLA:CPU may use in place)."""
    raw = np.empty(n * 4 + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    out = raw[start:start + n * 4].view(np.float32)
    out[:] = np.arange(n)
    return out


@pytest.mark.parametrize("misalign", [0, 16])
def test_donated_numpy_input_mutated_after_identity_call(misalign):
    """A write to the numpy input right after the call does not reach nbjit's
    result: it is the value at the call. jax.jit's reference gets an array no
    one writes to, since its own result can show the write (on the CPU it may
    use an aligned array in place; on a TPU its transfer reads the array after
    the call returns)."""
    f_nb, f_jax = both(lambda x: x, donate_argnums=0)
    for _ in range(3):  # miss, then hits
        x = _aligned_arange(4, misalign)
        at_call = x.copy()
        out = f_nb(x)
        x[:] = -1
        assert_same_outputs(out, f_jax(_aligned_arange(4, misalign)))
        np.testing.assert_array_equal(np.asarray(out), at_call)
    assert f_nb.miss_count == 1


# ---------------------------------------------------------------------------
# Shardings and devices


@pytest.fixture(scope="module")
def mesh():
    """(4, 2) on the session's 8 devices, (1, 1) on one (tests/_devices.py)."""
    return _devices.mesh(2)


def test_in_out_shardings_named(mesh):
    s_in = NamedSharding(mesh, P("x", "y"))
    s_out = NamedSharding(mesh, P(None, "y"))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), s_in)
    f = check(lambda a: a * 2, x, options=dict(in_shardings=s_in, out_shardings=s_out))
    assert f(x).sharding == s_out


def test_in_shardings_with_numpy_input(mesh):
    s_in = NamedSharding(mesh, P("x", "y"))
    check(lambda a: a.sum(0), np.arange(64.0, dtype=np.float32).reshape(8, 8),
          options=dict(in_shardings=s_in))


def test_sharded_jax_array_inputs(mesh):
    x = jax.device_put(jnp.arange(16.0).reshape(4, 4), NamedSharding(mesh, P("x")))
    y = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P(None, "y")))
    check(mul, x, y)


@pytest.mark.cpu_devices("an input on a second device")
@pytest.mark.parametrize("committed", [True, False])
def test_single_device_input_on_another_device(committed):
    dev = jax.devices()[3]
    x = jax.device_put(jnp.arange(4.0), dev) if committed else jnp.arange(4.0)
    if not committed:
        with jax.default_device(dev):
            x = jnp.arange(4.0) + 0
    check(add_one, x)


@pytest.mark.cpu_devices("inputs committed to two devices")
def test_committed_inputs_on_two_devices_raise_like_upstream():
    x = jax.device_put(jnp.ones(2), jax.devices()[0])
    y = jax.device_put(jnp.ones(2), jax.devices()[1])
    f_nb, f_jax = both(mul)
    assert_same_exception(f_nb, f_jax, x, y)


@pytest.mark.cpu_devices("an input committed to a second device")
def test_uncommitted_input_moves_to_committed_ones_device():
    x = jax.device_put(jnp.ones(2), jax.devices()[2])
    check(mul, x, jnp.arange(2.0))


@pytest.mark.cpu_devices("a second default device")
def test_default_device_context_is_part_of_the_key():
    f_nb, f_jax = both(add_one)
    for dev in (jax.devices()[0], jax.devices()[5], jax.devices()[0]):
        with jax.default_device(dev):
            assert_same_call(f_nb, f_jax, 1.0)
            assert_same_call(f_nb, f_jax, np.ones(2, np.float32))
    assert f_nb._cache_size() == 4


# ---------------------------------------------------------------------------
# Unused arguments, closures, methods


def test_unused_arguments_pruned():
    check(lambda a, b, c: a + c, jnp.ones(2), jnp.zeros(5), jnp.ones(2))


def test_unused_arguments_kept():
    check(lambda a, b: a, jnp.ones(2), np.zeros(3), options=dict(keep_unused=True))


def test_closure_over_arrays_const_args():
    w = jnp.arange(3.0)
    big = jnp.ones((100, 100))
    check(lambda x: x * w + big.sum(), jnp.ones(3))


class Model:
    def __init__(self, scale):
        self.scale = scale

    @functools.partial(nbjit.jit, static_argnums=0)
    def apply(self, x):
        return x * self.scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, Model) and other.scale == self.scale


def test_methods_bind_through_get():
    m = Model(3.0)
    out = m.apply(jnp.ones(2))
    np.testing.assert_array_equal(out, [3.0, 3.0])
    assert Model.apply._cache_size() == 1
    m.apply(jnp.zeros(2))
    assert Model.apply.miss_count == 1
    np.testing.assert_array_equal(Model(2.0).apply(jnp.ones(2)), [2.0, 2.0])
