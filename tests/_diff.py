"""Differential helpers: does nbjit.jit give what jax.jit gives?

The API is small and stable (other test modules import it):

* `assert_same_outputs(nb_out, jax_out)`: same pytree structure, and leaf
  by leaf the same type, value (exact, NaN-aware), dtype, shape, weak type,
  sharding and committedness.
* `assert_same_exception(fn_nb, fn_jax, *args, **kwargs)`: both calls raise
  exceptions of exactly the same type, chained alike (`chain_of`), nbjit's
  with no frame of nbjit's (`nbjit_frames`); returns both exceptions.
* `assert_same_call(fn_nb, fn_jax, *args, **kwargs)`: both calls raise as
  `assert_same_exception` asserts, or both return and the outputs agree;
  returns the pair ``(nb_result, jax_result)`` (exceptions in place of results).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import traceback
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

# nbjit's directory, found without importing it (a worker may import it later)
_NBJIT_DIR = os.path.dirname(os.path.abspath(importlib.util.find_spec("nbjit").origin)) + os.sep


def _leaf_values(x: Any) -> np.ndarray:
    """The host values of a leaf; PRNG key arrays give their key data."""
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def _attr(x: jax.Array, name: str) -> Any:
    return getattr(x, name) if hasattr(x, name) else getattr(x._base_array, name)


def _assert_same_leaf(path: str, a: Any, b: Any) -> None:
    assert type(a) is type(b), f"{path}: type {type(a)!r} != {type(b)!r}"
    if not isinstance(b, jax.Array | np.ndarray | np.generic | bool | int | float | complex):
        assert a == b, f"{path}: {a!r} != {b!r}"
        return
    if isinstance(b, jax.Array):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        for name in ("weak_type", "sharding", "_committed"):  # key arrays: on the base array
            va, vb = _attr(a, name), _attr(b, name)
            assert va == vb, f"{path}: {name.lstrip('_')} {va} != {vb}"
        if a.is_deleted() or b.is_deleted():
            assert a.is_deleted() == b.is_deleted(), f"{path}: only one output deleted"
            return
    elif isinstance(b, np.ndarray | np.generic):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert np.shape(a) == np.shape(b), f"{path}: shape {np.shape(a)} != {np.shape(b)}"
    va, vb = _leaf_values(a), _leaf_values(b)
    if va.dtype.kind == "V":  # float0 & co: nothing to compare but dtype and shape
        assert va.dtype == vb.dtype and va.shape == vb.shape, path
        return
    np.testing.assert_array_equal(va, vb, err_msg=path, strict=True)


def assert_same_outputs(nb_out: Any, jax_out: Any,
                        same_leaf: Callable[[str, Any, Any], None] | None = None) -> None:
    """Asserts two pytrees of outputs are indistinguishable, leaf by leaf.

    `same_leaf(path, a, b)` compares one leaf pair (default: every field of
    two fully addressable leaves; the multi-process worker passes its own).
    """
    same_leaf = same_leaf or _assert_same_leaf
    nb_paths, nb_tree = jax.tree_util.tree_flatten_with_path(nb_out)
    jax_paths, jax_tree = jax.tree_util.tree_flatten_with_path(jax_out)
    assert nb_tree == jax_tree, f"output structure {nb_tree} != {jax_tree}"
    for (path, a), (_, b) in zip(nb_paths, jax_paths, strict=True):
        same_leaf(jax.tree_util.keystr(path) or "<root>", a, b)


def outcome(fn: Callable, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    try:
        return True, fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (the exception is the outcome)
        return False, e


def chain_of(error: BaseException | None, seen: frozenset = frozenset()) -> Any:
    """The shape of an exception's chain: its type, ``__suppress_context__``,
    and the same of its ``__cause__`` and ``__context__``, recursively (what
    decides the "The above exception was the direct cause" and "During
    handling of the above exception" parts of a printed traceback)."""
    if error is None:
        return None
    if id(error) in seen:
        return "<cycle>"
    seen = seen | {id(error)}
    return (type(error).__name__, error.__suppress_context__,
            chain_of(error.__cause__, seen), chain_of(error.__context__, seen))


def nbjit_frames(error: BaseException) -> list[str]:
    """Frames of nbjit's (its modules, its generated code) in the tracebacks of
    `error` and of every exception chained to it, as ``file:function``;
    frames marked ``__tracebackhide__`` (JAX's "tracebackhide" mode: IPython
    and pytest hide them) are not shown, so not counted."""
    found, pending, seen = [], [error], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        for frame, _ in traceback.walk_tb(e.__traceback__):
            code = frame.f_code
            if code.co_filename.startswith(_NBJIT_DIR) and not frame.f_locals.get(
                    "__tracebackhide__"):
                found.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
        pending += [e.__cause__, e.__context__]
    return found


def _assert_same_raise(nb: BaseException, jx: BaseException) -> None:
    """Same type, chained alike, and (unless JAX shows every frame) no nbjit frame."""
    assert type(nb) is type(jx), (
        f"nbjit raised {type(nb).__name__}: {nb}\njax.jit raised {type(jx).__name__}: {jx}")
    assert chain_of(nb) == chain_of(jx), (
        f"chained differently:\nnbjit:\n{''.join(traceback.format_exception(nb))}"
        f"\njax.jit:\n{''.join(traceback.format_exception(jx))}")
    if jax.config.jax_traceback_filtering != "off":
        assert not nbjit_frames(nb), (
            f"nbjit frames {nbjit_frames(nb)}:\n{''.join(traceback.format_exception(nb))}")


def assert_same_exception(fn_nb: Callable, fn_jax: Callable, /, *args: Any,
                          **kwargs: Any) -> tuple[BaseException, BaseException]:
    """Asserts both calls raise exactly the same exception type, chained alike,
    nbjit's with no frame of its own; returns both."""
    nb_ok, nb = outcome(fn_nb, args, kwargs)
    jax_ok, jx = outcome(fn_jax, args, kwargs)
    assert not jax_ok, f"jax.jit did not raise (returned {jx!r})"
    assert not nb_ok, f"nbjit did not raise; jax.jit raised {type(jx).__name__}: {jx}"
    _assert_same_raise(nb, jx)
    return nb, jx


def assert_same_call(fn_nb: Callable, fn_jax: Callable, /, *args: Any,
                     **kwargs: Any) -> tuple[Any, Any]:
    """Both raise the same exception type, or both return the same outputs."""
    nb_ok, nb = outcome(fn_nb, args, kwargs)
    jax_ok, jx = outcome(fn_jax, args, kwargs)
    if not jax_ok:
        assert not nb_ok, (
            f"nbjit returned; jax.jit raised {type(jx).__name__}: {jx}")
        _assert_same_raise(nb, jx)
    else:
        assert nb_ok, (f"nbjit raised {type(nb).__name__}: {nb}; jax.jit returned\n"
                       + "".join(traceback.format_exception(nb)))
        assert_same_outputs(nb, jx)
    return nb, jx


def steps_of(jitted: Any, /, *args: Any, **kwargs: Any) -> dict[str, list]:
    """The input steps of the fast-path record a call hits, by step class name."""
    node, _ = jitted._entry_for(args, kwargs)
    assert node is not None and node.record is not None, "the call has no fast-path record"
    steps: dict[str, list] = {"HostInput": [], "_Copy": [], "_Planned": [], "ShardArgs": []}
    for step in node.record.step_objects():
        steps[type(step).__name__].append(step)
    return steps


def counted(fn: Callable) -> tuple[Callable, list]:
    """(fn wrapped to count its traces, the counter list): a list that grows by
    one each time the function runs in Python (once per trace under a jit)."""
    traces: list = []

    @functools.wraps(fn)
    def counting(*args: Any, **kwargs: Any) -> Any:
        traces.append(1)
        return fn(*args, **kwargs)

    return counting, traces
