"""Dispatch statistics: counters equal to known call sequences (nbjit/_stats.py)."""

import gc
import html
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.core.dispatch import PjitFunction
from nbjit.observe import stats as _stats
from nbjit.observe.names import function_name


def add_one(x):
    return x + 1


def _fresh(fun=None, **options):
    """A jit object over a new Python function (so no twin shares its counters)."""
    def f(x):
        return x + 1

    return nbjit.jit(fun or f, **options)


def _counts(s):
    return (s.calls, s.hits, s.misses, s.slow)


def test_hits_and_misses_of_a_known_sequence():
    f = _fresh()
    a, b = jnp.ones(3), jnp.ones(4)
    f(a), f(a), f(b), f(a), f(b), f(np.ones(3, np.float32)), f(np.ones(3, np.float32))
    s = f.stats()
    assert isinstance(s, nbjit.DispatchStats)
    assert _counts(s) == (7, 4, 3, 0)
    assert s.entries == 3 and s.evictions == 0 and s.slow_reasons == {}
    assert s.miss_seconds > 0
    with pytest.raises(AttributeError):
        s.hits = 0  # frozen


def test_pytree_keyword_and_static_calls_count_hits():
    def g(x, n, *, y):
        return x * n + y["w"]

    f = nbjit.jit(g, static_argnums=1)
    a = jnp.ones(3)
    for _ in range(3):
        f(a, 2, y={"w": a})
    f(a, 3, y={"w": a})
    assert _counts(f.stats()) == (4, 2, 2, 0)


def test_reset_stats_keeps_entries():
    f = _fresh()
    a = jnp.ones(3)
    f(a), f(a)
    f.reset_stats()
    assert _counts(f.stats()) == (0, 0, 0, 0) and f.stats().entries == 1
    f(a)
    assert _counts(f.stats()) == (1, 1, 0, 0)
    f._clear_cache()  # the entries go; their hits stay counted
    assert _counts(f.stats()) == (1, 1, 0, 0) and f.stats().entries == 0
    nbjit.PjitFunctionCache.clear_all()
    f(a), f(a)
    assert _counts(f.stats()) == (3, 2, 1, 0)


def test_twins_share_counters():
    def g(x):
        return x * 2

    f1, f2 = nbjit.jit(g), nbjit.jit(g)
    other = nbjit.jit(g, donate_argnums=())  # equal options: still a twin
    a = jnp.ones(3)
    f1(a), f2(a), f1(a)
    assert f1.stats() == f2.stats()
    assert _counts(f1.stats()) == (3, 2, 1, 0)
    assert other.stats().calls in (0, 3)  # a twin or not, as jaxlib keys its options
    row = nbjit.stats()[function_name(g)]
    assert row.calls == 3 and row.name == f1.stats().name == function_name(g)


def test_evictions_at_capacity():
    cache = nbjit.PjitFunctionCache(2)
    f = PjitFunction(add_one, {}, cache=cache)
    a, b, c = jnp.ones(1), jnp.ones(2), jnp.ones(3)
    f(a), f(b), f(a), f(c)  # c evicts b
    s = f.stats()
    assert (s.misses, s.evictions, s.entries) == (3, 1, 2)
    f(b)  # compiled again; evicts a
    s = f.stats()
    assert (s.calls, s.hits, s.misses, s.evictions, s.entries) == (5, 1, 4, 2, 2)


def test_hits_counted_exactly_from_threads():
    """Hits are exact under the GIL (no thread switch inside ``node.hits += 1``);
    the other counters are statistics that a race may short by one
    (nbjit.core.cache.Counters): this test counts hits only."""
    f = _fresh()
    a = jnp.ones(3)
    f(a)
    n_threads, n_calls = 4, 300
    barrier = threading.Barrier(n_threads)

    def work():
        barrier.wait()
        for _ in range(n_calls):
            f(a)

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _counts(f.stats()) == (1 + n_threads * n_calls, n_threads * n_calls, 1, 0)


# -- every slow reason ---------------------------------------------------------


def _slow_reasons(f):
    return f.stats().slow_reasons


