"""nbjit.jit and jax.jit of one function, side by side (tests/test_jit*.py).

`both(fun)` makes the pair from a fresh copy of `fun` (jit caches are per
function, so counts start at zero); `check(fun, *args)` calls the pair and
asserts they agree and that nbjit compiled once.
"""

from __future__ import annotations

import types

import jax
from _diff import assert_same_call

import nbjit


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


def power(x, n, *, scale=1.0):
    return scale * x ** n
