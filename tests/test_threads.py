"""Threads: one compile per signature, right answers, no deadlock.

Every wait in this module has a timeout, so a deadlock fails the test instead
of wedging the run; no assertion is about how long anything took.
"""

from __future__ import annotations

import collections
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs
from _threads import JOIN_TIMEOUT, run_threads

import nbjit


def _double_plus_one(x):
    return x * 2 + 1


def _signature_mix() -> list:
    """Inputs of 8 distinct avals, each with one kind of input (so 8 signatures)."""
    dev3 = jax.devices()[min(3, len(jax.devices()) - 1)]  # (one device: committed to it)
    return [
        np.arange(1, dtype=np.float32),
        jnp.arange(1, dtype=np.int32),
        jax.device_put(jnp.arange(2, dtype=np.float32), dev3),  # committed
        np.arange(2, dtype=np.int32),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        jnp.arange(6, dtype=np.int32).reshape(2, 3),
        2.5,  # weak-typed scalar
        np.int32(7),
    ]


def _trace_key(x) -> tuple:
    return (x.shape, np.dtype(x.dtype), x.aval.weak_type)


def test_eight_threads_mixed_signatures_compile_once():
    traces = collections.Counter()

    def f(x):
        traces[_trace_key(x)] += 1  # runs once per trace
        return _double_plus_one(x)

    jitted = nbjit.jit(f)
    cases = _signature_mix()
    expected = [jax.jit(_double_plus_one)(x) for x in cases]
    calls_per_thread = 150

    def worker(i: int) -> None:
        rng = np.random.default_rng(i)
        order = [*range(len(cases)), *rng.integers(len(cases), size=calls_per_thread)]
        rng.shuffle(order)
        for k in order:
            assert_same_outputs(jitted(cases[k]), expected[k])

    errors = run_threads(worker, 8)
    assert not errors, errors[0]
    assert len(traces) == len(cases), traces
    assert set(traces.values()) == {1}, f"a signature traced more than once: {traces}"
    assert jitted.miss_count == len(cases)
    assert jitted._cache_size() == len(cases)
    assert jitted.slow_count == 0


def test_upstream_also_traces_once_per_signature():
    """The same workload through jax.jit, as the reference for the test above."""
    traces = collections.Counter()

    def f(x):
        traces[_trace_key(x)] += 1
        return _double_plus_one(x)

    jitted = jax.jit(f)
    cases = _signature_mix()

    def worker(i: int) -> None:
        for x in cases:
            jitted(x)

    assert not run_threads(worker, 8)
    assert set(traces.values()) == {1} and len(traces) == len(cases)
    assert jitted._cache_size() == len(cases)


def test_waiting_on_a_compile_does_not_block_other_signatures():
    started, release = threading.Event(), threading.Event()
    traces = collections.Counter()

    def f(x):
        traces[x.shape] += 1
        if x.shape == (1,):  # the slow compile: hold the trace until released
            started.set()
            assert release.wait(JOIN_TIMEOUT), "never released"
        return x + 1

    jitted = nbjit.jit(f)
    slow_results: list = []
    slow_threads = [
        threading.Thread(target=lambda: slow_results.append(jitted(np.zeros(1, np.float32))),
                         daemon=True)
        for _ in range(2)
    ]
    try:
        slow_threads[0].start()
        assert started.wait(JOIN_TIMEOUT)
        slow_threads[1].start()  # waits on the compile in flight
        # other signatures compile and run meanwhile, from this thread and others
        np.testing.assert_array_equal(np.asarray(jitted(np.zeros(2, np.float32))), [1, 1])
        other: list = []
        t = threading.Thread(target=lambda: other.append(jitted(np.zeros(3, np.float32))),
                             daemon=True)
        t.start()
        t.join(JOIN_TIMEOUT)
        assert not t.is_alive() and len(other) == 1
        assert not slow_results, "the blocked compile finished early"
    finally:
        release.set()
        for s in slow_threads:
            s.join(JOIN_TIMEOUT)
    assert not any(s.is_alive() for s in slow_threads)
    assert len(slow_results) == 2
    for out in slow_results:
        np.testing.assert_array_equal(np.asarray(out), [1.0])
    assert traces == {(1,): 1, (2,): 1, (3,): 1}
    assert jitted.miss_count == 3 and jitted._cache_size() == 3


