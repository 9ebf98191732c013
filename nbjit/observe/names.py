"""Names of jitted functions: one name per Python function, the same everywhere.

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
import threading
import weakref
from typing import Any

__all__ = ["definition_site", "function_name", "name_like", "qualified_name"]


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
