"""benchmarks/python_floor.py: every contender computes the call it times."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from _scripts import load_script

from nbjit import bench


def _load():
    return load_script("python_floor")


def test_every_contender_returns_x_plus_one():
    floor = _load()
    x = jnp.arange(8, dtype=jnp.float32)
    contenders = floor.contenders(x)
    names = [name for name, _ in contenders]
    assert names[:3] == ["jax.jit", "nbjit.jit", "nbjit binder"] and names[-1] == "floor"
    assert len([n for n in names if n.startswith("hand")]) == 1 + len(floor._WITHOUT)
    for name, run in contenders:
        out = run()
        assert out.dtype == jnp.float32, name
        np.testing.assert_array_equal(np.asarray(out), np.arange(1, 9, dtype=np.float32),
                                      err_msg=name)


def test_each_variant_removes_its_check():
    floor = _load()
    for old, _ in floor._WITHOUT.values():
        assert old in floor._EVERY_CHECK  # a renamed line would leave a variant unchanged


def test_every_host_contender_returns_a_plus_b():
    floor = _load()
    pool = bench.scenario("numpy_args_2_new_values").build().arg_pool
    contenders = floor.host_contenders(pool)
    names = [name for name, _ in contenders]
    assert names[:2] == ["jax.jit", "nbjit.jit"] and names[-1] == "floor: execute only"
    first = pool[0][0] + pool[0][1]
    for name, fn in contenders:
        for a, b in pool[:3]:
            out = fn(a, b)
            assert out.dtype == jnp.float32, name
            # execute only reuses the first pair's inputs: its floor has no puts
            expected = first if name == "floor: execute only" else a + b
            np.testing.assert_array_equal(np.asarray(out), expected, err_msg=name)
