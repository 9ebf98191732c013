"""Keys read per structure: one generated *reader* per pytree structure of a call.

A call whose arguments are pytrees (a params dict and a batch; a tuple
carry; an equinox Module) would otherwise be keyed by flattening it with
JAX's registry, looking its treedef up and keying the leaves in a list
comprehension. A reader does the same work for one structure it has seen,
as torch.compile's guards do: exact-type guards on every container
(``type(a0) is dict and len(a0) == 2``), direct reads of the leaves
(``x0 = a0['b']``), and the key built in one tuple display:

    def read(a0, a1):
        try:
            if not (type(a0) is dict and len(a0) == 1):
                return None
            n0 = a0['l0']
            if not (type(n0) is dict and len(n0) == 2):
                return None
            x0 = n0['b']
            x1 = n0['w']
            if not (type(x0) is ArrayImpl and type(x1) is ArrayImpl and type(a1) is ArrayImpl):
                return None
            return ((RID, x0.aval, x0._committed, ...), [x0._sharding, ...], [x0, x1, a1])
        except NoSignature:
            return UNKEYABLE
        except Exception:  # a guard that cannot be evaluated: the general path decides
            return None

Invariants:
  * A reader whose guards pass saw exactly the treedef JAX computes: dicts are
    read in the treedef's key order (JAX sorts keys) after an exact type and
    length check, so every key read present means the same key set; lists and
    tuples by exact type and length; ``None`` by identity; a namedtuple (a
    node keyed by its type alone: optax's states) by exact type and length,
    and while no jax.tree_util function has registered that type (a
    registered one is a custom node, flattened by its own function); every
    other node (registered classes, dataclasses) through the registry's own
    one-level flatten, its node data compared to the one seen (identity, then
    ``==``: as treedef equality compares it). An equinox Module is read as
    equinox's generated flatten reads it: exact type, ``__dict__`` holding
    exactly the class's fields, the dynamic ones read by name, the static ones
    compared as node data (`_module_fields`); any other Module (wrapper fields,
    another equinox layout) by the one-level flatten.
  * Each leaf is guarded by its *kind* (`LeafPolicy`): kinds are mutually
    exclusive, so at most one reader of a call shape accepts a call, and the
    key a call gets depends only on the call. The reader id `RID` names
    (call shape, structure, kinds), so keys of different structures never
    compare equal, and a reader rebuilt later (another binder, a cleared
    table) gets the same id.
  * A reader never decides a call it cannot read: on a failed guard, or an
    exception in a guard (a missing dict key, a raising flatten or ``__eq__``),
    it returns None and the general path runs, which raises what JAX raises.

Reuse (`nbjit.filter_jit`): `Readers(n, policy=PARTITION)` keys any n values
(a function, its positional arguments, its keyword values in sorted order)
with equinox's partition: array leaves (`jax.Array`, numpy arrays and
scalars) are dynamic and keyed by signature, every other leaf is static and
enters the key as itself, compared by ``==``/hash (``f(1)``, ``f(True)`` and
``f(1.0)`` share a key, as in equinox). ``readers.read(*values)`` returns
``(key, shardings, dynamic_leaves)``, `UNKEYABLE` (a host array no key can
hold: a string array), or None (no reader reads it: a tracer or a leaf of
an unknown array type among the leaves, or node data whose ``==`` raised;
the caller's general path decides).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from nbjit import _jax
from nbjit.core.codegen import Source, run_source
from nbjit.core.keys import LEAF_TYPES, SIGNATURE_SCOPE, treedef_id

__all__ = ["JIT_LEAVES", "PARTITION", "READER_MAX_LEAVES", "UNKEYABLE", "LeafPolicy", "Readers",
           "reader_source"]

ArrayImpl = _jax.ArrayImpl
UNKEYABLE = "unkeyable"  # what a reader returns when a dynamic leaf has no signature
READER_MAX_LEAVES = 4096  # bigger structures keep the general path (source size)
READERS_TRIED = 8  # readers a call shape tries before the general path

# Kinds of leaves. ARRAY: a jax.Array (aval and committed in the key, its
# sharding compared apart); HOST: a host value keyed by its signature;
# STATIC (PARTITION only): not an array, in the key as itself.
ARRAY, HOST, STATIC = 0, 1, 2
_HOST_LEAF_TYPES = LEAF_TYPES - {ArrayImpl}
_NUMPY_SCALARS = frozenset(t for t in np.sctypeDict.values() if issubclass(t, np.generic))
_HOST_ARRAY_TYPES = frozenset({np.ndarray, *_NUMPY_SCALARS})

# The signature of a host leaf `{x}` (keys.SIGNATURE without its jax.Array branch).
_HOST_SIGNATURE = ("((dtype, {x}.shape) if (t := type({x})) is ndarray"
                   "\n         and (dtype := get({x}.dtype)) is not None"
                   "\n         else t if t in PYTHON_SCALARS else other_signature({x}))")


def _is_array(x: Any) -> bool:
    """equinox's `is_array`: jax.Array (tracers too), numpy arrays and scalars."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class LeafPolicy:
    """How a reader treats leaves: `kind(x)` at learning time (None: this
    structure is not read), and the guard a later call's leaf must pass."""

    def __init__(self, name: str, static_leaves: bool) -> None:
        self.name = name
        self.static_leaves = static_leaves

    def kind(self, x: Any) -> int | None:
        t = type(x)
        if t is ArrayImpl:
            return ARRAY
        if self.static_leaves:
            if t in _HOST_ARRAY_TYPES:
                return HOST
            return None if _is_array(x) else STATIC  # a tracer or other array: not read
        return HOST if t in _HOST_LEAF_TYPES else None

    def guard(self, x: str, kind: int, leaf_type: str) -> str:
        if kind == ARRAY:
            return f"type({x}) is ArrayImpl"
        if kind == HOST:
            return f"type({x}) in {'HOST_ARRAYS' if self.static_leaves else 'HOST_LEAVES'}"
        return f"(type({x}) is {leaf_type} or not is_array({x}))"  # equal types: no isinstance

    def __repr__(self) -> str:
        return self.name


