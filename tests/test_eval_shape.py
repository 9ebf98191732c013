"""eval_shape then trace on a jitted function trace its body once, as upstream.

Mirrors JAX's tests/pjit_test.py `test_eval_shape_jitted_fun_cache_hit`.
`jax.eval_shape(g, x)` special-cases jaxlib's PjitFunction by exact type and
calls `g.trace`; for any other callable, nbjit's included, it traces
`jax.jit(g)`: one more (cheap) trace of the wrapper, never of g's body. That
one difference is in tests/test_footguns.py.
"""

import jax
import jax.numpy as jnp
import pytest
from _jax_events import count_events

import nbjit

JITS = pytest.mark.parametrize("jit", [jax.jit, nbjit.jit], ids=["jax", "nbjit"])


def _make(jit):
    bodies = []

    @jit(inline=True)
    def g(x):
        bodies.append(1)
        return x * 2

    return g, bodies


@JITS
def test_jax_eval_shape_then_trace_runs_the_body_once(jit):
    g, bodies = _make(jit)
    inp = jnp.zeros([1, 1])
    out = jax.eval_shape(g, inp)
    assert out == jax.ShapeDtypeStruct((1, 1), jnp.float32)
    with count_events() as events:
        g.trace(inp)
    assert events["trace_to_jaxpr"] == 0  # the trace is JAX's cached one
    assert len(bodies) == 1


@JITS
def test_method_eval_shape_then_trace_counts_as_upstream(jit):
    """`g.eval_shape` + `g.trace`: as upstream's `jax.eval_shape(g)` + `g.trace`."""
    inp = jnp.zeros([1, 3] if jit is jax.jit else [1, 4])  # `* 2` not traced at it before
    g, bodies = _make(jit)
    with count_events() as events:
        g.eval_shape(inp)
        g.trace(inp)
    assert events["trace_to_jaxpr"] == 2  # one for g, one for `*`
    assert len(bodies) == 1


def test_trace_counts_equal_to_upstream():
    counts = {}
    for name, jit, shape in (("jax", jax.jit, (2, 5)), ("nbjit", nbjit.jit, (2, 6))):
        g, bodies = _make(jit)
        inp = jnp.zeros(shape)
        with count_events() as events:
            g.eval_shape(inp)
            g.trace(inp)
            g.eval_shape(inp)
            g.lower(inp)
        counts[name] = (events["trace_to_jaxpr"], len(bodies))
    assert counts["nbjit"] == counts["jax"]
