"""Memory: cache hits do not grow the process, dropped functions leave nothing.

RSS is read from /proc/self/statm; nothing is asserted of time (a clock only
sizes the hit loops, below). The figures are printed (run with ``-s`` to see
them). The million-call and 10,000-function runs are `slow`; CI runs smaller
versions of the same checks.

On every backend: nbjit's hits may grow the process by what jax.jit's own
hits grow it by in the same test (an accelerator's runtime keeps host memory
of its own as calls queue), plus the limit, in at least one of three rounds
(a leak grows every round; the runtime's growth comes in steps, on a TPU in
either side's rounds); and a loop makes as many hits as
fit a few seconds, at most the number asked for (on the CPU, all of them: a
hit there is microseconds; on a TPU, jax.jit's hit with a numpy input took
~0.5 ms).
"""

from __future__ import annotations

import gc
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit import _jax
from nbjit.core import dispatch as nb_dispatch

MB = 2**20

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                reason="RSS is read from /proc/self/statm (Linux)")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hit_workloads() -> dict:
    """name -> (jitted-function factory, args, kwargs): cache hits of each kind."""
    x, y = jnp.ones(3), jnp.arange(3.0)
    nx = np.ones(3, np.float32)
    return {
        "jax_arrays": (lambda jit: jit(lambda a, b: a * b + 1), (x, y), {}),
        "numpy_and_scalar": (lambda jit: jit(lambda a, b: a * b + 1), (nx, 2.0), {}),
        "pytree_static_kwargs": (
            lambda jit: jit(lambda t, n, *, scale: (t["a"] * scale + n, t["b"]),
                            static_argnums=1),
            ({"a": x, "b": [y]}, 3), {"scale": x}),
    }


HIT_LOOP_SECONDS = 4.0  # per round, at most: the hit loops' size (see the module docstring)
ROUNDS = 3  # of each side's hits, alternating (see `_check_hits`)


def _rss_growth(jitted, args, kwargs, calls: int) -> float:
    """RSS growth in MB over `calls` cache hits, after a warm-up; no gc in the loop."""
    for _ in range(min(20_000, calls)):
        jitted(*args, **kwargs)
    gc.collect()
    before = _rss()
    for _ in range(calls):  # no gc.collect() here: a leak the gc would hide must show
        jitted(*args, **kwargs)
    return (_rss() - before) / MB


def _calls_that_fit(jitted_functions, args, kwargs, calls: int, seconds: float) -> int:
    """`calls`, or fewer where the slowest of the functions' hits (timed over a
    few hundred) would make a loop longer than `seconds`."""
    slowest = 0.0
    for jitted in jitted_functions:
        jitted(*args, **kwargs)  # (jax.jit's miss)
        start = time.perf_counter()
        for _ in range(300):
            out = jitted(*args, **kwargs)
        jax.block_until_ready(out)
        slowest = max(slowest, (time.perf_counter() - start) / 300)
    return max(10_000, min(calls, int(seconds / max(slowest, 1e-9))))


def _check_hits(name: str, calls: int, limit_mb: float,
                seconds: float | None = HIT_LOOP_SECONDS) -> None:
    """`calls` hits (fewer where they would take longer than `seconds`; None:
    all of them) grow RSS by less than `limit_mb` beyond jax.jit's growth."""
    make, args, kwargs = _hit_workloads()[name]
    jitted, upstream_jitted = make(nbjit.jit), make(jax.jit)
    jitted(*args, **kwargs)  # the miss
    if seconds is not None:
        calls = _calls_that_fit((jitted, upstream_jitted), args, kwargs, calls, seconds)
    misses, slow = jitted.miss_count, jitted.slow_count
    # Rounds alternate between nbjit's hits and jax.jit's, ROUNDS each: growth
    # of the runtime's own (its pools, an allocator's arena; on a TPU a few MB
    # at a time, in either side's rounds) lands in some rounds, while a leak
    # of nbjit's grows every round of its side. So each side's least growth.
    ours, upstream = [], []
    for _ in range(ROUNDS):
        ours.append(_rss_growth(jitted, args, kwargs, calls))
        upstream.append(_rss_growth(upstream_jitted, args, kwargs, calls))
    growth, runtime = min(ours), max(min(upstream), 0.0)
    print(f"\n[memory] {name}: {calls} cache hits a round: nbjit RSS "
          f"{', '.join(f'+{g:.2f}' for g in ours)} MB, jax.jit RSS "
          f"{', '.join(f'+{g:.2f}' for g in upstream)} MB")
    assert (jitted.miss_count, jitted.slow_count) == (misses, slow), "all calls were hits"
    assert jitted._cache_size() == 1
    # What jax.jit's own hits grew the process by is the runtime's, not nbjit's.
    assert growth < limit_mb + runtime, (
        f"{calls} cache hits grew RSS by {growth:.2f} MB or more in each of {ROUNDS} rounds "
        f"(jax.jit's: {runtime:.2f} MB)")


@pytest.mark.parametrize("name", list(_hit_workloads()))
def test_cache_hits_do_not_grow_rss(name):
    _check_hits(name, calls=100_000, limit_mb=3.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_hit_workloads()))
def test_million_cache_hits_grow_rss_by_less_than_5mb(name):
    _check_hits(name, calls=1_000_000, limit_mb=5.0, seconds=None)


# ---------------------------------------------------------------------------
# Creating and dropping jitted functions


