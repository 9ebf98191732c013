"""How every report names things: functions, processes, call sites, avals.

The module below every other report (stats, explain, profile, the run
report, multi-controller agreement): each names things through it, and it
imports nothing of nbjit's but `nbjit._jax`.

Functions: one name per Python function, the same everywhere.

`stats()`, `profile()`, explained misses, the run report and the
multi-controller agreement all name a function by `function_name`: its
qualified name and where it is defined, ``"mod.f (file.py:12)"``, plus
``#N`` for the N-th distinct function object created with that same
qualified name and definition site (lambdas on one line, closures made in a
loop). The ordinal counts in creation order, so every process that runs the
same program gives a function the same name; twins (two `jit` objects over
one function) share it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
import weakref
from typing import Any

import numpy as np

from nbjit import _jax

__all__ = ["aval_text", "call_site", "definition_site", "function_name", "name_like",
           "process_label", "qualified_name"]


def qualified_name(fun: Any) -> str:
    """``module.qualname`` (no module for ``__main__``), through functools.partial."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    module = getattr(fun, "__module__", None) or ""
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    return f"{module}.{name}" if module and module != "__main__" else name


def definition_site(fun: Any) -> str | None:
    """``"file.py:LINE"`` of the code that defines `fun` (the base name of its
    file), or None when it has no Python code (a builtin, a callable object)."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    fun = getattr(fun, "__func__", fun)  # a bound method
    code = getattr(fun, "__code__", None)
    if code is None and callable(fun):  # a callable object: its class's __call__
        code = getattr(type(fun).__call__, "__code__", None)
    if code is None:
        return None
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


_ordinals: dict[tuple[str, str | None], int] = {}  # (qualified name, site) -> functions seen
_assigned: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def function_name(fun: Any) -> str:
    """The name of `fun` in every report (see the module docstring); computed
    once per function object and kept while it lives."""
    try:
        name = _assigned.get(fun)
    except TypeError:  # not weak-referenceable or unhashable: named afresh each time
        name = None
    if name is not None:
        return name
    base, site = qualified_name(fun), definition_site(fun)
    with _lock:
        try:
            name = _assigned.get(fun)
        except TypeError:
            name = None
        if name is not None:
            return name
        n = _ordinals.get((base, site), 0) + 1
        _ordinals[(base, site)] = n
        name = base if site is None else f"{base} ({site})"
        if n > 1:
            name = f"{name}#{n}"
        try:
            _assigned[fun] = name
        except TypeError:
            pass
    return name


def name_like(fun: Any, like: Any) -> None:
    """Reports name `fun` as they name `like`: for a function made to run
    `like`'s calls (nbjit.filter_jit's inner function)."""
    name = function_name(like)
    with _lock:
        try:
            _assigned[fun] = name
        except TypeError:
            pass


def process_label() -> str | None:
    """"process I of N" in a multi-controller run (jax.distributed), else None."""
    if _jax.process_count() == 1 or _jax.distributed_client() is None:
        return None
    return f"process {_jax.process_index()} of {_jax.process_count()}"


_SITE_PACKAGES = os.path.dirname(os.path.dirname(_jax.jax.__file__))
_NOT_CALL_SITES = (_jax.NBJIT_DIR + os.sep,
                   os.path.join(_SITE_PACKAGES, "jax") + os.sep,
                   os.path.join(_SITE_PACKAGES, "jaxlib") + os.sep)


def call_site() -> str:
    """file:line of the first frame outside nbjit and jax."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_CALL_SITES):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    path = frame.f_code.co_filename
    try:  # relative when below the working directory, as pytest prints locations
        cwd: str | None = os.getcwd() + os.sep
    except OSError:  # the working directory was removed
        cwd = None
    if cwd is not None and path.startswith(cwd):
        path = path[len(cwd):]
    return f"{path}:{frame.f_lineno}"


def aval_text(leaf: Any, *, kind: bool = False, weak: bool = False) -> str:
    """``float32[2,3]`` of a described leaf (`nbjit.observe.explain.LeafDescription`),
    or its kind when it has no dtype. With `kind`, a leaf that is not a
    jax.Array is prefixed by its kind (``numpy float32[3]``); with `weak`, a
    weakly typed one ends in `` weak``."""
    if leaf.dtype is None:
        return leaf.kind
    shape = ",".join(str(d) for d in leaf.shape or ())
    text = f"{np.dtype(leaf.dtype).name}[{shape}]"
    if kind and leaf.kind != "jax.Array":
        text = f"{leaf.kind} {text}"
    return text + (" weak" if weak and leaf.weak_type else "")
