"""Explained misses: one WARNING per miss naming the argument path and field."""

import concurrent.futures
import functools
import inspect
import logging
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import nbjit
from nbjit import _kernels
from nbjit.core.dispatch import PjitFunction
from nbjit.observe import descriptions as _descriptions
from nbjit.observe import distance as _distance
from nbjit.observe import explain as _explain


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.WARNING, logger="nbjit")

    def nbjit_records():
        return [r for r in caplog.records if r.name == "nbjit"]

    return nbjit_records


def _explained(records, call):
    """The one message the call's miss logged."""
    before = len(records())
    with nbjit.explain_misses():
        call()
    new = records()[before:]
    assert len(new) == 1, [r.getMessage() for r in new]
    assert new[0].levelno == logging.WARNING
    return new[0].getMessage()


def add(x, y):
    return x + y


def _fresh(fun=add, **options):
    return nbjit.jit(lambda *args, **kwargs: fun(*args, **kwargs), **options)


def test_no_message_for_a_first_miss_or_when_off(records):
    f = _fresh()
    a = jnp.ones(3)
    with nbjit.explain_misses():
        f(a, a)  # nothing cached yet: nothing to compare
    f(a, jnp.ones(1))  # explaining is off
    assert records() == []


def test_shape_names_the_path_and_call_site(records):
    f = nbjit.jit(lambda x, y: x + y["w"])
    a = jnp.ones(3)
    f(a, {"w": a})
    message = _explained(records, lambda: f(a, {"w": jnp.ones(1)}))
    assert "y['w']: shape float32[3] -> float32[1]" in message
    assert "<lambda>" in message and "test_explain.py:" in message
    assert "JAX traced and compiled" in message


@pytest.mark.parametrize("second, expected", [
    (lambda a: jnp.ones(3, jnp.int32), "args[1]: dtype float32[3] -> int32[3]"),
    (lambda a: jax.device_put(a, jax.devices()[0]), "args[1]: committed False -> True"),
    (lambda a: np.ones(3, np.float32), "args[1]: kind jax.Array -> numpy"),
], ids=["dtype", "committed", "host_value_kind"])
def test_second_argument_field(records, second, expected):
    f = _fresh()
    a = jnp.ones(3)
    f(a, a)
    message = _explained(records, lambda: f(a, second(a)))
    assert expected in message


def test_weak_type(records):
    f = _fresh()
    strong = jnp.array(1.0, jnp.float32)
    weak = jax.jit(lambda: 1.0)()
    assert weak.weak_type and not strong.weak_type
    f(strong, strong)
    message = _explained(records, lambda: f(strong, weak))
    assert "args[1]: weak type False -> True" in message


def test_sharding(records):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    f = nbjit.jit(lambda x: x + 1)
    on0 = jax.device_put(jnp.ones(3), jax.devices()[0])
    on1 = jax.device_put(jnp.ones(3), jax.devices()[1])
    f(on0)
    message = _explained(records, lambda: f(on1))
    assert "x: sharding SingleDeviceSharding(device=CpuDevice(id=0)" in message
    assert "committed" not in message


def test_static_value_and_type(records):
    f = nbjit.jit(lambda x, n, *, mode: x * n, static_argnums=1, static_argnames="mode")
    a = jnp.ones(3)
    f(a, 2, mode="a")
    message = _explained(records, lambda: f(a, 3, mode="a"))
    assert "n: static argument value 2 -> 3" in message
    message = _explained(records, lambda: f(a, 2.0, mode="a"))
    assert "n: static argument 2 -> 2.0 (type int -> float)" in message
    message = _explained(records, lambda: f(a, 2, mode="b"))
    assert "mode: static argument value 'a' -> 'b'" in message


def test_an_argument_is_named_by_its_parameter_as_jax_names_it(records):
    """JAX's explanation says ``lr`` for `def step(w, x, lr)`, passed by position
    or by keyword; nbjit's names it so too."""
    def step(w, x, lr):
        return (w * lr).sum() + x.sum()

    f = nbjit.jit(step)
    w = jnp.ones(3)
    f(w, w, 1)
    message = _explained(records, lambda: f(w, w, 0.5))
    assert "cached signatures: lr: kind int -> float" in message and "args[" not in message
    f(w, w, lr=1)
    message = _explained(records, lambda: f(w, w, lr=0.5))
    assert "cached signatures: lr: kind int -> float" in message and "kwargs[" not in message
    message = _explained(records, lambda: f(w, jnp.ones(4), 2))  # the closest: f(w, w, 1)
    assert "cached signatures: x: shape float32[3] -> float32[4]" in message


