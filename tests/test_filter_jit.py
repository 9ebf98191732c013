"""nbjit.filter_jit against equinox.filter_jit: same outputs, traces, errors.

Differential throughout: each case runs under both wrappers and compares
outputs (tests/_diff.py), trace counts (Python side effects at trace time),
exception types and cache sizes. equinox is optional: without it the module
is skipped with its reason.
"""

from __future__ import annotations

import gc
import threading
import warnings

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

eqx = pytest.importorskip("equinox", reason="nbjit.filter_jit needs equinox (nbjit[equinox])")

from _diff import assert_same_outputs, counted  # noqa: E402

import nbjit  # noqa: E402
from nbjit.filter import jit as filter_impl  # noqa: E402

BOTH = pytest.mark.parametrize("wrap", [nbjit.filter_jit, eqx.filter_jit],
                               ids=["nbjit", "equinox"])


def _mlp(depth=2, key=0, activation=jax.nn.relu):
    return eqx.nn.MLP(3, 2, 8, depth, activation=activation, key=jax.random.PRNGKey(key))


def _sgd_step(model, x, y):
    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates = jtu.tree_map(lambda g: -0.1 * g, grads)
    return eqx.apply_updates(model, updates), value, "step done"


def test_hundred_fresh_batch_steps_bit_for_bit_and_same_traces():
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(8, 3)).astype(np.float32),
                rng.normal(size=(8, 2)).astype(np.float32)) for _ in range(100)]
    runs = {}
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        fn, traces = counted(_sgd_step)
        step = wrap(fn)
        model, outs = _mlp(), []
        for x, y in batches:
            model, value, text = step(model, x, y)
            outs.append((value, text))
        runs[wrap] = (model, outs, len(traces))
    (m_nb, o_nb, t_nb), (m_eq, o_eq, t_eq) = runs[nbjit.filter_jit], runs[eqx.filter_jit]
    assert t_nb == t_eq == 1
    assert_same_outputs(eqx.filter(m_nb, eqx.is_array), eqx.filter(m_eq, eqx.is_array))
    assert m_nb.activation is m_eq.activation is jax.nn.relu
    for (v_nb, s_nb), (v_eq, s_eq) in zip(o_nb, o_eq, strict=True):
        assert_same_outputs(v_nb, v_eq)
        assert s_nb is s_eq


@BOTH
def test_python_scalars_share_a_trace_and_outputs_are_trace_time_objects(wrap):
    fn, traces = counted(lambda x: x)
    f = wrap(fn)
    assert f(True) is True
    assert f(1) is True  # 1 == True: the trace of True answers, with its object
    assert f(1.0) is True
    assert len(traces) == 1
    assert f(2) == 2 and len(traces) == 2


def test_static_outputs_identical_to_equinox():
    marker = object()
    outs = [wrap(lambda x, m: (x * 2, m, None, [m]))(jnp.ones(2), marker)
            for wrap in (nbjit.filter_jit, eqx.filter_jit)]
    assert outs[0][1] is outs[1][1] is marker
    assert outs[0][3][0] is marker and outs[0][2] is None
    assert jtu.tree_structure(outs[0]) == jtu.tree_structure(outs[1])
    assert_same_outputs(outs[0][0], outs[1][0])


@BOTH
def test_numpy_outputs_come_back_as_jax_arrays(wrap):
    out = wrap(lambda: (np.ones(3, np.float32), np.float32(2.0), 3))()
    assert isinstance(out[0], jax.Array) and isinstance(out[1], jax.Array)
    assert out[2] == 3 and type(out[2]) is int


@pytest.mark.parametrize("kind", ["module", "bound_method", "partial"])
def test_function_arrays_are_traced(kind):
    class Scale(eqx.Module):
        w: jax.Array

        def apply(self, x):
            return self.w * x

        def __call__(self, x):
            return self.w * x

    results = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        traces = []

        def scaled(w, x, traces=traces):
            traces.append(1)
            return w * x

        outs = []
        for value in (1.0, 2.0, 3.0):
            w = jnp.full(2, value)
            fn = {"module": Scale(w), "bound_method": Scale(w).apply,
                  "partial": jtu.Partial(scaled, w)}[kind]
            outs.append(wrap(fn)(jnp.ones(2)))
        results.append((outs, len(traces)))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        assert_same_outputs(a, b)
    assert results[0][1] == results[1][1]