def _nbjit_state() -> tuple[int, int, int, int]:
    """(entries, function namespaces) of both module caches."""
    d, e = nb_dispatch._default_cache, nb_dispatch._explicit_cache
    return d.size(), len(d._namespaces), e.size(), len(e._namespaces)


def _totals() -> tuple[int, int]:
    """(entries, namespaces) over both module caches."""
    d_size, d_ns, e_size, e_ns = _nbjit_state()
    return d_size + e_size, d_ns + e_ns


def _live_executables() -> int:
    return len(_jax.live_executables())


def _make_and_call(jit, i: int):
    """A fresh Python function, jitted and called (a miss, then a hit)."""
    kind = i % 4
    if kind == 0:
        f = jit(lambda x: x + i)
        args = (jnp.ones(2),)
    elif kind == 1:
        f = jit(lambda x, y: x * y - i)
        args = (np.ones(2, np.float32), 3.0)
    elif kind == 2:
        f = jit(lambda x, n: x * n + i, static_argnums=1)
        args = (jnp.ones(2), 2)
    else:  # explicit options: the other module cache
        args = (jnp.ones(2),)
        f = jit(lambda x: x - i, out_shardings=jax.sharding.make_single_device_sharding(
            jax.devices()[0]))
    for _ in range(2):
        out = f(*args)
    jax.block_until_ready(out)
    return f


def _create_and_drop(jit, n: int, keep_last: int = 0):
    """Creates n jitted functions, calls each, drops all but the last `keep_last`."""
    kept = []
    for i in range(n):
        f = _make_and_call(jit, i)
        if i >= n - keep_last:
            kept.append(f)
        del f
    return kept


def _check_create_and_drop(n: int) -> None:
    _create_and_drop(jax.jit, 8)  # JAX's own one-off executables (jnp.ones, ...) first
    gc.collect()
    state0, live0 = _nbjit_state(), _live_executables()
    # while some are alive, they are counted: the counting itself works
    kept = _create_and_drop(nbjit.jit, n, keep_last=8)
    assert sum(f._cache_size() for f in kept) == 8
    gc.collect()
    assert _live_executables() >= live0 + 8
    del kept
    gc.collect()
    state1, live1 = _nbjit_state(), _live_executables()
    # upstream in the same loop, as the like-for-like reference
    _create_and_drop(jax.jit, n)
    gc.collect()
    live_upstream = _live_executables()
    print(f"\n[memory] {n} jitted functions created, called, dropped: nbjit caches "
          f"{state0} -> {state1} (entries, namespaces: default, explicit); live executables "
          f"{live0} -> {live1} (nbjit), -> {live_upstream} (jax.jit loop)")
    assert state1 == state0, "cache entries or namespaces left behind"
    assert live1 == live0, "executables left behind"
    assert live_upstream == live0


def test_dropped_functions_leave_no_entries_or_executables():
    _check_create_and_drop(200)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 2 x 10,000 compiles, ~30 ms each here
def test_ten_thousand_dropped_functions_leave_nothing():
    _check_create_and_drop(10_000)


def test_entries_die_with_the_function_not_the_jit_object():
    """As upstream: the cache is keyed by the Python function (held weakly)."""

    def f(x):
        return x * 2

    for jit in (jax.jit, nbjit.jit):
        jitted = jit(f)
        jitted(jnp.ones(2))
        del jitted
        gc.collect()
        again = jit(f)
        assert again._cache_size() == 1, jit  # a new jit over f reuses the executable
    again = nbjit.jit(f)
    again(jnp.ones(2))
    assert again.miss_count == 0
    entries, namespaces = _totals()
    del f, again
    gc.collect()
    assert _totals() == (entries - 1, namespaces - 1)


def test_lru_eviction_bounds_a_private_cache():
    cache = nbjit.PjitFunctionCache(4)
    fa = nb_dispatch.PjitFunction(lambda x: x + 1, {}, cache=cache)
    fb = nb_dispatch.PjitFunction(lambda x: x - 1, {}, cache=cache)
    for n in range(1, 7):
        fa(jnp.ones(n))
        fb(jnp.ones(n))
        assert cache.size() == min(2 * n, 4)
    assert fa._cache_size() + fb._cache_size() == 4
    # the most recent signatures survived and are hits
    misses = fa.miss_count
    np.testing.assert_array_equal(np.asarray(fa(jnp.ones(6))), np.full(6, 2.0))
    assert fa.miss_count == misses
    cache.clear()
    assert cache.size() == 0 and fa._cache_size() == 0 and fb._cache_size() == 0


def test_a_function_dying_while_its_cache_is_listed():
    """A collection inside `namespaces_of` (the first miss's explanation lists a
    function's namespaces) runs a dead function's `_forget`, which the cache's
    RLock lets in: the listing must not see its dict change size."""
    from nbjit.core.cache import PjitFunctionCache

    cache = PjitFunctionCache(16)

    def kept(x):
        return x

    def dying(x):
        return x

    for i in range(4):
        cache.namespace_for(kept, ("kept", i))
    doomed = cache.namespace_for(dying, "dying")
    listed = cache.namespaces_of(kept)
    assert len(listed) == 4
    namespace = listed[0][1]
    real_ref = namespace.fun_ref

    def collect_meanwhile():  # what a weakref callback does during a collection
        cache._forget((id(dying), "dying"), doomed)
        return real_ref()

    namespace.fun_ref = collect_meanwhile
    try:
        assert [key for key, _ in cache.namespaces_of(kept)] == [("kept", i) for i in range(4)]
    finally:
        namespace.fun_ref = real_ref
    assert cache.namespaces_of(dying) == []
