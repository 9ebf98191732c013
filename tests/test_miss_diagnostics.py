"""What to fix first: misses ranked by cost (`nbjit.ranked_misses()`), a test
helper that fails on misses (`nbjit.assert_max_misses`), and a full shared
cache said aloud (jax-ml/jax#39078)."""

import html
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.core.dispatch import PjitFunction
from nbjit.observe import explain as _explain
from nbjit.observe.names import function_name, location_name


@pytest.fixture
def fresh_ranking():
    _explain.reset_ranked_misses()
    yield
    _explain.reset_ranked_misses()


def _rows_of(fun):
    return [r for r in nbjit.ranked_misses() if r.function == location_name(fun)]


# -- nbjit.ranked_misses() --------------------------------------------------------


def test_misses_grouped_by_site_and_field_costliest_first(fresh_ranking):
    def churn(x, y):
        return x.sum() + y.sum()

    f = nbjit.jit(churn)
    a = jnp.ones(2)
    f(a, a)  # the first call
    for n in range(3, 6):
        f(jnp.ones(n), a)  # x shape, three times, from one line
    f(a, a.astype(jnp.int32))  # y dtype, once
    rows = _rows_of(churn)
    by_fields = {r.fields: r for r in rows}
    assert set(by_fields) == {(_explain.FIRST_CALL,), ("x: shape",), ("y: dtype",)}
    shapes = by_fields[("x: shape",)]
    site = f"test_miss_diagnostics.py:{_line('f(jnp.ones(n), a)')}"
    assert shapes.count == 3 and shapes.site.endswith(site)
    assert by_fields[("y: dtype",)].count == 1
    assert "y: dtype float32[2] -> int32[2]" in by_fields[("y: dtype",)].example
    assert sum(r.count for r in rows) == f.stats().misses == 5
    assert sum(r.seconds for r in rows) == pytest.approx(f.stats().miss_seconds)
    costs = [r.seconds for r in nbjit.ranked_misses()]
    assert costs == sorted(costs, reverse=True)
    assert len(nbjit.ranked_misses(top=2)) == 2


def _line(text):
    """The line number of `text` in this file (for call sites)."""
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if text in line and "_line(" not in line:
                return number
    raise AssertionError(text)


def test_ranked_misses_text_and_html(fresh_ranking):
    f = nbjit.jit(lambda x: x + 1)
    f(jnp.ones(1)), f(jnp.ones(2))
    ranked = nbjit.ranked_misses()
    text = str(ranked)
    assert repr(ranked) == text
    header = text.splitlines()[0].split()
    assert header[:2] == ["miss", "s"] and "differs" in header
    assert "x: shape" in text and location_name(f._fun) in text
    page = ranked._repr_html_()
    assert page.startswith("<table>") and html.escape(function_name(f._fun)) in page
    assert page.count("<tr>") == 1 + len(ranked)
    nbjit.reset_ranked_misses()  # the top-level name
    assert str(nbjit.ranked_misses()) == "no nbjit misses"


def test_ranking_works_with_explaining_off_and_logs_nothing(fresh_ranking, caplog):
    caplog.set_level(logging.WARNING, logger="nbjit")
    f = nbjit.jit(lambda x: x * 3)
    f(jnp.ones(1)), f(jnp.ones(2))
    assert [r.fields for r in _rows_of(f._fun)] in (
        [(_explain.FIRST_CALL,), ("x: shape",)],
        [("x: shape",), (_explain.FIRST_CALL,)])
    assert [r for r in caplog.records if r.name == "nbjit"] == []


# -- nbjit.assert_max_misses -------------------------------------------------------


def test_assert_max_misses_passes_within_the_budget():
    f = nbjit.jit(lambda x: x - 1)
    a = jnp.ones(3)
    f(a)
    with nbjit.assert_max_misses(0):
        for _ in range(5):
            np.testing.assert_array_equal(f(a), a - 1)
    with nbjit.assert_max_misses(1):
        f(jnp.ones(4))


def test_assert_max_misses_fails_naming_the_explained_misses():
    def step(params, batch):
        return params * batch.mean()

    f = nbjit.jit(step)
    params = jnp.ones(3)
    f(params, jnp.ones((8, 3)))
    with pytest.raises(AssertionError) as error:
        with nbjit.assert_max_misses(1):
            f(params, jnp.ones((7, 3)))  # a ragged last batch
            f(params, jnp.ones((6, 3)))
    message = str(error.value)
    assert message.startswith("2 nbjit cache misses, at most 1 allowed")
    assert f"nbjit cache miss of {function_name(step)}" in message
    assert "batch: shape float32[8,3] -> float32[7,3]" in message
    assert "batch: shape float32[7,3] -> float32[6,3]" in message
    assert "test_miss_diagnostics.py:" in message  # the call site


def test_assert_max_misses_slow_calls():
    f = nbjit.jit(lambda x: x + 2)
    a = jnp.ones(2)
    f(a)
    with nbjit.assert_max_misses(0, slow=0):
        f(a)
    with pytest.raises(AssertionError, match=r"1 nbjit slow calls .*at most 0 allowed") as error:
        with nbjit.assert_max_misses(0, slow=0):
            with jax.disable_jit():
                f(a)
    assert "disable_jit 1 (jax.disable_jit() is on" in str(error.value)
    with nbjit.assert_max_misses(0):  # slow calls are not counted unless asked
        with jax.disable_jit():
            f(a)


def test_assert_max_misses_keeps_the_blocks_own_exception():
    f = nbjit.jit(lambda x: x)
    with pytest.raises(ZeroDivisionError):
        with nbjit.assert_max_misses(0):
            f(jnp.ones(1))  # a miss, over the budget
            raise ZeroDivisionError