def test_static_fields_and_module_changes_retrace_as_equinox():
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        fn, traces = counted(lambda m, x: m(x))
        f = wrap(fn)
        x = jnp.ones(3)
        f(_mlp(), x)
        f(_mlp(key=1), x)  # new weights: same trace
        f(_mlp(activation=jax.nn.gelu), x)  # another activation: a new trace
        f(_mlp(depth=3), x)
        assert len(traces) == 3, wrap


def test_clone_shares_the_trace_count():
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        fn, traces = counted(lambda x: x + 1)
        f = wrap(fn)
        clone = jtu.tree_unflatten(*reversed(jtu.tree_flatten(f)))
        f(jnp.ones(2))
        clone(jnp.ones(2))
        assert len(traces) == 1, wrap
        assert isinstance(f, eqx.Module)


def test_donation_modes_match_equinox():
    for donate in ("all", "all-except-first", "none"):
        deleted = []
        for wrap in (nbjit.filter_jit, eqx.filter_jit):
            a, b = jnp.ones(4), jnp.ones(4)
            out = wrap(lambda x, y: (x + 1, y * 2), donate=donate)(a, b)
            jax.block_until_ready(out)
            deleted.append((a.is_deleted(), b.is_deleted()))
        assert deleted[0] == deleted[1], donate


def test_donation_warnings_as_equinox():
    for donate, expect in (("all", False), ("warn", True)):
        seen = []
        for wrap in (nbjit.filter_jit, eqx.filter_jit):
            def unusable(x):  # no output the shape of x: its buffer is not usable
                return x.sum()

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                wrap(unusable, donate=donate)(jnp.ones(4, jnp.int32))
            seen.append(any("donated buffers" in str(w.message) for w in caught))
        assert seen == [expect, expect], donate


def test_lower_compile_and_get():
    f = nbjit.filter_jit(lambda x, y: 2 * x + y)
    compiled = f.lower(jnp.array(3), 4).compile()
    assert "add" in f.lower(jnp.array(3), 4).as_text()
    assert int(compiled(jnp.array(3), 4)) == 10

    class Counter(eqx.Module):
        k: jax.Array

        @nbjit.filter_jit
        def times(self, x):
            return self.k * x

    assert float(Counter(jnp.array(2.0)).times(3.0)) == 6.0


def test_under_an_outer_trace_it_stages():
    f = nbjit.filter_jit(lambda x: jnp.sin(x) * 2)
    g = eqx.filter_jit(lambda x: jnp.sin(x) * 2)
    x = jnp.linspace(0, 1, 4)
    assert_same_outputs(jax.jit(f)(x), jax.jit(g)(x))
    assert_same_outputs(jax.grad(lambda v: f(v).sum())(x), jax.grad(lambda v: g(v).sum())(x))
    assert_same_outputs(jax.vmap(f)(x), jax.vmap(g)(x))


def test_config_context_is_in_the_key():
    f = nbjit.filter_jit(lambda x: x * 2)
    g = eqx.filter_jit(lambda x: x * 2)
    with jax.enable_x64(True):
        assert_same_outputs(f(np.ones(2)), g(np.ones(2)))
    assert_same_outputs(f(np.ones(2)), g(np.ones(2)))
    with jax.disable_jit():
        assert_same_outputs(f(np.ones(2)), g(np.ones(2)))


def test_error_if_raises_equinox_runtime_error_at_the_call_site(caplog):
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        f = wrap(lambda x: eqx.error_if(x, x > 1, "too big"))
        assert float(f(jnp.array(0.5))) == 0.5
        with pytest.raises(eqx.EquinoxRuntimeError, match="too big") as info:
            f(jnp.array(2.0))
        assert info.value.__cause__ is None
        with pytest.raises(eqx.EquinoxRuntimeError):  # on the hit path too
            f(jnp.array(3.0))
    assert "jax.pure_callback failed" not in caplog.text