def test_calls_under_transformations_are_traced_not_slow():
    """grad, vmap, hessian, scan and an outer jit stage the call into their trace,
    as they do jax.jit's: counted as traced, never as slow."""
    f = _fresh()
    x = jnp.ones(3)
    jax.jit(lambda x: f(x))(x)
    jax.grad(lambda x: f(x).sum())(x)
    jax.vmap(f)(jnp.ones((2, 3)))
    jax.hessian(lambda x: f(x).sum())(x)
    jax.lax.scan(lambda c, x: (c, f(x)), 0.0, jnp.ones((4, 3)))
    f(x)  # and a call of its own: a miss
    s = f.stats()
    assert (s.calls, s.hits, s.misses, s.traced, s.slow) == (6, 0, 1, 5, 0)
    assert s.slow_reasons == {} and "tracer" not in _stats.SLOW_REASONS
    text = str(s)
    assert "traced" in text.splitlines()[0] and "traced = calls under a JAX transformation" in text
    plain = str(nbjit.jit(lambda y: y).stats()).splitlines()[0]
    assert "traced" not in plain.split()  # a column only when counted


def test_traced_calls_are_not_slow_for_assert_max_misses():
    f = _fresh()
    f(jnp.ones(3))
    with nbjit.assert_max_misses(0, slow=0):
        jax.grad(lambda x: f(x).sum())(jnp.ones(3))
        jax.vmap(f)(jnp.ones((2, 3)))
    assert f.stats().traced == 2


def test_trace_errors_in_the_function_are_raised_calls_not_compile_failures():
    """A TracerBoolConversionError in the function is its own error, as under
    jax.jit: counted as raised; the signature's next call traces again."""
    def branchy(x):
        if x.sum() > 0:  # a Python branch on a traced value
            return x
        return -x

    f, g = nbjit.jit(branchy), jax.jit(branchy)
    for _ in range(2):
        with pytest.raises(jax.errors.TracerBoolConversionError):
            g(jnp.ones(3))
        with pytest.raises(jax.errors.TracerBoolConversionError):
            f(jnp.ones(3))
    s = f.stats()
    assert (s.calls, s.raised, s.misses, s.slow, s.slow_reasons) == (2, 2, 0, 0, {})
    assert "raised = calls that raised" in str(s)


def test_slow_reason_effects():
    def g(x):
        jax.debug.print("x={x}", x=x)
        return x + 1

    f = nbjit.jit(g)
    f(jnp.ones(3)), f(jnp.ones(3))
    s = f.stats()
    assert s.misses == 1 and s.slow_reasons == {"effects": 1}


def test_slow_reason_no_fastpath():
    f = _fresh()
    jax_miss = f._jax_cache_miss  # JAX gives no fast-path data (as with a mutable-ref
    # effect or PGLE): the signature takes JAX's path for good
    f._jax_cache_miss = lambda *a, **k: (jax_miss(*a, **k)[0], None, False)
    f(jnp.ones(3)), f(jnp.ones(3))
    s = f.stats()
    assert s.misses == 1 and s.slow_reasons == {"no_fastpath": 1}


@pytest.mark.parametrize("option", ["debug_nans", "debug_infs"])
def test_slow_reason_debug_nans_infs(option):
    f = _fresh()
    a = jnp.ones(3)
    f(a)
    with getattr(jax, option)(True):
        f(a)
    f(a)
    assert _counts(f.stats()) == (3, 1, 1, 1) and _slow_reasons(f) == {option: 1}


def test_slow_reason_unknown_leaf_type():
    f = _fresh(lambda x, s: x)
    f(jnp.ones(3), jnp.ones(3))
    with pytest.raises(TypeError):
        f(jnp.ones(3), "a string")
    assert _slow_reasons(f) == {"unknown_leaf_type": 1}


def test_slow_reason_deleted_or_donated():
    f = _fresh()
    a = jnp.ones(3)
    f(a)
    a.delete()
    with pytest.raises(RuntimeError):
        f(a)
    b = jnp.ones(4)
    b.delete()
    with pytest.raises(RuntimeError):
        f(b)  # a miss with a deleted leaf: JAX's path, nothing cached
    assert _slow_reasons(f) == {"deleted_or_donated": 2}


def test_slow_reason_disable_jit():
    f = _fresh()
    with jax.disable_jit():
        f(jnp.ones(3))
    assert _counts(f.stats()) == (1, 0, 0, 1) and _slow_reasons(f) == {"disable_jit": 1}


class _EqRaises:
    def __hash__(self):
        return 7

    def __eq__(self, other):
        raise RuntimeError("no == for you")