JIT_LEAVES = LeafPolicy("JIT_LEAVES", static_leaves=False)  # nbjit.jit: every leaf dynamic
PARTITION = LeafPolicy("PARTITION", static_leaves=True)  # equinox: non-arrays static


# ---------------------------------------------------------------------------
# Reader ids: one per (call form, structure, kinds), never reused

_reader_ids: dict[Any, int] = {}
_reader_counter = itertools.count(1)
_reader_lock = threading.Lock()
_MAX_READER_IDS = 1 << 16


def reader_id(form: Any, tid: int, kinds: bytes) -> int:
    """The id that heads the keys of one reader: the same for the same
    (form, treedef id, kinds), wherever the reader is built."""
    ident = (form, tid, kinds)
    rid = _reader_ids.get(ident)
    if rid is None:
        with _reader_lock:
            if len(_reader_ids) >= _MAX_READER_IDS:
                _reader_ids.clear()  # ids are never reused: old keys stop matching
            rid = _reader_ids.setdefault(ident, next(_reader_counter))
    return rid


# ---------------------------------------------------------------------------
# Source


class _Writer:
    """Accumulates a reader's body: guards are batched into one ``if not (...)``
    until a statement needs them to hold."""

    def __init__(self, policy: LeafPolicy) -> None:
        self.policy = policy
        self.src = Source()  # the reader's statements after its first
        self.guards: list[str] = []
        self.leaf_guards: list[str] = []
        self.scope: dict[str, Any] = {}
        self.items: list[str] = []
        self.shardings: list[str] = []
        self.leaves: list[str] = []
        self.host = False
        self._names = itertools.count()

    def constant(self, value: Any, prefix: str) -> str:
        name = f"{prefix}{len(self.scope)}"
        self.scope[name] = value
        return name

    def local(self, prefix: str) -> str:
        return f"{prefix}{next(self._names)}"

    def line(self, text: str) -> None:
        self.flush()
        self.src.line(text)

    def flush(self) -> None:
        if not self.guards:
            return
        header = ([f"if {_negated(self.guards[0])}:"] if len(self.guards) == 1
                  else _wrapped("if not (", self.guards, " and", "):"))
        self.src.lines(header[:-1])  # (a long condition's first lines)
        with self.src.block(header[-1]):
            self.src.line("return None")
        self.guards = []

    def unpack(self, source: str, n: int) -> list[str]:
        names = [self.local("n") for _ in range(n)]
        self.line(f"[{', '.join(names)}] = {source}")
        return names

    def node(self, x: str, treedef: Any, leaves: Any) -> None:
        """Guards and reads of the subtree `treedef` held in local `x`."""
        data = treedef.node_data()
        if data is None:
            self.leaf(x, next(leaves))
            return
        node_type, aux = data
        children = treedef.children()
        if node_type is type(None):
            self.guards.append(f"{x} is None")
            return
        if node_type is dict:  # the treedef's key order is JAX's (sorted)
            self.guards.append(f"type({x}) is dict and len({x}) == {len(aux)}")
            for key, child in zip(aux, children, strict=True):
                name = self.local("n")
                key_source = repr(key) if type(key) is str else self.constant(key, "K")
                self.line(f"{name} = {x}[{key_source}]")
                self.node(name, child, leaves)
            return
        if node_type is list or node_type is tuple:
            self.guards.append(f"type({x}) is {node_type.__name__} and len({x}) == {len(children)}")
            names = self.unpack(x, len(children)) if children else []
        elif _namedtuple_node(node_type, aux):  # read as a tuple: JAX's namedtuple node
            t = self.constant(node_type, "T")
            self.guards.append(f"type({x}) is {t} and len({x}) == {len(children)}"
                               f" and {t} not in REGISTERED")  # (registered later: custom)
            names = self.unpack(x, len(children)) if children else []
        elif (fields := _module_fields(node_type, aux, len(children))) is not None:
            names = self.module(x, node_type, aux, *fields)
        else:  # registered nodes, other Modules: JAX's one-level flatten
            self.guards.append(f"type({x}) is {self.constant(node_type, 'T')}")
            parts, data_name = self.local("c"), self.local("d")
            self.line(f"{parts}, {data_name} = flatten_one_level({x})")
            expected = self.constant(_one_level_data(node_type, aux), "A")
            self.guards.append(f"({data_name} is {expected} or {data_name} == {expected})")
            names = self.unpack(parts, len(children))
        for name, child in zip(names, children, strict=True):
            self.node(name, child, leaves)

    def module(self, x: str, node_type: type, aux: tuple, dynamic: tuple[str, ...],
               static: tuple[str, ...]) -> list[str]:
        """An equinox Module read as equinox's generated flatten reads it
        (`_module_fields`): ``__dict__`` holds exactly the fields; the dynamic
        ones are the children, in order; the static ones are the node data,
        compared as treedef equality compares it (identity, then ``==``)."""
        self.guards.append(f"type({x}) is {self.constant(node_type, 'T')}")
        fields = self.local("d")
        self.line(f"{fields} = {x}.__dict__")
        self.guards.append(f"len({fields}) == {len(dynamic) + len(static)}")
        for name, value in zip(static, aux[1:], strict=True):
            expected = self.constant(value, "A")
            self.guards.append(f"({fields}[{name!r}] is {expected} or "
                               f"{fields}[{name!r}] == {expected})")
        names = [self.local("n") for _ in dynamic]
        for name, field in zip(names, dynamic, strict=True):
            self.line(f"{name} = {fields}[{field!r}]")
        return names

    def leaf(self, x: str, value: Any) -> None:
        kind = self.policy.kind(value)
        if kind is None:
            raise _Unreadable
        type_name = self.constant(type(value), "T") if kind == STATIC else ""
        self.leaf_guards.append(self.policy.guard(x, kind, type_name))  # checked last, at once
        if kind == ARRAY:
            self.items += [f"{x}.aval", f"{x}._committed"]
            self.shardings.append(f"{x}._sharding")
            self.leaves.append(x)
        elif kind == HOST:
            self.items.append(_HOST_SIGNATURE.format(x=x))
            self.leaves.append(x)
            self.host = True
        else:
            self.items.append(x)


