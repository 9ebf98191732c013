"""A failed first compile (Ctrl-C in a notebook, a flaky trace, an overflowing
Python int, NaN checks) does not cost the signature its fast path.

jaxlib keeps such a signature on its Python path for the rest of the process
(pjit.cc: `fall_back_to_python`); nbjit caches nothing for a failed compile,
so the next successful call of the signature compiles, and the one after it is
a hit on nbjit's own path. Each case is checked against jax.jit's results.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs

import nbjit


class _FailsOnce:
    """A traced function that raises `error` the first time it is traced."""

    def __init__(self, error: BaseException, gate: threading.Event | None = None) -> None:
        self.error = error
        self.gate = gate
        self.traces = 0

    def __call__(self, x):
        self.traces += 1
        if self.traces == 1:
            if self.gate is not None:
                self.gate.wait(10)
            raise self.error
        return jnp.sin(x) * 2


def _assert_fast_after_failure(f, expected_error, args, jax_fn):
    with pytest.raises(expected_error):
        f(*args)
    assert f._cache_size() == 1  # the signature's node, as jaxlib's entry (it compiles again)
    interrupted = not issubclass(expected_error, Exception)  # Ctrl-C: slow; an error: raised
    s = f.stats()
    assert (s.slow_reasons, s.raised) == (({"compile_failed": 1}, 0) if interrupted
                                          else ({}, 1))
    out = f(*args)  # compiles now
    assert (f.stats().misses, f._cache_size()) == (1, 1)
    again = f(*args)  # a hit on nbjit's own path
    s = f.stats()
    assert (s.hits, s.misses, s.slow + s.raised) == (1, 1, 1)
    reference = jax_fn(*args)
    assert_same_outputs(out, reference)
    assert_same_outputs(again, reference)


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError], ids=["ctrl_c", "flaky"])
def test_first_trace_interrupted_then_fast_path(error):
    f, g = nbjit.jit(_FailsOnce(error("first trace"))), jax.jit(_FailsOnce(error("first trace")))
    with pytest.raises(error):
        g(jnp.arange(4.0))
    assert g._cache_size() == 1  # upstream keeps the signature, on its Python path for good
    _assert_fast_after_failure(f, error, (jnp.arange(4.0),), g)


def test_overflowing_python_int_then_fast_path():
    """2**70 does not fit int32/int64: JAX raises OverflowError on the miss; the
    same signature (a weak Python int) with a value that fits then compiles once."""
    def add(x, n):
        return x + n

    f, g = nbjit.jit(add), jax.jit(add)
    x = jnp.arange(3)
    with pytest.raises(OverflowError):
        g(x, 2**70)
    with pytest.raises(OverflowError):
        f(x, 2**70)
    assert (f.stats().raised, f.stats().slow) == (1, 0)  # jax.jit's error for the argument
    out = f(x, 5)
    again = f(x, 6)
    s = f.stats()
    assert (s.hits, s.misses, f._cache_size()) == (1, 1, 1)
    assert_same_outputs(out, g(x, 5))
    assert_same_outputs(again, g(x, 6))


def test_trace_error_while_another_thread_waits():
    """The owner's trace fails while a second thread waits for the same compile:
    the owner raises, the waiter takes JAX's own path (as jaxlib's waiters do),
    and afterwards the signature compiles and hits."""
    gate = threading.Event()
    fun = _FailsOnce(RuntimeError("owner's trace"), gate)
    f = nbjit.jit(fun)
    x = jnp.arange(4.0)
    results: dict[str, object] = {}

    def call(name: str) -> None:
        try:
            results[name] = f(x)
        except RuntimeError as error:
            results[name] = error

    owner = threading.Thread(target=call, args=("owner",))
    owner.start()
    while fun.traces == 0:  # the owner is tracing (and holds the compile)
        threading.Event().wait(0.001)
    waiter = threading.Thread(target=call, args=("waiter",))
    waiter.start()
    threading.Event().wait(0.05)  # let the waiter block on the pending compile
    gate.set()
    owner.join(10)
    waiter.join(10)
    assert isinstance(results["owner"], RuntimeError)
    reference = jax.jit(lambda x: jnp.sin(x) * 2)(x)
    assert_same_outputs(results["waiter"], reference)
    out, again = f(x), f(x)
    assert_same_outputs(out, reference)
    assert_same_outputs(again, reference)
    s = f.stats()
    assert (s.misses, f._cache_size()) == (1, 1) and s.hits >= 1


def test_debug_nans_then_fast_path_once_it_is_off():
    """Under jax_debug_nans a NaN output raises FloatingPointError (the failed
    call caches nothing) and a good call compiles; once NaN checks are off the
    signature hits on nbjit's own path."""
    def log(x):
        return jnp.log(x)

    f, g = nbjit.jit(log), jax.jit(log)
    bad, good = np.array([-1.0, 1.0], np.float32), np.array([2.0, 3.0], np.float32)
    with jax.debug_nans(True):
        with pytest.raises(FloatingPointError):
            g(bad)
        with pytest.raises(FloatingPointError):
            f(bad)
        assert_same_outputs(f(good), g(good))
    before = f.stats()
    assert before.misses == 1 and before.raised == 1  # the NaN check raised in the miss
    out, again = f(good), f(good)
    after = f.stats()
    assert (after.hits - before.hits, after.misses, f._cache_size()) == (2, 1, 1)
    assert_same_outputs(out, g(good))
    assert_same_outputs(again, g(good))
