"""nbjit.jit against jax.jit: the Python surface (wraps, signature, repr,
decorator and factory forms, options, pickling, AOT), transformations and
effects, compile counts and the cache, bad input (jax.jit's exception type
and message, the cache intact). The helpers are tests/_jit_pairs.py; the
rest of the dispatcher's differential cases are in test_jit.py.
"""

from __future__ import annotations

import functools
import gc
import pickle
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_exception, assert_same_outputs
from _jit_pairs import add_one, both, fresh_copy, mul, power

import nbjit
from nbjit.core.dispatch import PjitFunction

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