def _namedtuple_node(node_type: Any, aux: Any) -> bool:
    """Whether a treedef node is one JAX flattens as a namedtuple: a tuple
    subclass with ``_fields`` that no jax.tree_util function registered (a
    registered one, namedtuple or not, is a custom node: its own flatten).
    Its node data is the type alone (``(T, None)``) and its children are the
    tuple's items, in order, so a reader guards the exact type and length
    and unpacks it. Checked once more by JAX's own one-level flatten of an
    empty instance (no user code runs for a namedtuple), which gives the
    type itself as node data only for a namedtuple node."""
    if (aux is not None or not isinstance(node_type, type) or not issubclass(node_type, tuple)
            or not hasattr(node_type, "_fields") or _registered(node_type)):
        return False
    try:
        children, data = _jax.dispatch_registry.flatten_one_level(tuple.__new__(node_type, ()))
    except Exception:  # (an odd tuple subclass: the one-level path reads it)
        return False
    return data is node_type and not children


def _one_level_data(node_type: Any, aux: Any) -> Any:
    """The node data JAX's one-level flatten gives a node whose treedef holds
    `aux`: the same, except for a namedtuple node (a tuple subclass that no
    jax.tree_util function registered), whose treedef holds None and whose
    one-level flatten gives its type."""
    if (aux is None and isinstance(node_type, type) and issubclass(node_type, tuple)
            and not _registered(node_type)):
        return node_type
    return aux