def test_varargs_and_var_keywords_are_named_by_their_parameters(records):
    """As JAX: an extra positional argument by the ``*`` parameter and its index
    there, an extra keyword by the ``**`` parameter."""
    f = nbjit.jit(lambda a, *rest, **kw: a)
    w = jnp.ones(3)
    f(w, 1, 2, k=1)
    message = _explained(records, lambda: f(w, 1, 2.0, k=1.0))
    assert "rest[1]: kind int -> float; kw['k']: kind int -> float" in message


def test_partials_methods_and_statics_are_named_by_their_parameters(records):
    def scale(w, x, *, factor):
        return x * factor

    part = nbjit.jit(functools.partial(scale, jnp.ones(3)), static_argnames="factor")
    x = jnp.ones(3)
    part(x, factor=2)
    message = _explained(records, lambda: part(jnp.ones(4), factor=2))
    assert "cached signatures: x: shape float32[3] -> float32[4]" in message
    message = _explained(records, lambda: part(x, factor=3))
    assert "cached signatures: factor: static argument value 2 -> 3" in message

    class Model:
        @functools.partial(nbjit.jit, static_argnums=0)
        def apply(self, params):
            return params["w"]

    model = Model()
    model.apply({"w": x})
    message = _explained(records, lambda: model.apply({"w": x, "b": x}))
    assert "cached signatures: params['b']: added" in message


def test_without_a_signature_arguments_are_named_by_position():
    descriptions = _descriptions.argument_paths(None, 2, ("k",))
    assert descriptions == (["args[0]", "args[1]"], ["kwargs['k']"])
    # past what the signature accepts (the call fails in JAX): by position too
    signature = inspect.signature(lambda a, *, b: a)
    assert _descriptions.argument_paths(signature, 2, ("b", "c")) == (
        ["a", "args[1]"], ["b", "kwargs['c']"])


def test_keyword_names(records):
    f = nbjit.jit(lambda x, y=None, z=None: x)
    a = jnp.ones(3)
    f(a, y=a)
    message = _explained(records, lambda: f(a, z=a))
    assert "keyword names ('y',) -> ('z',)" in message


def test_pytree_structure(records):
    f = nbjit.jit(lambda x, p: x)
    a = jnp.ones(3)
    f(a, {"w": a, "b": a})
    message = _explained(records, lambda: f(a, {"w": a}))
    # the node that changed, by its path (tests/test_explain_structure.py has every kind)
    assert "p['b']: removed" in message and "PyTreeDef" not in message


def test_trace_context_x64(records, x64):
    f = _fresh()
    a = jnp.ones(3, jnp.float32)
    with jax.enable_x64(False) if hasattr(jax, "enable_x64") else _x64(False):
        f(a, a)
    message = _explained(records, lambda: f(a, a))
    assert "trace context jax_enable_x64: False -> True" in message


def _x64(on):
    from jax.experimental import disable_x64, enable_x64

    return enable_x64() if on else disable_x64()


def test_trace_context_default_device(records):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    f = _fresh()
    a = jnp.ones(3)
    f(a, a)

    def call():
        with jax.default_device(jax.devices()[1]):
            f(a, a)

    message = _explained(records, call)
    assert "trace context jax_default_device: None -> CpuDevice(id=1)" in message