def test_slow_reason_static_arg_error():
    f = nbjit.jit(lambda x, s: x, static_argnums=1)
    f(jnp.ones(3), _EqRaises())
    with pytest.raises((RuntimeError, ValueError), match="no == for you"):
        f(jnp.ones(3), _EqRaises())  # JAX's path raises (it wraps the error)
    assert _slow_reasons(f) == {"static_arg_error": 1}


def test_slow_reason_inputs_refused():
    f = _fresh()
    x = np.ones(3, np.float32)
    f(x)
    with jax.transfer_guard_host_to_device("disallow"):
        with pytest.raises(Exception, match="[Dd]isallowed"):
            f(np.zeros(3, np.float32))
    assert _slow_reasons(f) == {"input_refused": 1}


def test_an_error_in_the_function_is_raised_each_call():
    def g(x):
        raise ValueError("boom")

    f = nbjit.jit(g)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            f(jnp.ones(3))
    s = f.stats()
    assert (s.misses, s.raised, s.slow) == (0, 2, 0)  # each call traces anew


def test_slow_reason_compile_failed():
    """An interrupted compile (Ctrl-C) is the one failure counted as slow."""
    calls = []

    def g(x):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return x + 1

    f = nbjit.jit(g)
    with pytest.raises(KeyboardInterrupt):
        f(jnp.ones(3))
    s = f.stats()
    assert (s.misses, s.raised, s.slow_reasons) == (0, 0, {"compile_failed": 1})


def test_slow_reason_layout():
    """JAX's fast-path data with a non-default input layout keeps the node slow."""
    from nbjit.core import record as _record

    class FastPath:
        in_device_local_layouts = [object()]

    with pytest.raises(_record.Unsupported, match="layout"):
        _record.build_record(FastPath(), [jnp.ones(3)], False)
    assert set(_stats.SLOW_REASONS) >= {
        "effects", "debug_nans", "debug_infs", "unknown_leaf_type",
        "deleted_or_donated", "layout", "no_fastpath", "disable_jit", "static_arg_error",
        "execute_refused", "input_refused", "compile_failed"}


# -- nbjit.stats() ---------------------------------------------------------------


def test_stats_table_lists_live_functions_and_forgets_dead_ones():
    def churn_me(x):
        return x - 1

    f = nbjit.jit(churn_me)
    f(jnp.ones(2)), f(jnp.ones(2))
    name = function_name(churn_me)
    assert name.startswith("test_stats.test_stats_table_lists_live_functions_and_forgets_"
                           "dead_ones.<locals>.churn_me (test_stats.py:")
    table = nbjit.stats()
    assert table[name].hits == 1 and table[name].name == name
    text, page = str(table), table._repr_html_()
    assert name in text and "hits" in text.splitlines()[0]
    assert "<table>" in page and html.escape(name) in page
    assert str(f.stats()).splitlines()[1].startswith(name)
    del f
    gc.collect()
    assert name not in nbjit.stats()


def test_same_qualified_name_twice_gets_two_rows():
    fs = []
    for k in range(2):
        def same(x, k=k):
            return x + k

        fs.append(nbjit.jit(same))
    for f in fs:
        f(jnp.ones(2))
    names = [n for n in nbjit.stats() if ".<locals>.same (" in n]
    assert len(names) == 2 and names[0] + "#2" == names[1]
    assert [f.stats().name for f in fs] == names


def test_each_option_set_is_its_own_row():
    """Options that key executables (donation here) make another row; options
    that only shape the call key (static_argnums) share the function's row, as
    they share its cache namespace."""
    def g(x, n):
        return x * n

    plain, static = nbjit.jit(g), nbjit.jit(g, static_argnums=1)
    donating = nbjit.jit(g, donate_argnums=0)
    plain(jnp.ones(2), 2), static(jnp.ones(2), 2), static(jnp.ones(2), 3)
    donating(jnp.ones(2), jnp.ones(2))
    table = nbjit.stats()
    assert table[function_name(g)].misses == 3
    assert table[function_name(g) + " [donate_argnums=(0,)]"].misses == 1
    assert donating.stats().name == function_name(g) + " [donate_argnums=(0,)]"


def test_reprs_are_tables():
    f = nbjit.jit(lambda x: x + 1)
    f(jnp.ones(2))
    assert repr(f.stats()) == str(f.stats())
    assert repr(f.stats()).splitlines()[0].startswith("function")
    assert repr(nbjit.stats()) == str(nbjit.stats())