def _registered(node_type: type) -> bool:
    """Whether a jax.tree_util function registered `node_type` (a type whose
    metaclass makes it unhashable counts as registered: the one-level path)."""
    try:
        return node_type in _jax.pytree_registrations
    except TypeError:
        return True


def _module_fields(node_type: Any, aux: Any, n_children: int
                   ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The (dynamic, static) field names of an equinox Module node that
    equinox's generated flatten made holding exactly its fields: node data
    ``(MISSING, *static values)`` and the dynamic values as children, in
    `dataclasses.fields` order, both read from ``__dict__``. None for any
    other node (a Module with wrapper fields, equinox absent or of another
    layout, any other class): JAX's one-level flatten reads those."""
    flatten = sys.modules.get("equinox._module._flatten")
    eqx = sys.modules.get("equinox")
    if (flatten is None or eqx is None or not isinstance(node_type, type)
            or not issubclass(node_type, eqx.Module) or type(aux) is not tuple or not aux
            or aux[0] is not getattr(flatten, "MISSING", None)):
        return None
    fields = dataclasses.fields(node_type)
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    dynamic = tuple(f.name for f in fields if not f.metadata.get("static", False))
    if len(aux) != 1 + len(static) or n_children != len(dynamic):
        return None
    return dynamic, static


def _negated(guard: str) -> str:
    """``not guard``, written as a linter wants it (``is not``, ``not in``)."""
    if guard.startswith("(") and guard.endswith(")") and " or " in guard:
        return f"not {guard}"
    if " and " in guard:
        return f"not ({guard})"
    if " is " in guard:
        return guard.replace(" is ", " is not ", 1)
    return guard.replace(" in ", " not in ", 1) if " in " in guard else f"not ({guard})"


def _wrapped(head: str, items: Sequence[str], joiner: str, tail: str, width: int = 80
             ) -> list[str]:
    """``head + items joined + tail`` as lines of at most about `width`
    characters (generated code is linted like the rest)."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + (joiner if i < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) > width and line != head:
            lines.append(line.rstrip())
            line = "        "
        line += piece + (" " if i < len(items) - 1 else "")
    if joiner == "," and len(items) == 1 and tail == ")":
        line += ","
    lines.append(line + tail)
    return lines


class _Unreadable(Exception):
    """A leaf this policy does not read: the structure keeps the general path."""


def reader_source(params: Sequence[str], trees: Sequence[Any], leaves: Sequence[Any],
                  policy: LeafPolicy, prefix: Sequence[str] = (), extra: Sequence[str] = ()
                  ) -> tuple[str, dict] | None:
    """The source of ``read(*params, *extra)`` for one structure: `trees[i]`
    is the treedef of param i, `leaves` the leaves of all of them in order
    (their kinds are guarded), `prefix` key items read before the leaves
    from `extra` params (a binder's static arguments). Returns (source,
    scope), or None if the structure is not read (a leaf no kind fits, too
    many leaves). The scope lacks RID: the caller's (`reader_id`)."""
    if len(leaves) > READER_MAX_LEAVES:
        return None
    writer = _Writer(policy)
    leaf_iter = iter(leaves)
    try:
        for name, tree in zip(params, trees, strict=True):
            writer.node(name, tree, leaf_iter)
    except _Unreadable:
        return None
    writer.guards += writer.leaf_guards
    writer.flush()
    src = Source()
    with src.block(f"def read({', '.join([*params, *extra])}):"):
        with src.block("try:"):
            if writer.host:
                src.line("get = canonical_dtypes[x64.value].get")
            src.extend(writer.src)
            src.lines(_wrapped("key = (", ["RID", *prefix, *writer.items], ",", ")"))
            src.lines(_wrapped("shardings = [", writer.shardings, ",", "]"))
            src.lines(_wrapped("leaves = [", writer.leaves, ",", "]"))
            src.line("return key, shardings, leaves")
        with src.block("except NoSignature:"):
            src.line("return UNKEYABLE")
        with src.block("except Exception:  # a guard that raised: the general path decides"):
            src.line("return None")
    source = src.text()
    scope = {**SIGNATURE_SCOPE, **writer.scope, "UNKEYABLE": UNKEYABLE,
             "HOST_LEAVES": _HOST_LEAF_TYPES, "HOST_ARRAYS": _HOST_ARRAY_TYPES,
             "is_array": _is_array, "flatten_one_level": _jax.dispatch_registry.flatten_one_level,
             "REGISTERED": _jax.pytree_registrations}
    return source, scope


# ---------------------------------------------------------------------------
# The readers of one call form


class Readers:
    """The readers learned for one call form: `n` values read in order
    (a binder's dynamic arguments; filter_jit's function, arguments and
    keyword values), keyed with `prefix` items first.

    `tried` is the list a caller loops over (the most recent structures);
    `learn` finds or builds the reader of a structure seen by a flatten.
    `form` must name the call form (its shape, its static layout), so the
    keys of two forms never share a reader id. `extra` params follow the
    read ones (a binder's static arguments, which `prefix` items read).
    """

    def __init__(self, params: Sequence[str], form: Any, policy: LeafPolicy = JIT_LEAVES,
                 prefix: Sequence[str] = (), extra: Sequence[str] = ()) -> None:
        self.params = tuple(params)
        self.form = (policy.name, form)
        self.policy = policy
        self.prefix = tuple(prefix)
        self.extra = tuple(extra)
        self.arguments = self.params + self.extra  # what a reader is called with, in order
        self.tried: list[Callable[..., Any]] = []
        self._built: dict[tuple[int, bytes], Callable[..., Any]] = {}
        self._unread: set[int] = set()  # treedef ids too big to read

    def learn(self, tid: int, trees: Sequence[Any], leaves: Sequence[Any]
              ) -> Callable[..., Any] | None:
        """The reader of this structure and leaf kinds (built on first sight),
        now tried first; None if it is not read (the general path keys it)."""
        if tid in self._unread or len(leaves) > READER_MAX_LEAVES:
            self._unread.add(tid)
            return None
        found = [self.policy.kind(x) for x in leaves]
        if None in found:
            return None
        kinds = bytes(k for k in found if k is not None)  # one byte a leaf: small ids
        reader = self._built.get((tid, kinds))
        if reader is None:
            made = reader_source(self.params, trees, leaves, self.policy, self.prefix, self.extra)
            if made is None:
                return None
            source, scope = made
            scope["RID"] = reader_id(self.form, tid, kinds)
            reader = run_source(source, f"reader {len(leaves)} leaves", scope, __name__)["read"]
            if len(self._built) >= 4 * READERS_TRIED:
                self._built.clear()
            self._built[(tid, kinds)] = reader
        if reader not in self.tried:
            if len(self.tried) >= READERS_TRIED:
                del self.tried[0]  # the oldest; keys do not depend on which readers are tried
            self.tried.append(reader)
        return reader

    def read(self, *values: Any) -> Any:
        """``(key, shardings, dynamic leaves)``, `UNKEYABLE`, or None (see the module docstring)."""
        for reader in self.tried:
            if (got := reader(*values)) is not None:
                return got
        leaves, treedef = _jax.flatten_for_dispatch(values)
        try:  # node data whose == raises, met in another treedef: the caller's path decides
            tid = treedef_id(treedef)
        except Exception:
            return None
        learned = self.learn(tid, treedef.children(), leaves)
        return None if learned is None else learned(*values)