def test_many_threads_wait_on_one_compile():
    """All threads race for one new signature: one trace, every result right."""
    traces = []

    def f(x, y):
        traces.append(1)
        return x @ y

    jitted = nbjit.jit(f)
    x = np.ones((4, 4), np.float32)
    results: list = []
    errors = run_threads(lambda i: results.append(jitted(x, x)), 8)
    assert not errors, errors
    assert len(traces) == 1 and jitted.miss_count == 1 and jitted._cache_size() == 1
    for out in results:
        np.testing.assert_array_equal(np.asarray(out), np.full((4, 4), 4.0, np.float32))


def _reentry_scenario(jit, in_eval_context: bool) -> list:
    """What a same-thread re-entry while compiling does: a list to compare."""
    calls = []

    def f(x):
        calls.append(1)
        if len(calls) < 3:  # re-enter with the same (concrete) signature, while tracing
            if in_eval_context:
                with jax.ensure_compile_time_eval():
                    g(np.ones(2, np.float32))
            else:
                g(np.ones(2, np.float32))
        return x * 3

    g = jit(f)
    story = []
    for _ in range(4):
        try:
            out = g(np.ones(2, np.float32))
            story.append(np.asarray(out).tolist())
        except RecursionError:
            story.append("RecursionError")
        story.append(len(calls))
    return story


@pytest.mark.parametrize("in_eval_context", [False, True])
def test_same_thread_reentry_while_compiling_raises_recursion_error(in_eval_context):
    story = _reentry_scenario(nbjit.jit, in_eval_context)
    assert story[0] == "RecursionError"
    assert story[-2] == [3.0, 3.0] and story[-1] == story[-3], "steady state: no retrace"
    assert story == _reentry_scenario(jax.jit, in_eval_context)


def test_reentry_with_another_signature_is_fine():
    """Re-entry is only an error for the signature being compiled."""
    calls = []

    def f(x):
        calls.append(x.shape)
        if x.shape == (2,):
            inner = g(np.ones(3, np.float32))  # a different signature, inside the trace
            return x * inner.sum()
        return x + 1

    g = nbjit.jit(f)
    ref = jax.jit(f)
    out = g(np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(out), [6, 6])
    np.testing.assert_array_equal(np.asarray(ref(np.ones(2, np.float32))), [6, 6])


def test_eviction_and_clearing_under_contention():
    """A cache too small for the signatures in use, cleared meanwhile: every
    result still right, nothing wedges, the cache stays within capacity."""
    cache = nbjit.PjitFunctionCache(3)
    jitted = nbjit.core.dispatch.PjitFunction(_double_plus_one, {}, cache=cache)
    cases = _signature_mix()
    expected = [jax.jit(_double_plus_one)(x) for x in cases]
    stop = threading.Event()

    def clearer() -> None:
        while not stop.is_set():
            jitted._clear_cache()
            stop.wait(0.001)

    def worker(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        for k in rng.integers(len(cases), size=120):
            assert_same_outputs(jitted(cases[k]), expected[k])
            assert cache.size() <= cache.capacity()

    clearing = threading.Thread(target=clearer, daemon=True)
    clearing.start()
    try:
        errors = run_threads(worker, 6)
    finally:
        stop.set()
        clearing.join(JOIN_TIMEOUT)
    assert not errors, errors[0]
    assert not clearing.is_alive()
    assert cache.size() <= 3 and jitted._cache_size() <= 3
    # and it settles: a repeated call is a hit
    jitted(cases[0])
    misses = jitted.miss_count
    assert_same_outputs(jitted(cases[0]), expected[0])
    assert jitted.miss_count == misses