def test_error_if_with_static_outputs_waits_and_raises():
    """Both output forms carry the marker: all-array outputs (JAX's unflatten
    rebuilds them) and outputs with static leaves (rebuilt from a recipe)."""
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        f = wrap(lambda x: (eqx.error_if(x, x > 1, "too big"), "label", 3))
        out = f(jnp.array(0.5))
        assert out[1:] == ("label", 3) and float(out[0]) == 0.5
        assert out[0].is_ready()
        for bad in (2.0, 3.0):  # the miss, then the hit
            with pytest.raises(eqx.EquinoxRuntimeError, match="too big"):
                f(jnp.array(bad))
    compiled = nbjit.filter_jit(lambda x, n: (x * n, n, "s")).lower(jnp.ones(2), 3).compile()
    out = compiled(jnp.ones(2), 3)
    assert out[1:] == (3, "s") and out[0].tolist() == [3.0, 3.0]


def test_other_errors_unchanged():
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        with pytest.raises(TypeError):
            wrap(lambda x, y: x + y)(jnp.ones(2))  # a missing argument: signature.bind
        with pytest.raises(TypeError):
            wrap(lambda x: x + "a")(jnp.ones(2))


def _spin(x):
    """A computation that takes a while and holds no host callback."""
    return jax.lax.fori_loop(0, 3000, lambda i, v: jnp.sin(v) @ jnp.cos(v), x)


def test_deliberate_difference_no_wait_without_an_error_check():
    """equinox waits for every call's outputs; nbjit.filter_jit keeps JAX's async
    dispatch unless the computation holds a host callback (eqx.error_if)."""
    x = jnp.ones((64, 64)) / 64
    nb, eq = nbjit.filter_jit(_spin), eqx.filter_jit(_spin)
    jax.block_until_ready((nb(x), eq(x)))
    assert eq(x).is_ready()  # equinox blocked
    out = nb(x)
    ready_at_return = out.is_ready()
    jax.block_until_ready(out)
    assert not ready_at_return
    checked = nbjit.filter_jit(lambda v: eqx.error_if(_spin(v), jnp.isnan(v).any(), "nan"))
    checked(x)
    assert checked(x).is_ready()  # an error check: waits, as equinox


def _relu(x):
    return jnp.maximum(x, 0)


def _gelu(x):
    return x * jax.nn.sigmoid(1.702 * x)


def test_explained_miss_names_the_module_field(caplog):
    caplog.set_level("WARNING", logger="nbjit")
    f = nbjit.filter_jit(lambda m, x: m(x))
    x = jnp.ones(3)
    with nbjit.explain_misses():
        f(_mlp(activation=_relu), x)
        f(_mlp(activation=_gelu), x)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "nbjit")
    assert "m.activation: static argument value <function _relu" in text, text
    assert "-> <function _gelu" in text, text
    assert "test_filter_jit.py" in text.split(" at ")[0], text  # named as the wrapped function


def test_a_static_callable_of_another_type_is_named_by_its_function(caplog):
    """jax.nn.relu is a custom_jvp object, jax.nn.gelu is not: the miss names
    both functions, then their types."""
    caplog.set_level("WARNING", logger="nbjit")
    f = nbjit.filter_jit(lambda model, x: model(x))
    x = jnp.ones(3)
    with nbjit.explain_misses():
        f(_mlp(activation=jax.nn.relu), x)
        f(_mlp(activation=jax.nn.gelu), x)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "nbjit")
    assert ("model.activation: static argument <function relu> -> <function gelu> "
            "(type custom_jvp -> ") in text, text


def test_explained_miss_of_a_new_equal_looking_object(caplog):
    """equinox issue 686: a field holding a fresh jax.jit object each time."""
    caplog.set_level("WARNING", logger="nbjit")

    class Holder(eqx.Module):
        fn: object

    f = nbjit.filter_jit(lambda h, x: h.fn(x))
    with nbjit.explain_misses():
        for _ in range(2):
            f(Holder(jax.jit(jnp.sin)), jnp.ones(2))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "nbjit")
    assert "h.fn: static argument value a new object, not equal" in text, text


