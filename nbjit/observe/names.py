"""How every report names things: functions, processes, call sites, avals,
and the nodes where two pytree structures part (`node_differences`).

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

import dataclasses
import functools
import os
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
from jax import tree_util

from nbjit import _jax

__all__ = ["STATEMENT_MAX", "aval_text", "call_site", "defined_in_library", "definition_site",
           "fit_statement", "function_name", "location_name", "name_like", "node_differences",
           "process_label",
           "qualified_name", "structure_difference", "structure_differences", "value_text"]


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
    code = _code_of(fun)
    if code is None:
        return None
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _code_of(fun: Any) -> types.CodeType | None:
    """The code object that defines `fun` (through partials, bound methods and
    a callable object's ``__call__``), or None."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    fun = getattr(fun, "__func__", fun)  # a bound method
    code = getattr(fun, "__code__", None)
    if code is None and callable(fun):  # a callable object: its class's __call__
        code = getattr(type(fun).__call__, "__code__", None)
    return code


def defined_in_library(fun: Any) -> bool:
    """Whether `fun` is an installed library's code (site-packages, or the
    standard library), not the user's own: the run report lists library
    functions that only ran inside the user's traces apart."""
    code = _code_of(fun)
    if code is None:
        return False
    path = os.path.abspath(code.co_filename)
    parts = path.split(os.sep)
    return ("site-packages" in parts or "dist-packages" in parts
            or path.startswith(_library_dirs()))


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives: the standard library and site-packages."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.abspath(p) + os.sep for p in found)


_ordinals: dict[tuple[str, str | None], int] = {}  # (qualified name, site) -> functions seen
_assigned: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_located: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # (`name_like`)
# (qualified name, site) -> distinct code objects defined there (equal code: one key) -> N
_code_ordinals: dict[tuple[str, str | None], dict[types.CodeType, int]] = {}
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


def location_name(fun: Any) -> str:
    """The name of the code that defines `fun`: `function_name`, but with ``#N``
    counting distinct code (by equality) rather than function objects, so
    every function object made by equal code has it (a notebook cell run
    again, closures made in a loop), while two different lambdas on one line
    keep apart. `ranked_misses` groups by it."""
    try:
        found = _located.get(fun)
    except TypeError:  # not weak-referenceable or unhashable
        found = None
    if found is not None:
        return found
    base, site = qualified_name(fun), definition_site(fun)
    name = base if site is None else f"{base} ({site})"
    code = _code_of(fun)
    if code is None:
        return name
    with _lock:
        codes = _code_ordinals.setdefault((base, site), {})
        n = codes.setdefault(code, len(codes) + 1)
    return name if n == 1 else f"{name}#{n}"


def name_like(fun: Any, like: Any) -> None:
    """Reports name `fun` as they name `like`: for a function made to run
    `like`'s calls (nbjit.filter_jit's inner function)."""
    name, location = function_name(like), location_name(like)
    with _lock:
        try:
            _assigned[fun] = name
            _located[fun] = location
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
    """``float32[2,3]`` of a described leaf (`nbjit.observe.descriptions.LeafDescription`),
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


# ---------------------------------------------------------------------------
# Pytree structures: the nodes where two treedefs part, by their paths

STATEMENT_MAX = 120  # characters of one structural difference: never a treedef dump


_LEAF_TREEDEF = tree_util.tree_structure(0)


def structure_differences(old: Any, new: Any) -> list[tuple[str, str]]:
    """(field, statement) of every node where the structures of two call
    descriptions' pytree arguments part (`nbjit.observe.descriptions.CallDescription`),
    in tree order, by its path (`node_differences`)."""
    old_text, new_text = dict(old.structure), dict(new.structure)
    old_defs, new_defs = dict(old.treedefs), dict(new.treedefs)
    out = []
    for path in dict.fromkeys([*old_text, *new_text]):
        if old_text.get(path) == new_text.get(path) or not (
                _has_argument(old, path) and _has_argument(new, path)):
            continue  # the same, or the argument count or keyword names differ (named there)
        a = old_defs.get(path, _LEAF_TREEDEF if path not in old_text else None)
        b = new_defs.get(path, _LEAF_TREEDEF if path not in new_text else None)
        found: list[tuple[str, str]] = []
        if a is not None and b is not None:
            try:
                found = list(node_differences(path, a, b, _LeafNames(old), _LeafNames(new)))
            except Exception:  # an odd node (its data raised on ==): the coarse statement
                found = []
        where = f"{path}: pytree structure"
        out += found or [(where, fit_statement(where, old_text.get(path, "(a leaf)"),
                                               new_text.get(path, "(a leaf)")))]
    return out


def _has_argument(description: Any, path: str) -> bool:
    """Whether the call of `description` passed the argument at `path`."""
    return path in description.arguments


class _LeafNames:
    """What a call's leaf at a path was, for a statement (``float32[2]``)."""

    def __init__(self, description: Any) -> None:
        self._description = description

    def __call__(self, path: str) -> str:
        for leaf in self._description.leaves:
            if leaf.path == path:
                return aval_text(leaf)
        for static_path, _, value in self._description.statics:  # filter_jit: non-arrays
            if static_path == path:
                return value_text(value)
        return "a leaf"


def structure_difference(path: str, old: Any, new: Any, old_leaf: Any, new_leaf: Any
                         ) -> tuple[str, str] | None:
    """(field, statement) of the first node where treedefs `old` and `new` differ
    (None: they do not); `node_differences` names every one."""
    return next(node_differences(path, old, new, old_leaf, new_leaf), None)


def node_differences(path: str, old: Any, new: Any, old_leaf: Any, new_leaf: Any
                     ) -> Iterator[tuple[str, str]]:
    """(field, statement) of every node where treedefs `old` and `new` differ, in
    tree order, walking both node by node. `old_leaf(path)` and
    `new_leaf(path)` name a leaf of each call (its aval).

    Below a node of another type, or a container whose keys or length
    changed, the children do not line up: that node is one difference. A
    custom node's changed static fields are one difference each, and its
    children are walked on."""
    old_data, new_data = old.node_data(), new.node_data()
    if old_data is None and new_data is None:
        return  # two leaves: their avals are the leaves' fields
    if old_data is None or new_data is None or old_data[0] is not new_data[0]:
        old_type = None if old_data is None else old_data[0]
        new_type = None if new_data is None else new_data[0]
        if _is_namedtuple(old_type) and _is_namedtuple(new_type):
            yield (f"{path}: namedtuple type", fit_statement(f"{path}", _type_name(old_type),
                                                    _type_name(new_type), " (namedtuple)"))
            return
        yield (f"{path}: structure", fit_statement(
            path, old_leaf(path) if old_data is None else _node_text(old),
            new_leaf(path) if new_data is None else _node_text(new)))
        return
    kind, old_aux = old_data
    new_aux = new_data[1]
    old_children, new_children = old.children(), new.children()
    if kind is dict and old_aux != new_aux:  # JAX sorts a dict's keys: some changed
        added = [k for k in new_aux if k not in old_aux]
        removed = [k for k in old_aux if k not in new_aux]
        key, what = (added[0], "added") if added else (removed[0], "removed")
        more = len(added) + len(removed) - 1
        yield (f"{path}[{key!r}]: {what}", _cap(
            f"{path}[{key!r}]: {what}" + (f" (and {more} more keys changed)" if more else "")))
        return
    if kind in (list, tuple) and len(old_children) != len(new_children):
        yield (f"{path}: {kind.__name__} length",
               f"{path}: {kind.__name__} of {len(old_children)} -> {len(new_children)}")
        return
    if kind not in (dict, list, tuple, type(None)) and not _is_namedtuple(kind):
        if not _equal(old_aux, new_aux):
            yield from _aux_differences(path, kind, old_aux, new_aux, new)
        if len(old_children) != len(new_children):
            yield (f"{path}: children", f"{path}: {_type_name(kind)} with "
                   f"{len(old_children)} -> {len(new_children)} children")
            return
    keys = _child_keys(new, kind, new_aux, len(new_children))
    for key, a, b in zip(keys, old_children, new_children, strict=True):
        yield from node_differences(path + key, a, b, old_leaf, new_leaf)


def _is_namedtuple(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


def _type_name(kind: Any) -> str:
    return getattr(kind, "__qualname__", None) or getattr(kind, "__name__", None) or repr(kind)


def _node_text(treedef: Any) -> str:
    """``None``, ``list of 3``, ``dict of 2``, ``P (namedtuple)``, ``Net``."""
    kind = treedef.node_data()[0]
    if kind is type(None):
        return "None"
    if kind in (list, tuple, dict):
        return f"{kind.__name__} of {len(treedef.children())}"
    if _is_namedtuple(kind):
        return f"{_type_name(kind)} (namedtuple)"
    return _type_name(kind)


def _child_keys(treedef: Any, kind: Any, aux: Any, n: int) -> list[str]:
    """The path suffix of each child of the node heading `treedef`: ``['k']``,
    ``[0]``, ``.field``; a custom node's from its own flatten-with-keys (the
    node rebuilt from placeholder leaves), else ``.<child i>``."""
    if kind is dict:
        return [f"[{key!r}]" for key in aux]
    if _is_namedtuple(kind):
        return [f".{name}" for name in kind._fields]
    if kind in (list, tuple):
        return [f"[{i}]" for i in range(n)]
    try:
        node = tree_util.tree_unflatten(treedef, [0] * treedef.num_leaves)
        pairs, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        keys = [tree_util.keystr(key_path) for key_path, _ in pairs]
        if len(keys) == n:
            return keys
    except Exception:  # the node's unflatten wants real leaves: positions instead
        pass
    return [f".<child {i}>" for i in range(n)]


def _static_field_names(treedef: Any, kind: Any, aux: Any) -> tuple[list[str], int] | None:
    """(names, offset): the dataclass fields that `aux[offset:]` holds, in order
    (equinox Modules, flax structs, `jax.tree_util.register_dataclass`), or
    None when `kind` is no dataclass or its aux data is not their values.

    equinox marks them ``static``, flax ``pytree_node=False``; otherwise they
    are the fields that are not children. equinox's aux data starts with one
    slot of its own (a wrapped function's attributes): offset 1.
    """
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)
            and isinstance(aux, tuple)):
        return None
    equinox = sys.modules.get("equinox")
    offset = int(equinox is not None and issubclass(kind, equinox.Module))
    fields = dataclasses.fields(kind)
    names = [f.name for f in fields
             if f.metadata.get("static") or f.metadata.get("pytree_node", True) is False]
    if len(names) + offset != len(aux):  # no marks (register_dataclass): not children
        children = {key[1:] for key in _child_keys(treedef, kind, aux, len(treedef.children()))}
        names = [f.name for f in fields if f.name not in children]
    return (names, offset) if len(names) + offset == len(aux) else None