def test_options_of_another_jit_of_the_same_function(records):
    def g(x):
        return x * 2

    nbjit.jit(g)(jnp.ones(3))
    donating = nbjit.jit(g, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU may not use the donated buffer
        message = _explained(records, lambda: donating(jnp.ones(3)))
    assert "another jit of the same function has entries: " in message
    assert "option donate_argnums: () -> (0,)" in message


def test_evicted_entry_and_nothing_compiled(records):
    def g(x):
        return x + 1

    cache = nbjit.PjitFunctionCache(2)
    f = PjitFunction(g, {}, cache=cache)
    a, b, c = jnp.ones(1), jnp.ones(2), jnp.ones(3)
    f(a), f(b), f(c)  # c evicts a
    message = _explained(records, lambda: f(a))
    assert "this signature was compiled before; the LRU evicted its entry (cache capacity 2)" \
        in message
    assert "JAX compiled nothing new (its trace and compile caches held it)" in message


def test_jax_explain_cache_misses_turns_it_on(records):
    f = _fresh()
    a = jnp.ones(3)
    f(a, a)
    before = len(records())
    with jax.explain_cache_misses(True) if hasattr(jax, "explain_cache_misses") else \
            _config_on("jax_explain_cache_misses"):
        assert _explain.enabled()
        f(a, jnp.ones(1))
    assert not _explain.enabled()
    assert len(records()[before:]) == 1


class _config_on:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.old = getattr(jax.config, self.name)
        jax.config.update(self.name, True)

    def __exit__(self, *exc):
        jax.config.update(self.name, self.old)


def test_explain_misses_nests_and_is_thread_safe():
    assert not _explain.enabled()
    with nbjit.explain_misses():
        with nbjit.explain_misses():
            assert _explain.enabled()
        assert _explain.enabled()
    assert not _explain.enabled()

    def enter_exit():
        for _ in range(200):
            with nbjit.explain_misses():
                pass

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(enter_exit) for _ in range(4)]:
            future.result(timeout=60)  # re-raises what a thread raised
    assert not _explain.enabled() and _explain._depth == 0


def test_closest_of_many_entries(records):
    """Shape churn: the closest of 40 cached signatures is the one with the same shapes."""
    f = nbjit.jit(lambda x, y: x.sum() + y.sum())
    for n in range(1, 41):
        f(jnp.ones(n), jnp.ones(n))
    message = _explained(records, lambda: f(jnp.ones(7), jnp.ones(7, jnp.int32)))
    assert "of 40 cached signatures: y: dtype float32[7] -> int32[7]" in message
    assert "shape" not in message


# -- the closest-entry search: Numba kernel and Python loop agree ---------------

_HEADER, _LEAF = _kernels.DESCRIPTION_HEADER_WORDS, _kernels.DESCRIPTION_LEAF_WORDS


def _row(n_leaves):
    """A packed row of `n_leaves` leaves whose paths come from a few (some repeat,
    some are missing, some are out of order), fields from a few values."""
    leaf = st.tuples(st.integers(0, 4), *[st.integers(-1, 2)] * (_LEAF - 1))
    return st.tuples(st.lists(st.integers(-1, 2), min_size=_HEADER - 1, max_size=_HEADER - 1),
                     st.lists(leaf, min_size=n_leaves, max_size=n_leaves)).map(
        lambda t: [n_leaves, *t[0], *[w for lf in t[1] for w in lf]])