def test_stats_and_assert_max_misses():
    f = nbjit.filter_jit(lambda x, n: x * n)
    x = jnp.ones(2)
    f(x, 2)
    with nbjit.assert_max_misses(0):
        for _ in range(3):
            f(x, 2)
    with pytest.raises(AssertionError):
        with nbjit.assert_max_misses(0):
            f(x, 3)
    stats = f._cached.pjit.stats()
    assert stats.misses == 2 and stats.hits >= 3


class _Unhashable:
    __hash__ = None

    def __eq__(self, other):
        return True


class _RaisingEq:
    def __hash__(self):
        return 0

    def __eq__(self, other):
        raise RuntimeError("no eq")


class _RaisingHash:
    def __hash__(self):
        raise RuntimeError("no hash")


@pytest.mark.parametrize("bad", [_Unhashable(), _RaisingHash()], ids=["unhashable", "hash"])
def test_bad_static_leaves_raise_as_equinox_and_leave_the_cache(bad):
    errors = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        f = wrap(lambda x, s: x + 1)
        f(jnp.ones(2), 1)
        with pytest.raises(Exception) as info:
            f(jnp.ones(2), bad)
        errors.append(type(info.value))
        assert float(f(jnp.ones(2), 1)[0]) == 2.0
        if wrap is nbjit.filter_jit:
            assert f._cached.pjit._cache_size() == 1
    assert errors[0] is errors[1]


def test_raising_eq_static_leaf(isolated_jax_caches):
    outs = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        isolated_jax_caches()  # jax 0.10: the other side's leaf is not compared with
        f = wrap(lambda x, s: x + 1)
        first = _RaisingEq()
        f(jnp.ones(2), first)
        f(jnp.ones(2), first)  # identity first: no __eq__ needed
        try:
            outs.append(type(f(jnp.ones(2), _RaisingEq())))  # the hash collides: __eq__ runs
        except Exception as error:
            outs.append(type(error))
    assert outs[0] is outs[1]


def test_module_mutated_behind_equinox_back_never_stale():
    class Box(eqx.Module):
        n: int

    outs = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        f = wrap(lambda b, x: x * b.n)
        box = Box(2)
        first = f(box, jnp.ones(2))
        object.__setattr__(box, "n", 5)
        outs.append((first, f(box, jnp.ones(2))))
    assert_same_outputs(outs[0], outs[1])
    assert float(outs[0][1][0]) == 5.0


def test_threads_compile_once():
    fn, traces = counted(lambda x, n: jnp.sin(x) * n)
    f = nbjit.filter_jit(fn)
    barrier = threading.Barrier(8)
    results = []

    def call():
        barrier.wait()
        results.append(f(jnp.ones(3), 2))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8 and len(traces) == 1
    assert f._cached.pjit.stats().misses == 1


def test_dropped_functions_and_modules_leave_nothing():
    from nbjit.core import dispatch as nb_dispatch

    def namespaces():
        gc.collect()
        cache = nb_dispatch._default_cache
        with cache._lock:
            return len(cache._namespaces)

    before, plans = namespaces(), len(filter_impl._plans_by_function)
    for i in range(200):
        f = nbjit.filter_jit(lambda x, i=i: x + i)
        f(jnp.ones(2))
        del f
    for i in range(10_000):  # made and dropped without a call
        nbjit.filter_jit(lambda x, i=i: x - i)
    gc.collect()
    assert len(filter_impl._plans_by_function) == plans
    assert namespaces() == before


def test_clear_caches_makes_new_wrappers_trace_again():
    def fn(x):
        traces.append(1)
        return x + 1

    traces = []
    nbjit.filter_jit(fn)(jnp.ones(2))
    eqx.clear_caches()
    jax.clear_caches()
    nbjit.filter_jit(fn)(jnp.ones(2))
    assert len(traces) == 2