def _aux_differences(path: str, kind: Any, old: Any, new: Any, treedef: Any
                     ) -> Iterator[tuple[str, str]]:
    """A custom node whose aux data differs: each static field that changed
    (dataclass-like nodes), else the shortest part of the aux data that did."""
    fields = _static_field_names(treedef, kind, new)
    if fields is not None and isinstance(old, tuple) and len(old) == len(new):
        names, offset = fields
        changed = [i for i in range(len(new)) if not _equal(old[i], new[i])]
        for i in changed:
            if i < offset:
                where = f"{path} ({_type_name(kind)}'s wrapped-function fields)"
            else:
                where = f"{path}.{names[i - offset]} (static field)"
            yield where, fit_statement(where, value_text(old[i]), value_text(new[i]))
        if changed:
            return
    where = f"{path} ({_type_name(kind)} aux data"
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        key = next(k for k in new if not _equal(old[k], new[k]))
        where += f"[{key!r}]"
        old, new = old[key], new[key]
    elif isinstance(old, tuple | list) and type(old) is type(new) and len(old) == len(new):
        i = next(i for i in range(len(new)) if not _equal(old[i], new[i]))
        where += f"[{i}]"
        old, new = old[i], new[i]
    where += ")"
    yield where, fit_statement(where, value_text(old), value_text(new))


def value_text(value: Any) -> str:
    """A static value in a statement: functions and classes by name (no address)."""
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")
                                   and not hasattr(type(value), "__dataclass_fields__")):
        kind = "class" if isinstance(value, type) else "function"
        return f"<{kind} {value.__qualname__}>"
    return repr(value)


def _cap(text: str) -> str:
    return text if len(text) <= STATEMENT_MAX else text[:STATEMENT_MAX - 3] + "..."


def fit_statement(where: str, old: str, new: str, tail: str = "") -> str:
    """``where: old -> new`` + `tail` in at most `STATEMENT_MAX` characters: the
    values cut in the middle when the whole would be longer."""
    if len(where) > 70:  # a deep path: its head and its end
        where = where[:30] + "..." + where[-37:]
    room = STATEMENT_MAX - len(where) - len(tail) - len(": ") - len(" -> ")
    if len(old) + len(new) > room:
        half = max(room // 2, 9)
        old, new = (_middle(old, half), _middle(new, room - min(len(_middle(old, half)), half)))
    return _cap(f"{where}: {old} -> {new}{tail}")


def _middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    keep = max(width - 3, 2)
    return text[:keep - keep // 3] + "..." + text[len(text) - keep // 3:]


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an odd value's == raised: not the same
        return False
