"""Per-phase timing: `with nbjit.profile() as prof:` (nbjit/_profile.py)."""

import gc
import html
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.core.dispatch import PjitFunction
from nbjit.observe import profile as _profile


def _fresh():
    def step(x):
        return x * 2

    return nbjit.jit(step)


def _compiled():
    """A fresh jitted function and an argument it has already compiled for."""
    f, a = _fresh(), jnp.ones(3)
    f(a)
    return f, a


def test_hits_in_five_phases_misses_and_slow_calls_whole():
    f, a = _compiled()
    with nbjit.profile() as prof:
        for _ in range(20):
            f(a)
        f(jnp.ones(4))  # a miss
        with jax.disable_jit():
            f(a)  # slow
    phases = prof.phases_ns(f)
    assert phases.shape == (20, 5) and (phases >= 0).all() and phases[:, 3].sum() > 0
    (row,) = prof.summary()
    assert (row["calls"], row["hits"], row["misses"], row["slow"]) == (22, 20, 1, 1)
    assert row["name"] == f.stats().name and "._fresh.<locals>.step (test_profile.py:" in \
        row["name"]
    assert row["miss_mean_us"] > row["hit_mean_us"] > 0
    hits_us = phases.sum(axis=1) / 1e3
    assert row["hit_median_us"] == pytest.approx(float(np.median(hits_us)))
    assert row["execute_median_us"] == pytest.approx(float(np.median(phases[:, 3])) / 1e3)
    assert row["hit_p90_us"] >= row["hit_median_us"]
    assert f.stats().calls == 23


def test_phases_sum_to_the_call_within_the_stated_overhead():
    f, a = _compiled()
    gaps = []
    with nbjit.profile() as prof:
        assert prof.overhead_ns > 0
        for _ in range(20):  # the first call builds the timed binder (~0.5 ms)
            f(a)
        # The machine's speed can change for seconds at a time (a shared VM
        # ran at two speeds, 2x apart): the overhead is measured again
        # between the chunks of timed calls, and the largest estimate bounds them.
        overheads = [prof.overhead_ns]
        clock = time.perf_counter_ns
        gc.disable()  # as in every timing here (nbjit/bench/measure.py): no collection mid-call
        try:
            outs = []  # kept: freeing an output array (~1 us) is no part of the call
            for _ in range(3):
                overheads.append(_profile._measure_overhead(200))
                for _ in range(100):
                    start = clock()
                    out = f(a)
                    end = clock()
                    outs.append(out)
                    gaps.append(end - start)
            overheads.append(_profile._measure_overhead(200))
        finally:
            gc.enable()
    overhead = max(overheads)
    spans = prof.phases_ns(f).sum(axis=1)[20:]  # the 300 timed calls
    outside = np.asarray(gaps) - spans  # the call's time not in any phase
    # What lies outside the phases: `__call__`'s own frame (entering it up to
    # its first clock read, its return after the last), under half of the
    # probe call the stated overhead times (~0.5 us against ~1.1 here, this
    # test's clock reads included). Where a call's Python runs several times
    # slower than in the probe's tight loop (a TPU, whose runtime leaves the
    # caches cold: 7.8 us lay outside there against 1.0 stated while the
    # binder took the first and last stamps) it grows with the rest:
    # benchmarks/probes/cold_profile.py's cold runs here kept it under this
    # bound where 16-20 MiB were written between calls (1.6-2.8 us; 4.3-7.4
    # before), not at 24-32 MiB (docs/profiler.md). Twice the stated
    # overhead, plus 1 us for this test's own clock reads; a phase left
    # unstamped (execute alone is 3-5x the overhead here, ~100x on a TPU)
    # still fails it, and
    # test_the_phases_span_the_call_from_its_entry_to_the_binders_return
    # checks that the first and last stamps are the call's own.
    assert np.median(outside) <= 2 * overhead + 1000, (np.median(outside), overhead)
    assert np.median(outside) >= 0


def test_the_phases_span_the_call_from_its_entry_to_the_binders_return():
    """What a call does around its binder (finding it, returning from it)
    counts in the first and last phases: a binder that sleeps 2 ms before
    and after its work shows them in the key and outputs phases, and nothing
    of them outside."""
    f, a = _compiled()
    with nbjit.profile() as prof:
        f(a)  # builds the timed binder
        binder = f._binders[1]

        def slow_around(*args):
            time.sleep(0.002)
            out = binder(*args)
            time.sleep(0.002)
            return out

        slow_around.takes_entry_stamp = binder.takes_entry_stamp
        f._binders[1] = slow_around
        start = time.perf_counter_ns()
        f(a)
        call = time.perf_counter_ns() - start
    phases = prof.phases_ns(f)[-1]
    assert phases[0] >= 2_000_000 and phases[4] >= 2_000_000, phases
    assert call - phases.sum() < 1_000_000, (call, phases)


