"""nbjit.jit against jax.jit: same outputs, errors and caching, miss and hit.

Every differential case calls each jitted function twice: the first call is
the miss (JAX's own outputs), the second the hit (nbjit's own fast path), and
both must agree with jax.jit leaf by leaf (value, dtype, weak type, sharding,
committedness).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import pickle
import re
import types
import weakref
from typing import NamedTuple

import _devices
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _diff import assert_same_call, assert_same_exception, assert_same_outputs, steps_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import nbjit
from nbjit import _jax
from nbjit.core import keys as _keys
from nbjit.core.dispatch import PjitFunction
from nbjit.core.inputs.values import canonical_dtypes

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
          np.uint32, np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
          np.complex64, np.complex128]


def fresh_copy(fun):
    """A distinct function object with the same code: jit caches are per function."""
    copy = types.FunctionType(fun.__code__, fun.__globals__, fun.__name__,
                              fun.__defaults__, fun.__closure__)
    copy.__kwdefaults__ = fun.__kwdefaults__
    copy.__qualname__ = fun.__qualname__
    return copy


def both(fun, /, **options):
    """nbjit.jit and jax.jit of a fresh copy of `fun` (so counts start at zero)."""
    fun = fresh_copy(fun)
    return nbjit.jit(fun, **options), jax.jit(fun, **options)


def check(fun, *args, options=None, calls=2, **kwargs):
    """Calls nbjit.jit(fun) and jax.jit(fun) `calls` times; all must agree.

    Returns the nbjit function, whose miss count must be 1 (one compile per
    signature; every later call a hit), or 0 when the calls raise (a failed
    compile caches nothing).
    """
    f_nb, f_jax = both(fun, **(options or {}))
    for _ in range(calls):
        result, _ = assert_same_call(f_nb, f_jax, *args, **kwargs)
    expected = 0 if isinstance(result, Exception) else 1
    assert f_nb.miss_count == expected, f"expected {expected} misses, got {f_nb.miss_count}"
    return f_nb


def add_one(x):
    return x + 1


def mul(x, y):
    return x * y


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


def power(x, n, *, scale=1.0):
    return scale * x ** n


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


# ---------------------------------------------------------------------------
# Python surface


def documented(x, y=2):
    """Multiplies."""
    return x * y


def test_wraps_and_signature():
    f = nbjit.jit(documented)
    assert f.__wrapped__ is documented
    assert f.__name__ == "documented" and f.__doc__ == "Multiplies."
    assert f.__qualname__ == documented.__qualname__
    import inspect
    assert inspect.signature(f) == inspect.signature(jax.jit(documented))
    assert "documented" in repr(f)


def test_decorator_and_factory_forms():
    @nbjit.jit
    def a(x):
        return x + 1

    @nbjit.jit(static_argnames="n")
    def b(x, n):
        return x + n

    c = functools.partial(nbjit.jit, static_argnums=1)(lambda x, n: x * n)
    assert isinstance(a, PjitFunction) and isinstance(b, PjitFunction)
    assert float(a(1.0)) == 2.0 and float(b(1.0, n=2)) == 3.0 and float(c(2.0, 3)) == 6.0


def test_option_validation_matches_upstream():
    bad = (dict(static_argnums="x"), dict(donate_argnames=0), dict(static_argnames=1),
           dict(device=jax.devices()[0], backend="cpu"), dict(in_shardings=3))
    for options in bad:
        outcomes = []
        for jit in (nbjit.jit, jax.jit):
            try:
                jit(documented, **options)(jnp.ones(2))
                outcomes.append(None)
            except Exception as e:  # noqa: BLE001
                outcomes.append(type(e))
        assert outcomes[0] is outcomes[1] is not None, (options, outcomes)


def test_pickling_roundtrip():
    f = nbjit.jit(documented, static_argnames="y")
    g = pickle.loads(pickle.dumps(f))
    assert isinstance(g, PjitFunction)
    assert_same_outputs(g(jnp.ones(2), y=3), jax.jit(documented, static_argnames="y")(
        jnp.ones(2), y=3))
    cache = pickle.loads(pickle.dumps(nbjit.PjitFunctionCache(17)))
    assert cache.capacity() == 17 and cache.size() == 0


def test_aot_lower_compile_trace_eval_shape():
    f_nb, f_jax = both(mul)
    x = jnp.ones((2, 3))
    compiled = f_nb.lower(x, x).compile()
    assert_same_outputs(compiled(x, x), f_jax.lower(x, x).compile()(x, x))
    assert f_nb.trace(x, x).jaxpr.eqns[0].primitive.name == "mul"
    assert f_nb.eval_shape(x, x) == f_jax.eval_shape(x, x)
    assert f_nb.lower(x, x).as_text() == f_jax.lower(x, x).as_text()


# ---------------------------------------------------------------------------
# Transformations and effects


def test_inside_jit_grad_vmap_scan():
    inner = nbjit.jit(lambda x: jnp.sin(x) * 2)
    ref = jax.jit(lambda x: jnp.sin(x) * 2)
    x = jnp.arange(4.0)
    assert_same_outputs(jax.jit(lambda v: inner(v) + 1)(x), jax.jit(lambda v: ref(v) + 1)(x))
    assert_same_outputs(jax.grad(lambda v: inner(v).sum())(x),
                        jax.grad(lambda v: ref(v).sum())(x))
    assert_same_outputs(jax.vmap(inner)(x), jax.vmap(ref)(x))
    scan = lambda f: jax.lax.scan(lambda c, v: (c + f(v), c), 0.0, x)  # noqa: E731
    assert_same_outputs(scan(inner), scan(ref))
    # and the concrete call afterwards is still a normal cached call
    assert_same_outputs(inner(x), ref(x))
    assert_same_outputs(inner(x), ref(x))


def test_disable_jit_runs_python():
    trace = []

    def f(x):
        trace.append(type(x))
        return x + 1

    g = nbjit.jit(f)
    with jax.disable_jit():
        assert g(np.float32(1)) == 2
        assert g(np.float32(1)) == 2
    assert trace == [np.float32, np.float32] and g._cache_size() == 0


def test_debug_print_and_callback(capfd):
    seen = []

    def f(x):
        jax.debug.print("value {}", x)
        jax.debug.callback(lambda v: seen.append(float(v)), x)
        return x * 2

    f_nb, f_jax = both(f)
    for fn in (f_nb, f_nb, f_jax):
        assert_same_outputs(fn(jnp.float32(3)), jnp.float32(6))
    jax.effects_barrier()
    assert seen == [3.0, 3.0, 3.0]
    assert capfd.readouterr().out.count("value 3.0") == 3


# ---------------------------------------------------------------------------
# Compile counts and the cache


def test_one_trace_per_signature_none_on_hits():
    traces = []

    def f(x, y):
        traces.append(1)
        return x + y

    g = nbjit.jit(f)
    a, b = jnp.ones(3), jnp.ones((2, 3))
    for _ in range(5):
        g(a, a), g(b, b), g(a, b), g(np.ones(3, np.float32), 1.0)
    assert len(traces) == 4 and g.miss_count == 4 and g._cache_size() == 4


def test_lru_eviction_at_capacity():
    cache = nbjit.PjitFunctionCache(2)
    f = PjitFunction(add_one, {}, cache=cache)
    a, b, c = jnp.ones(1), jnp.ones(2), jnp.ones(3)
    f(a), f(b), f(a)  # a is now most recent
    f(c)  # evicts b
    assert cache.size() == 2 and f.miss_count == 3
    f(a)
    assert f.miss_count == 3  # still cached
    f(b)
    assert f.miss_count == 4  # was evicted
    assert cache.capacity() == 2


def test_capacity_is_shared_between_functions():
    cache = nbjit.PjitFunctionCache(3)
    f = PjitFunction(add_one, {}, cache=cache)
    g = PjitFunction(mul, {}, cache=cache)
    for n in range(1, 4):
        f(jnp.ones(n))
    g(jnp.ones(1), jnp.ones(1))
    assert cache.size() == 3 and f._cache_size() == 2 and g._cache_size() == 1


def test_twin_jits_share_entries_like_upstream():
    fun = fresh_copy(add_one)
    f1, f2 = nbjit.jit(fun), nbjit.jit(fun)
    j1, j2 = jax.jit(fun), jax.jit(fun)
    x = jnp.ones(7)
    f1(x), j1(x)
    f2(x), j2(x)
    assert f2.miss_count == 0
    assert f1._cache_size() == f2._cache_size() == j2._cache_size()


def test_entries_and_executables_freed_with_the_function():
    cache = nbjit.PjitFunctionCache(64)

    def make():
        def fresh(x):
            return x * 3 + 1
        return fresh

    fun = make()
    f = PjitFunction(fun, {}, cache=cache)
    f(jnp.ones(11)), f(jnp.ones(12))
    assert cache.size() == 2
    executable = next(iter(f._namespace.entries.values())).record.executable
    exe_ref = weakref.ref(executable) if hasattr(type(executable), "__weakref__") else None
    del executable
    del f, fun
    gc.collect()
    assert cache.size() == 0
    if exe_ref is not None:
        assert exe_ref() is None


def test_clearing():
    f = nbjit.jit(fresh_copy(add_one))
    f(jnp.ones(2)), f(jnp.ones(3))
    assert f._cache_size() == 2
    f._clear_cache()
    assert f._cache_size() == 0
    f(jnp.ones(2))
    f.clear_cache()
    assert f._cache_size() == 0
    f(jnp.ones(2))
    nbjit.PjitFunctionCache.clear_all()
    assert f._cache_size() == 0
    assert_same_outputs(f(jnp.ones(2)), jax.jit(add_one)(jnp.ones(2)))


# ---------------------------------------------------------------------------
# Bad input: upstream's exception type, the argument named, the cache intact


def _assert_cache_intact(f_nb, good_args):
    size, misses = f_nb._cache_size(), f_nb.miss_count
    f_nb(*good_args)
    assert f_nb.miss_count == misses, "the next valid call was not a hit"
    assert f_nb._cache_size() == size


@pytest.mark.parametrize("bad, needle", [
    (("a string",), "str"),
    ((object(),), "object"),
], ids=["string", "object"])
def test_bad_leaf(bad, needle):
    f_nb, f_jax = both(add_one)
    good = (jnp.ones(2),)
    f_nb(*good), f_jax(*good)
    e_nb, e_jax = assert_same_exception(f_nb, f_jax, *bad)
    assert needle in str(e_nb) and str(e_nb) == str(e_jax)
    _assert_cache_intact(f_nb, good)


def test_unhashable_static_argument():
    f_nb, f_jax = both(power, static_argnums=1)
    x = jnp.ones(2)
    f_nb(x, 2)
    e_nb, e_jax = assert_same_exception(f_nb, f_jax, x, [1, 2])
    assert "hash" in str(e_nb).lower() and str(e_nb) == str(e_jax)
    _assert_cache_intact(f_nb, (x, 2))


def test_wrong_number_of_arguments():
    f_nb, f_jax = both(mul)
    x = jnp.ones(2)
    f_nb(x, x), f_jax(x, x)
    e_nb, e_jax = assert_same_exception(f_nb, f_jax, x)
    assert "y" in str(e_nb)
    assert f_nb._cache_size() == f_jax._cache_size()
    _assert_cache_intact(f_nb, (x, x))


def test_unknown_keyword():
    f_nb, f_jax = both(mul)
    x = jnp.ones(2)
    f_nb(x, x), f_jax(x, x)
    e_nb, _ = assert_same_exception(f_nb, f_jax, x, x, z=x)
    assert "z" in str(e_nb)
    _assert_cache_intact(f_nb, (x, x))


class _Unweakrefable:
    """A callable without __weakref__ (JAX's trace caches need weak references)."""

    __slots__ = ()

    def __call__(self, x):
        return x + 2


def test_functions_that_cannot_be_weakly_referenced_fail_like_upstream():
    cache = nbjit.PjitFunctionCache(8)
    f = PjitFunction(_Unweakrefable(), {}, cache=cache)
    assert_same_exception(f, jax.jit(_Unweakrefable()), jnp.ones(2))
    cache.clear()
    assert f._cache_size() == 0 and cache.size() == 0


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
    assert len(steps["_Copy"]) == 1 and len(steps["HostInput"]) == 2 and not steps["_ShardArgs"]


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
    assert f_nb.miss_count == 5 and f_nb.stats().slow_reasons == {"compile_failed": 1}


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