def test_assert_max_misses_counts_the_first_compile():
    f = nbjit.jit(lambda x: x * 5)
    with pytest.raises(AssertionError, match="1 nbjit cache misses, at most 0 allowed"):
        with nbjit.assert_max_misses(0):
            f(jnp.ones(1))


# -- a shared cache full of live functions (jax-ml/jax#39078) ----------------------


def _fresh_functions(n, cache, offset=0):
    """`n` distinct live functions over one cache, and jax.jit twins for their results."""
    funs = [lambda x, k=k: x * k + 1 for k in range(offset, offset + n)]
    return [PjitFunction(fun, {}, cache=cache) for fun in funs], [jax.jit(fun) for fun in funs]


def test_a_full_cache_still_gives_every_new_function_its_fast_path(fresh_ranking):
    """Capacity 4, held by four live functions that keep being called; then
    new functions, each called a few times: each new one hits after its first
    call, every eviction is counted, and the evicted function's next miss says
    the LRU evicted it."""
    cache = nbjit.PjitFunctionCache(4)
    live, live_ref = _fresh_functions(4, cache)
    x = jnp.arange(3.0)
    for f in live:
        f(x)
    assert cache.size() == 4
    for _ in range(3):  # the working set fits: hits only
        for f, ref in zip(live, live_ref, strict=True):
            np.testing.assert_array_equal(f(x), ref(x))
    assert sum(f.stats().hits for f in live) == 12

    new, new_ref = _fresh_functions(6, cache, offset=10)
    for g, ref in zip(new, new_ref, strict=True):
        for _ in range(3):
            np.testing.assert_array_equal(g(x), ref(x))
        s = g.stats()
        assert (s.calls, s.misses, s.hits, s.slow) == (3, 1, 2, 0)  # a fast path
        assert cache.size() == 4
    everyone = [*live, *new]
    assert sum(f.stats().evictions for f in everyone) == 6  # one per new function
    assert cache.size() == 4

    with nbjit.explain_misses():
        with pytest.raises(AssertionError) as error:
            with nbjit.assert_max_misses(0):
                np.testing.assert_array_equal(live[0](x), live_ref[0](x))  # evicted long ago
    assert "the LRU evicted its entry (cache capacity 4)" in str(error.value)
    assert any(r.fields == (_explain.EVICTED,) for r in _rows_of(live[0]._fun))
    s = live[0].stats()
    assert (s.misses, s.evictions, s.entries) == (2, 1, 1)
    live[0](x)
    assert live[0].stats().hits == 3 + 1  # its fast path is back


def test_functions_made_under_a_full_config_cache_keep_their_fast_path():
    """The same through `jax_jit_cpp_cache_obj` (how jax.jit's users configure it)."""
    from jax._src import config as jax_config
    from jax._src.pjit import make_jit_cpp_cache

    cpp_cache = make_jit_cpp_cache(2)
    x = jnp.arange(4.0)
    made = []
    with jax_config.jax_jit_cpp_cache_obj(cpp_cache):
        for k in range(6):
            made.append(nbjit.jit(lambda x, k=k: x - k))
    assert len({id(f._cache) for f in made}) == 1 and made[0]._cache.capacity() == 2
    for k, f in enumerate(made):
        for _ in range(4):
            np.testing.assert_array_equal(f(x), x - k)
        assert (f.stats().misses, f.stats().hits) == (1, 3)
    assert sum(f.stats().evictions for f in made) == 4


CELL = """
import jax.numpy as jnp
import nbjit

@nbjit.jit
def train_step(w, x):
    return (x @ w).sum()

train_step(jnp.ones((4, 2)), jnp.ones((8, 4)))
train_step(jnp.ones((4, 2)), jnp.ones((16, 4)))  # a new batch size
"""


def test_re_definitions_of_one_cell_fold_into_its_rows(fresh_ranking):
    """A notebook cell run 50 times defines 50 function objects from one code
    location (stats() names them train_step (...)#N): the ranking keeps one row
    per call site and field, its first-call row counting the re-definitions."""
    code = compile(CELL, "/tmp/ipykernel_1/1234567.py", "exec")  # one cell, run again and again
    for _ in range(50):
        exec(code, {"__name__": "__main__"})
    rows = [r for r in nbjit.ranked_misses() if r.function.startswith("train_step (")]
    assert len(rows) <= 5
    by_fields = {r.fields: r for r in rows}
    assert by_fields[(_explain.FIRST_CALL,)].count == 50
    assert by_fields[("x: shape",)].count == 50
    assert {r.function for r in rows} == {"train_step (1234567.py:5)"}
    assert "#" not in str(nbjit.ranked_misses())


def test_the_ranking_stays_bounded(fresh_ranking, monkeypatch):
    monkeypatch.setattr(_explain, "MAX_GROUPS", 5)
    for n in range(12):  # 12 cells, each a function of its own: 12 first-call groups
        exec(compile(CELL, f"/tmp/ipykernel_1/cell{n}.py", "exec"), {"__name__": "__main__"})
    ranked = nbjit.ranked_misses()
    assert len(ranked) == 5
    assert ranked.dropped[:2] == (19, 19)  # 24 groups: a first call and a new shape each
    assert "and 19 cheaper misses" in str(ranked) and "at most 5 groups" in str(ranked)
    nbjit.reset_ranked_misses()
    assert len(nbjit.ranked_misses()) == 0 and nbjit.ranked_misses().dropped == (0, 0, 0.0)
