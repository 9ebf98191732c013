"""`jax._src.config.jax_jit_cpp_cache_obj(cache)`: functions created inside use that cache.

Mirrors JAX's tests/pjit_test.py `test_jit_cpp_cache_obj_config`: capacity 4,
five signatures twice, every call a miss (the LRU evicts each before its turn).
"""

import gc

import jax
import numpy as np
import pytest
from _jax_events import count_events
from jax._src import config as jax_config
from jax._src.pjit import make_jit_cpp_cache

import nbjit
from nbjit.core import cache as _cache
from nbjit.core import dispatch as dispatch

JITS = pytest.mark.parametrize("jit", [jax.jit, nbjit.jit], ids=["jax", "nbjit"])


@JITS
def test_function_created_under_the_config_uses_its_cache(jit):
    cpp_cache = make_jit_cpp_cache(4)
    with jax_config.jax_jit_cpp_cache_obj(cpp_cache):
        @jit
        def f(x):
            return x * 2

    with count_events() as events:
        for _ in range(2):
            for i in range(5):
                np.testing.assert_array_equal(f(np.arange(i)), np.arange(i) * 2)
    assert events["jit_cpp_cache_miss"] == 10
    assert f._cache_size() == 4
    if jit is nbjit.jit:
        assert f.miss_count == 10
        assert f._cache.capacity() == 4
        assert f._cache is not dispatch._default_cache


@JITS
def test_functions_under_one_config_cache_share_its_capacity(jit):
    cpp_cache = make_jit_cpp_cache(2)
    with jax_config.jax_jit_cpp_cache_obj(cpp_cache):
        f = jit(lambda x: x + 1)
        g = jit(lambda x: x - 1)
    x = np.arange(3)
    with count_events() as events:
        f(x), g(x), f(x + 0.5)  # three entries in a cache of two: f's first is evicted
        f(x)
    assert events["jit_cpp_cache_miss"] == 4
    with count_events() as events:
        f(x + 0.5), f(x)  # the two held now
    assert events["jit_cpp_cache_miss"] == 0
    with count_events() as events:
        g(x)  # evicted by f(x)
    assert events["jit_cpp_cache_miss"] == 1


@JITS
def test_outside_the_config_the_global_cache(jit):
    cpp_cache = make_jit_cpp_cache(1)
    with jax_config.jax_jit_cpp_cache_obj(cpp_cache):
        pass
    f = jit(lambda x: x * 3)
    with count_events() as events:
        for _ in range(2):
            for i in range(3):
                f(np.arange(i))
    assert events["jit_cpp_cache_miss"] == 3


def test_one_twin_per_jaxlib_cache_and_it_is_released():
    cpp_cache = make_jit_cpp_cache(3)
    with jax_config.jax_jit_cpp_cache_obj(cpp_cache):
        f = nbjit.jit(lambda x: x)
        g = nbjit.jit(lambda x: -x)
    assert f._cache is g._cache
    key = id(cpp_cache)
    assert _cache._config_caches[key][0] is cpp_cache
    del f, g
    gc.collect()
    assert key not in _cache._config_caches
