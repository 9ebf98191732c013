"""`jax.clear_caches()` clears nbjit's dispatch caches too, as it clears jaxlib's.

Mirrors JAX's tests/api_test.py `test_clear_cache`: after it, the next call
traces and compiles again.
"""

import jax
import jax.numpy as jnp
import pytest
from _jax_events import count_events

import nbjit

JITS = pytest.mark.parametrize("jit", [jax.jit, nbjit.jit], ids=["jax", "nbjit"])


@JITS
def test_next_call_traces_again(jit):
    @jit
    def add(x):
        return x * 2

    inp = jnp.arange(8)
    add(inp)
    with count_events() as events:
        add(inp)
    assert events["jit_cpp_cache_miss"] == 0
    jax.clear_caches()
    assert add._cache_size() == 0
    with count_events() as events:
        add(inp)
    assert events["jit_cpp_cache_miss"] == 1
    assert events["trace_to_jaxpr"] >= 1


def test_every_nbjit_cache_is_cleared():
    own = nbjit.PjitFunctionCache(16)
    f = nbjit.PjitFunction(lambda x: x + 1, {}, cache=own)
    g = nbjit.jit(lambda x: x - 1, donate_argnums=())
    x = jnp.arange(3)
    f(x), g(x)
    assert own.size() == 1 and g._cache_size() == 1
    jax.clear_caches()
    assert own.size() == 0 and g._cache_size() == 0
    f(x)
    assert f.miss_count == 2