def test_wrapper_attributes():
    def f(x: int) -> str:
        """some doc"""
        return "hi"

    w = nbjit.filter_jit(f)
    assert w.__name__ == "f" and w.__doc__ == "some doc" and w.__wrapped__ is f
    assert f(1) == w(1) == "hi"
    assert "f" in repr(w)


@pytest.mark.parametrize("returns", ["arrays", "module_and_statics"])
def test_repeated_calls_are_nbjit_hits(returns):
    """A hit takes nbjit's fast path, also when the output holds non-array leaves
    (JAX gives fast-path data only when its outputs re-flatten to arrays)."""
    if returns == "arrays":
        f = nbjit.filter_jit(lambda m, x: m(x))
    else:
        f = nbjit.filter_jit(lambda m, x: (m, m(x), "text", 3))
    m, x = _mlp(), jnp.ones(3)
    f(m, x)
    for _ in range(5):
        out = f(m, x)
    stats = f._cached.pjit.stats()
    assert stats.hits == 5 and stats.misses == 1 and stats.slow == 0
    if returns != "arrays":
        assert out[0].activation is m.activation and out[2:] == ("text", 3)


def test_donation_modes_trace_as_equinox():
    counts = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        fn, traces = counted(lambda x: x * 2)
        wrap(fn)(jnp.ones(2))
        wrap(fn, donate="all")(jnp.ones(2))
        wrap(fn, donate="all-except-first")(jnp.ones(2))
        counts.append(len(traces))
    assert counts[0] == counts[1]


def test_deliberate_difference_donation_warning_once_per_mode():
    """equinox's donation modes of one function share one jax.jit, so a compile
    for `donate="all"` serves `donate="warn"` without warning again; nbjit
    compiles per mode (donation is a jit option), so "warn" warns."""
    seen = []
    for wrap in (nbjit.filter_jit, eqx.filter_jit):
        def unusable(x):
            return x.sum()

        wrap(unusable, donate="all")(jnp.ones(4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrap(unusable, donate="warn")(jnp.ones(4))
        seen.append(any("donated buffers" in str(w.message) for w in caught))
    assert seen == [True, False]


def test_profile_and_ranked_misses_cover_filter_jit():
    def field_step(m, x):
        return m(x)

    f = nbjit.filter_jit(field_step)
    x = jnp.ones(3)
    with nbjit.profile() as profile:
        for act in (_relu, _gelu, _gelu, _gelu):
            f(_mlp(activation=act), x)
    names = [name for name in profile.by_name() if "field_step" in name]
    assert names, profile.by_name().keys()
    phases, _ = profile.by_name()[names[0]]
    assert len(phases) >= 2  # the hits were timed phase by phase
    rows = [r for r in nbjit.ranked_misses() if "field_step" in r.function]
    assert any("m.activation: static argument value" in r.fields for r in rows), rows


def test_dropped_modules_leave_one_entry():
    """Modules used as the function (or passed in) share their class's jitted
    function; their arrays are not held by the cache, equal static parts hit."""
    import weakref

    refs = []
    for i in range(300):
        model = _mlp(key=i)
        out = nbjit.filter_jit(model)(jnp.ones(3))
        refs.append(weakref.ref(model))
        wrapper = nbjit.filter_jit(model)
        del model, out
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert wrapper._cached.pjit._cache_size() == 1
    assert wrapper.stats().misses == 1


def test_an_equinox_outside_the_supported_range_is_refused(monkeypatch):
    """nbjit/filter/_equinox.py (every private equinox name nbjit reads) refuses
    an equinox outside pyproject.toml's bound, naming the supported range."""
    import importlib

    from nbjit.filter import _equinox

    try:
        for version in ("0.14.0", "0.13.7"):
            monkeypatch.setattr(eqx, "__version__", version)
            with pytest.raises(ImportError, match=r"supports equinox >= 0\.13\.8, < 0\.14"):
                importlib.reload(_equinox)
    finally:
        monkeypatch.undo()
        importlib.reload(_equinox)
    assert _equinox.EQUINOX_VERSION >= (0, 13, 8)
    assert nbjit.filter_jit(lambda x: x + 1)(jnp.ones(2)).tolist() == [2.0, 2.0]
