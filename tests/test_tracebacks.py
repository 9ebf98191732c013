"""Tracebacks as clean as upstream's, in every JAX_TRACEBACK_FILTERING mode.

jaxlib's dispatch is C++, so an exception raised inside a `jax.jit` function
shows no dispatcher frames. nbjit's `__call__` filters its own frames where
an exception leaves it (never on a hit), and its `lower` / `trace` /
`eval_shape` are JAX api boundaries. Each case here raises under both jits
from the same caller and compares the frames shown: all of them in the
remove modes; those not marked ``__tracebackhide__`` in "tracebackhide" (the
frames IPython and pytest show).
"""

import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit

MODES = ["remove_frames", "quiet_remove_frames", "tracebackhide", "auto"]  # auto: the default


@pytest.fixture(params=MODES)
def mode(request):
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", request.param)
    yield "quiet_remove_frames" if request.param == "auto" else request.param  # not IPython
    jax.config.update("jax_traceback_filtering", before)


def body(x, n=1):
    raise ValueError("raised inside the jitted function")


def identity(y):
    return y


def first(y, n):
    return y


def _catch(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("no exception")


def _shown(error, mode):
    """(function, file) of each frame a user sees, innermost last."""
    frames = []
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if mode == "tracebackhide" and frame.f_locals.get("__tracebackhide__"):
            continue
        frames.append((frame.f_code.co_name, os.path.basename(frame.f_code.co_filename)))
    return frames


def _summary(error, mode):
    return (type(error), str(error), _shown(error, mode), type(error.__cause__),
            getattr(error, "__notes__", None))


CASES = {
    "positional arrays": lambda jit, x: (jit(body), (x,), {}),
    "keyword": lambda jit, x: (jit(body), (), {"x": x}),
    "static argument": lambda jit, x: (jit(body, static_argnames="n"), (x,), {"n": 3}),
    "python scalar": lambda jit, x: (jit(body), (1.0,), {}),
    "numpy": lambda jit, x: (jit(body), (np.ones(3),), {}),
    "lower": lambda jit, x: (jit(body).lower, (x,), {}),
    "trace": lambda jit, x: (jit(body).trace, (x,), {}),
    "eval_shape": lambda jit, x: (jit(body).eval_shape, (x,), {}),
    "jax.eval_shape": lambda jit, x: (jax.eval_shape, (jit(body), x), {}),
    "under grad": lambda jit, x: (jax.grad(jit(body)), (1.0,), {}),
    "inside jax.jit": lambda jit, x: (jax.jit(lambda y: jit(body)(y)), (x,), {}),
    "bad argument type": lambda jit, x: (jit(identity), ("a string",), {}),
    "unhashable static": lambda jit, x: (jit(first, static_argnums=1), (x, [1]), {}),
}


@pytest.mark.parametrize("case", CASES)
def test_frames_shown_as_under_jax_jit(mode, case):
    x = jnp.arange(3.0)
    got = {}
    for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit)):
        fn, args, kwargs = CASES[case](jit, x)
        got[name] = _summary(_catch(fn, *args, **kwargs), mode)
    assert got["nbjit"] == got["jax"]
    assert not any(file == "dispatch.py" for _, file in got["nbjit"][2])


def test_error_after_hits_shows_no_dispatcher_frames(mode):
    """A hit, then a call that raises on nbjit's slow path (a deleted input)."""
    got = {}
    for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit)):
        f = jit(identity)
        x = jnp.arange(4.0)
        f(x), f(x)
        x.delete()
        got[name] = _summary(_catch(f, x), mode)
    assert got["nbjit"] == got["jax"]


def test_off_mode_keeps_every_frame():
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        error = _catch(nbjit.jit(body), jnp.arange(2.0))
    finally:
        jax.config.update("jax_traceback_filtering", before)
    files = [os.path.basename(f.filename) for f in traceback.extract_tb(error.__traceback__)]
    assert "dispatch.py" in files and "pjit.py" in files


def test_hits_pay_nothing_for_filtering():
    """The filter runs only when an exception leaves __call__."""
    calls = []
    real = nbjit._jax.filter_dispatch_frames
    nbjit._jax.filter_dispatch_frames = lambda e: calls.append(e)
    try:
        f = nbjit.jit(lambda y: y + 1)
        x = jnp.arange(3.0)
        for _ in range(5):
            f(x)
        assert calls == []
        _catch(f, "a string")
        assert len(calls) == 1
    finally:
        nbjit._jax.filter_dispatch_frames = real


CONSTRUCTION_ERRORS = {
    "static_argnums out of range": {"static_argnums": 2},
    "static_argnums not an int": {"static_argnums": "x"},
}


@pytest.mark.parametrize("options", CONSTRUCTION_ERRORS.values(), ids=CONSTRUCTION_ERRORS)
def test_construction_errors_show_no_nbjit_frames(mode, options):
    """`nbjit.jit(f, static_argnums=2)` raises as jax.jit does, from the caller's
    line, with no frame of nbjit's (`jit`, `PjitFunction.__init__`), also as
    a decorator factory (where jax.jit shows frames of its own)."""
    got = {name: _summary(_catch(jit, first, **options), mode)
           for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit))}
    assert got["nbjit"] == got["jax"]
    assert got["nbjit"][2] == [("_catch", "test_tracebacks.py")]
    factory = _summary(_catch(lambda: nbjit.jit(**options)(first)), mode)
    assert factory[0] is got["jax"][0] and factory[1] == got["jax"][1]
    assert not any(file == "dispatch.py" for _, file in factory[2]), factory[2]