_rows = st.lists(st.integers(0, 4).flatmap(_row), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(_rows, st.integers(0, 4).flatmap(_row))
def test_kernel_and_python_distances_agree(rows, new):
    arrays = [np.array(r, np.int64) for r in rows]
    python = [_distance.description_distance_python(new, r) for r in rows]
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    numba = _kernels.description_distances(np.array(new, np.int64), np.concatenate(arrays),
                                           offsets)
    assert list(numba) == python
    last_closest = max(i for i, d in enumerate(python) if d == min(python))  # ties: newest
    assert _kernels.closest_numba(np.array(new, np.int64), arrays) == (last_closest,
                                                                        min(python))
    assert _distance.closest_python(new, rows) == (last_closest, min(python))


def test_distance_matches_leaves_by_path():
    """A leaf moved to another position still compares with its own path's leaf."""
    a_leaf, b_leaf = [11, 1, 2, 3, 4, 5, 1, 6], [22, 1, 2, 3, 4, 5, 1, 7]
    old = [2, 0, 0, 0, *a_leaf, *b_leaf]
    new = [2, 0, 0, 0, *b_leaf, *a_leaf]
    assert _distance.description_distance_python(new, old) == 0
    new_shape = [2, 0, 0, 0, *b_leaf[:-1], 8, *a_leaf]  # b's shape differs
    assert _distance.description_distance_python(new_shape, old) == 1
    only_a = [1, 9, 0, 0, *a_leaf]  # b missing: the structure word counts it, once
    assert _distance.description_distance_python(only_a, old) == 1
    # b of another kind: one field, plus its dtype and its shape where both have one
    kind = [2, 0, 0, 0, *a_leaf, 22, 9, 2, 3, 4, 5, 1, 7]
    kind_shape = [2, 0, 0, 0, *a_leaf, 22, 9, 2, 3, 4, 5, 2, 7]
    kind_dtype_shape = [2, 0, 0, 0, *a_leaf, 22, 9, 8, 3, 4, 5, 1, 8]
    no_dtype_no_shape = [2, 0, 0, 0, *a_leaf, 22, 9, 0, 3, 4, 5, -1, 8]  # a static, say
    assert [_distance.description_distance_python(r, old)
            for r in (kind, kind_shape, kind_dtype_shape, no_dtype_no_shape)] == [1, 2, 3, 1]
    arrays = [np.array(old, np.int64)]
    for row in (new, new_shape, only_a, kind, kind_shape, kind_dtype_shape, no_dtype_no_shape):
        assert _kernels.closest_numba(np.array(row, np.int64), arrays)[1] == \
            _distance.description_distance_python(row, old)


def test_the_twins_share_the_layout():
    assert (_kernels.DESCRIPTION_HEADER_WORDS, _kernels.DESCRIPTION_LEAF_WORDS) == (
        _distance.DESCRIPTION_HEADER_WORDS, _distance.DESCRIPTION_LEAF_WORDS)
    row = _descriptions.describe_call((jnp.ones(2), {"a": 1.0}), {"k": np.ones(1)}, (), (),
                                      ()).row
    assert len(row) == _kernels.DESCRIPTION_HEADER_WORDS + 3 * _kernels.DESCRIPTION_LEAF_WORDS


def test_explaining_a_few_entries_loads_no_numba():
    """Every miss is explained (for ranked_misses): with few entries that must not
    import numba (~0.5 s)."""
    import subprocess
    import sys

    code = ("import sys, nbjit, jax.numpy as jnp\n"
            "f = nbjit.jit(lambda x: x + 1)\n"
            "for n in range(1, 6): f(jnp.ones(n))\n"
            "assert nbjit.ranked_misses()[0].count >= 1\n"
            "print('numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "XLA_FLAGS": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_closest_uses_the_kernel_past_the_crossover():
    descriptions = [_descriptions.describe_call((jnp.ones(n),), {}, (), (), ())
                    for n in range(1, 400)]
    new = _descriptions.describe_call((jnp.ones(123),), {}, (), (), ())
    assert len(descriptions) * len(new.row) >= _explain.NUMBA_CLOSEST_MIN_WORDS
    index, distance = _explain.closest(new, descriptions)
    assert (index, distance) == (122, 0)


# -- the closest entry: fewest differing fields, leaves matched by path ---------


def test_adding_a_keyword_names_one_field(records):
    """Two entries, {'a'} and {'a', 'b'}; the call adds a keyword to {'a'}: the
    closest entry is {'a'} (one field differs), though {'a', 'b'} has as many
    leaves as the call."""
    f = nbjit.jit(lambda p, k=None: p["a"])
    a = jnp.ones(3)
    f({"a": a})
    f({"a": a, "b": a})
    message = _explained(records, lambda: f({"a": a}, k=a))
    assert "cached signatures: keyword names () -> ('k',); JAX traced" in message


def test_every_differing_field_is_listed_up_to_the_limit(records):
    f = nbjit.jit(lambda *xs: xs[0])
    n = _explain._MAX_DIFFERENCES + 2
    f(*[jnp.ones(1)] * n)
    message = _explained(records, lambda: f(*[jnp.ones(2)] * n))
    for i in range(_explain._MAX_DIFFERENCES):
        assert f"xs[{i}]: shape float32[1] -> float32[2]" in message
    assert f"xs[{_explain._MAX_DIFFERENCES}]" not in message
    assert "and 2 more" in message


def test_ties_name_the_most_recent_entry(records):
    f = nbjit.jit(lambda x: x)
    f(jnp.ones(1))
    f(jnp.ones(2))
    message = _explained(records, lambda: f(jnp.ones(3)))
    assert "shape float32[2] -> float32[3]" in message


def test_python_float_then_numpy_float32_names_the_weak_type(records):
    f = nbjit.jit(lambda x: x * 2)
    f(1.5)
    message = _explained(records, lambda: f(np.float32(1.5)))
    assert "x: kind float -> numpy" in message
    assert "the weak type changed: weak -> strong" in message
    assert "np.float32(x)" in message  # what to do


def test_call_site_is_relative_to_the_working_directory_below_it(records, monkeypatch):
    f = nbjit.jit(lambda x: x + 1)
    f(jnp.ones(3))
    here = os.path.dirname(os.path.abspath(__file__))
    line = _this_line() + 2
    monkeypatch.chdir(os.path.dirname(here))  # the repo root: tests/... as pytest prints it
    message = _explained(records, lambda: f(jnp.ones(4)))
    assert f" at tests{os.sep}test_explain.py:{line}:" in message
    monkeypatch.chdir(os.path.join(here, "tools"))  # not below it: the full path
    message = _explained(records, lambda: f(jnp.ones(5)))
    assert f" at {os.path.join(here, 'test_explain.py')}:" in message


def _this_line():
    return sys._getframe(1).f_lineno


@pytest.mark.cpu_devices("a sharding over 2 devices")
def test_equally_close_entries_are_each_named_same_sharding_first(records):
    # f(x), then a sharded call: f(device_put(x, device 0)) differs from the
    # first entry only in committedness and from the second only in sharding.
    f = _fresh(lambda x: x + 1)
    x = jnp.arange(8.0)
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f(x)
    f(jax.device_put(x, NamedSharding(mesh, PartitionSpec("x"))))
    message = _explained(records, lambda: f(jax.device_put(x, jax.devices()[0])))
    assert "2 of 2 cached signatures are equally close: (args[0]: committed False -> True); " \
           "or (args[0]: sharding NamedSharding(" in message
    rows = [r for r in nbjit.ranked_misses() if r.fields == ("args[0]: committed",)]
    assert rows, "the miss is grouped by the entry with the same sharding"


def test_equally_close_without_shardings_most_recent_first(records):
    f = _fresh()
    a = jnp.ones(3)
    f(a, a)
    f(a.astype(jnp.int32), a)  # differs from the next call in args[0] dtype
    message = _explained(records, lambda: f(a, a.astype(jnp.int32)))
    # the first entry differs in args[1] dtype; the second in both: one closest
    assert "against the closest of 2 cached signatures: args[1]: dtype" in message
    f2 = _fresh(lambda x, y: x.sum() + y.sum())
    f2(a, a)
    f2(jnp.ones(4), a)
    message = _explained(records, lambda: f2(jnp.ones(4), jnp.ones(2)))
    assert "against the closest of 2 cached signatures: args[1]: shape" in message
    f3 = _fresh(lambda x, y: x.sum() + y.sum())
    f3(a, jnp.ones(2))
    f3(jnp.ones(2), a)
    message = _explained(records, lambda: f3(jnp.ones(2), jnp.ones(2)))
    # each differs in one shape; the most recent (args[1]) is named first
    assert "2 of 2 cached signatures are equally close: (args[1]: shape float32[3] -> " \
           "float32[2]); or (args[0]: shape float32[3] -> float32[2])" in message


def test_equally_close_entries_agree_in_python_and_the_kernel(monkeypatch):
    # 400 entries, each differing in one shape from the call; the kernel past
    # the crossover and the Python loop below it name the same ties in order.
    descriptions = [_descriptions.describe_call((jnp.ones(n), jnp.ones(2)), {}, (), (), ())
                    for n in range(3, 203)]
    descriptions += [_descriptions.describe_call((jnp.ones(2), jnp.ones(n)), {}, (), (), ())
                     for n in range(3, 203)]
    new = _descriptions.describe_call((jnp.ones(2), jnp.ones(2)), {}, (), (), ())
    kernel = _explain._closest_entries(new, descriptions)
    assert "nbjit._kernels" in sys.modules
    monkeypatch.setattr(_explain, "NUMBA_CLOSEST_MIN_WORDS", 10**9)
    python = _explain._closest_entries(new, descriptions)
    assert kernel == python
    assert kernel == ([399, 398, 397], 400)  # all tie; the 3 most recent are named


def test_more_ties_than_named_are_counted(records):
    f = _fresh(lambda *xs: sum(x.sum() for x in xs))
    for k in range(4):  # entry k differs from the call in args[k]'s shape only
        f(*[jnp.ones(3) if i == k else jnp.ones(2) for i in range(4)])
    message = _explained(records, lambda: f(*[jnp.ones(2)] * 4))
    assert "4 of 4 cached signatures are equally close: (args[3]: shape" in message
    assert message.count("; or (") == 2 and "; or 1 more" in message


# -- every difference named, each counted (issue 46) ---------------------------


def test_a_kind_change_names_the_shape_and_dtype_that_changed_with_it(records):
    f = _fresh(lambda x: x * 2)
    f(np.ones((8, 8), np.float32))
    message = _explained(records, lambda: f(jnp.ones((16, 8))))
    assert "args[0]: kind numpy -> jax.Array; args[0]: shape float32[8,8] -> float32[16,8]" \
        in message
    g = _fresh(lambda x: x * 2)
    g(np.ones((8, 8), np.float32))
    message = _explained(records, lambda: g(jnp.ones((16, 8), jnp.int32)))
    assert ("args[0]: kind numpy -> jax.Array; args[0]: dtype float32[8,8] -> int32[16,8]; "
            "args[0]: shape float32[8,8] -> int32[16,8]") in message
    rows = [r for r in nbjit.ranked_misses() if "args[0]: kind" in r.fields]
    assert any(r.fields == ("args[0]: kind", "args[0]: shape") for r in rows)


def test_a_dtype_change_alone_is_named(records):
    f = _fresh(lambda x: x * 2)
    f(jnp.ones(3))
    message = _explained(records, lambda: f(jnp.ones(3, jnp.int32)))
    assert "against the closest of 1 cached signatures: args[0]: dtype float32[3] -> int32[3]" \
        in message


def test_the_closer_entry_wins_against_one_that_differs_in_two_statics(records):
    """f(x, 1, 1) and f(x, 1, 2) cached; f(x, 5, 1) differs from the first in one
    static argument, from the second in two: no tie."""
    f = _fresh(lambda x, a, b: x * a * b, static_argnums=(1, 2))
    x = jnp.ones(3)
    f(x, 1, 1)
    f(x, 1, 2)
    message = _explained(records, lambda: f(x, 5, 1))
    assert "against the closest of 2 cached signatures: args[1]: static argument value 1 -> 5;" \
        in message
    g = nbjit.jit(lambda x, c, d: x * c * d, static_argnames=("c", "d"))
    g(x, c=1, d=1)
    g(x, c=1, d=2)
    message = _explained(records, lambda: g(x, c=5, d=1))
    assert "against the closest of 2 cached signatures: c: static argument value " \
           "1 -> 5;" in message


def test_a_dtype_change_is_closer_than_kind_and_shape(records):
    f = _fresh(lambda x: x * 2)
    f(np.ones((8, 8), np.float32))  # kind, dtype and shape away from the call
    f(jnp.ones((16, 8)))  # the dtype only
    message = _explained(records, lambda: f(jnp.ones((16, 8), jnp.int32)))
    assert "against the closest of 2 cached signatures: args[0]: dtype" in message


class _LooksAlike:
    """Unequal to any other instance, with the same repr."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return self is other

    def __repr__(self):
        return "LooksAlike()"


def test_no_alternative_is_printed_twice(records):
    f = _fresh(lambda x, s: x, static_argnums=1)
    x = jnp.ones(3)
    f(x, _LooksAlike())
    f(x, _LooksAlike())
    message = _explained(records, lambda: f(x, _LooksAlike()))
    assert "2 of 2 cached signatures are equally close" in message
    assert message.count("args[1]: static argument value a new object, not equal") == 1
