"""The jitted object as tools see it: repr and `__getstate__`, against jax.jit.

Mirrors JAX's tests/api_test.py `test_jit_repr`, `test_jit_repr_errors` and
`test_fun_name`, run on both jits.
"""

from functools import partial

import jax
import pytest

import nbjit

JITS = pytest.mark.parametrize("jit", [jax.jit, nbjit.jit], ids=["jax", "nbjit"])


def my_function():
    return


@JITS
def test_repr_is_upstreams_format(jit):
    assert repr(jit(my_function)) == f"<PjitFunction of {my_function!r}>"


def test_repr_equal_to_upstream():
    for fun in (my_function, partial(my_function), lambda: None, print):
        assert repr(nbjit.jit(fun)) == repr(jax.jit(fun))


class _BadRepr:
    def __call__(self):
        pass

    def __repr__(self):
        raise ValueError("invalid repr")


class _NotAStringRepr:
    def __call__(self):
        pass

    def __repr__(self):
        return 3


@JITS
def test_repr_errors_fall_back(jit):
    jitted = jit(_BadRepr())
    assert repr(jitted) == "<PjitFunction>"
    del jitted.__wrapped__  # a malformed object
    assert repr(jitted) == "<PjitFunction>"
    assert repr(jit(_NotAStringRepr())) == "<PjitFunction>"


def _named_partial():
    p = partial(my_function)
    p.__name__ = "my_partial"
    return p


CASES = {
    "function": lambda: my_function,
    "default_partial": lambda: partial(my_function),
    "nested_default_partial": lambda: partial(partial(my_function)),
    "named_partial": _named_partial,
    "lambda": lambda: (lambda: my_function()),
}


@pytest.mark.parametrize("case", CASES)
def test_getstate_function_name_as_upstream(case):
    fun = CASES[case]()
    want = {"function": "my_function", "default_partial": "my_function",
            "nested_default_partial": "my_function", "named_partial": "my_partial",
            "lambda": "<lambda>"}[case]
    assert jax.jit(fun).__getstate__()["function_name"] == want
    assert nbjit.jit(fun).__getstate__()["function_name"] == want