def test_other_call_shapes_record_hits():
    f = nbjit.jit(lambda x, n, *, y: x * n + y["w"], static_argnums=1)
    a = jnp.ones(3)
    f(a, 2, y={"w": a})
    with nbjit.profile() as prof:
        for _ in range(5):
            f(a, 2, y={"w": a})
    phases = prof.phases_ns(f)
    assert phases.shape == (5, 5) and (phases > 0).all()
    assert type(f) is PjitFunction


def test_no_cost_when_off_and_every_function_switched_back():
    f = _fresh()
    g = nbjit.jit(lambda x, n: x * n, static_argnums=1)
    assert f._binders.flavour == "plain" and not _profile.active()
    with nbjit.profile():
        assert _profile.active()
        assert f._binders.flavour == "timed" and g._binders.flavour == "timed"
        h = _fresh()  # made inside: profiled too
        assert h._binders.flavour == "timed"
        h(jnp.ones(2)), g(jnp.ones(2), 3), g(jnp.ones(2), 3)
    assert not _profile.active()
    for jitted in (f, g, h):
        assert type(jitted) is PjitFunction and jitted._binders.flavour == "plain"
        assert "clock()" not in "".join(  # no clock reads left in any binder
            _keys_source(jitted))
    assert g.stats().hits == 1 and g(jnp.ones(2), 3).shape == (2,)


def test_nested_profiles_both_record():
    f, a = _compiled()
    with nbjit.profile() as outer:
        f(a)
        with nbjit.profile() as inner:
            f(a)
        assert _profile.active()
        f(a)
    assert len(outer.phases_ns(f)) == 3 and len(inner.phases_ns(f)) == 1


def test_table_text_html_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    f, a = _compiled()
    with nbjit.profile() as prof:
        for _ in range(10):
            f(a)
    text = str(prof)
    assert "execute us" in text.splitlines()[0] and "step" in text
    assert "profiler overhead" in text and "median (p90)" in text and "mean (p90)" not in text
    assert repr(prof) == text
    page = prof._repr_html_()
    assert "<table>" in page and html.escape("step") in page
    path = tmp_path / "profile.png"
    fig = prof.plot(str(path))
    assert path.stat().st_size > 1000 and fig is not None
    # One function: the title fits inside the figure (it was cut at the sides).
    fig.canvas.draw()
    title = fig.axes[0].title.get_window_extent()
    width, height = fig.canvas.get_width_height()
    assert title.x0 >= 0 and title.x1 <= width and title.y1 <= height


def _keys_source(jitted) -> list[str]:
    """The sources of a function's binders (from linecache, where nbjit registers them)."""
    import inspect
    return [inspect.getsource(binder) for binder in jitted._binders.values()]


def test_flavours_are_registered_into_the_core_not_imported_by_it():
    """The binders import nothing of nbjit.observe: the timed and traced
    flavours are registered into the core's registry when observe is
    imported, and a registered flavour's lines appear in the one emitted hit
    path (composed, not a copy of it)."""
    import ast
    import inspect

    from nbjit.core import binders, flavours
    from nbjit.observe import spans

    tree = ast.parse(inspect.getsource(binders))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("nbjit.observe")], imported
    assert flavours.flavour("timed") is _profile.TIMED
    assert flavours.flavour("traced") is spans.TRACED

    f, a = _compiled()
    marked = flavours.add_flavour(flavours.Flavour(
        "test_marked", start="mark('start')",
        stamps=("mark('key')", "mark('lookup')", "mark('inputs')", "mark('execute')"),
        finish="mark('finish')", scope={"mark": lambda what: seen.append(what)}))
    seen: list[str] = []
    try:
        plain = f._binders.source(1)
        source = f._binders.source(1, marked.name)
        stripped = "".join(line for line in source.splitlines(True) if "mark(" not in line)
        assert stripped.replace("    out = ", "    return ").replace(
            "    return out\n", "") == plain  # the same hit path, the flavour's lines added
        f._binders.set_flavour(marked.name)
        assert f(a).tolist() == [2.0] * 3
        assert seen == ["start", "key", "lookup", "inputs", "execute", "finish"]
    finally:
        f._binders.set_flavour("plain")
    assert "mark(" not in nbjit.binder_source(f, a)
