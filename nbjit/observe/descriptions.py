"""What enters a call's key, per argument path: the descriptions explained
misses compare (`nbjit.observe.explain`), and their packed rows.

`describe_call` describes a call on a miss (never on a hit: flattening with
paths costs more than a whole hit): per leaf its path, kind, dtype, shape,
weak type, sharding and committedness; static values; keyword names;
pytree structure; trace context. Paths start from the parameter's name, as
JAX's explanations do (`argument_paths`: ``lr``, ``params['w']``).
`pack_row` packs one into the int64 row that distances are counted over
(layout: `nbjit.observe.distance`). `nbjit.filter.describe` describes a
filter_jit call with the same pieces.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax import tree_util

from nbjit import _jax
from nbjit._common import PYTHON_SCALARS

__all__ = ["CONTEXT_WORD", "NO_DTYPE", "STRUCTURE_WORD", "CallDescription", "LeafDescription",
           "add_structure", "argument_paths", "describe_call", "describe_leaf",
           "description_serials", "flag_of", "pack_row", "word_of"]


@dataclass(frozen=True, eq=False)
class LeafDescription:
    """One argument leaf as the key sees it. `kind`: 'jax.Array', 'numpy', or a type name."""

    path: str
    kind: str
    dtype: Any = None
    shape: tuple | None = None
    weak_type: bool | None = None
    sharding: Any = None
    committed: bool | None = None


@dataclass(frozen=True, eq=False)
class CallDescription:
    """Everything that enters one call's key, per argument path."""

    leaves: tuple[LeafDescription, ...]
    statics: tuple[tuple[str, type, Any], ...]  # (path, exact type, value)
    keyword_names: tuple[str, ...]  # sorted
    structure: tuple[tuple[str, str], ...]  # (argument path, its treedef) for pytrees
    context: tuple
    row: tuple[int, ...]  # packed (see _kernels: DESCRIPTION_*)
    array: np.ndarray  # the same row as int64, for the kernel
    serial: int = 0  # creation order: of two equally close entries the newer is named
    positional: int = 0  # how many positional arguments (statics included)
    # (argument path, its treedef) as `structure`: what `structure_difference` walks
    treedefs: tuple[tuple[str, Any], ...] = ()
    # the path of each argument passed: positional ones in order, then keywords sorted
    arguments: tuple[str, ...] = ()


def word_of(value: Any) -> int:
    """One packed word standing for `value`: its hash (-1 if unhashable).

    Equal values give equal words; a rare collision only makes the closest
    entry less sharp (the message compares the descriptions themselves). A
    hash, not an interning table, so that no value outlives its entry here.
    """
    try:
        return hash(value)
    except TypeError:
        return -1


def describe_leaf(path: str, x: Any) -> LeafDescription:
    if isinstance(x, _jax.ArrayImpl) or isinstance(x, _jax.Tracer):
        aval: Any = x.aval
        if isinstance(x, _jax.Tracer):
            return LeafDescription(path, type(x).__name__, getattr(aval, "dtype", None),
                                   getattr(aval, "shape", None), getattr(aval, "weak_type", None))
        return LeafDescription(path, "jax.Array", aval.dtype, aval.shape, aval.weak_type,
                               x.sharding, x._committed)
    if isinstance(x, np.ndarray | np.generic):
        return LeafDescription(path, "numpy", x.dtype, x.shape, False)
    if type(x) in PYTHON_SCALARS:
        return LeafDescription(path, type(x).__name__, None, (), True)
    return LeafDescription(path, type(x).__name__)


def _flatten_argument(path: str, value: Any, leaves: list, structure: list,
                      treedefs: list) -> None:
    pairs, treedef = tree_util.tree_flatten_with_path(value)
    add_structure(path, treedef, structure, treedefs)
    for key_path, leaf in pairs:
        leaves.append(describe_leaf(path + tree_util.keystr(key_path), leaf))


def add_structure(path: str, treedef: Any, structure: list, treedefs: list) -> None:
    """Keeps the treedef of the argument at `path` (its text: what the signature
    and row hash; itself: what `structure_difference` walks) unless one leaf."""
    if treedef.num_nodes != 1 or treedef.num_leaves != 1:
        structure.append((path, str(treedef)))
        treedefs.append((path, treedef))


def argument_paths(signature: inspect.Signature | None, positional: int,
                   names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the path of each positional argument, of each keyword in `names`), as
    JAX's explanations name them: a parameter by its name, however it was
    passed (``lr``); a positional argument past the named ones by the
    ``*args`` parameter and its index there (``rest[0]``); a keyword no
    parameter takes by the ``**kwargs`` parameter (``kw['k']``). Without a
    signature, or past what it accepts: ``args[i]``, ``kwargs['k']``."""
    by_position: list[str] = []
    by_keyword: set[str] = set()
    star = double_star = None
    if signature is not None:
        for p in signature.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                by_position.append(p.name)
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                by_keyword.add(p.name)
            elif p.kind is p.VAR_POSITIONAL:
                star = p.name
            elif p.kind is p.VAR_KEYWORD:
                double_star = p.name
    named = len(by_position)
    args = [by_position[i] if i < named else f"{star}[{i - named}]" if star is not None
            else f"args[{i}]" for i in range(positional)]
    kwargs = [k if k in by_keyword else f"{double_star or 'kwargs'}[{k!r}]" for k in names]
    return args, kwargs


def describe_call(args: tuple, kwargs: dict, static_positions: Sequence[int],
                  static_names: Sequence[str], context: tuple,
                  signature: inspect.Signature | None = None) -> CallDescription:
    """The description of one call (the original `args` and `kwargs`, statics
    included); `signature`, the function's, names the paths (`argument_paths`).

    Called on misses only: flattening with paths costs more than a whole hit.
    """
    static = set(static_positions)
    leaves: list[LeafDescription] = []
    statics: list[tuple[str, type, Any]] = []
    structure: list[tuple[str, str]] = []
    treedefs: list[tuple[str, Any]] = []
    names = tuple(sorted(kwargs))
    arg_paths, kwarg_paths = argument_paths(signature, len(args), names)
    for i, (path, value) in enumerate(zip(arg_paths, args, strict=True)):
        if i in static:
            statics.append((path, type(value), value))
        else:
            _flatten_argument(path, value, leaves, structure, treedefs)
    for name, path in zip(names, kwarg_paths, strict=True):
        if name in static_names:
            statics.append((path, type(kwargs[name]), kwargs[name]))
        else:
            _flatten_argument(path, kwargs[name], leaves, structure, treedefs)
    row = pack_row(leaves, statics, len(args), structure, names, context)
    return CallDescription(tuple(leaves), tuple(statics), names, tuple(structure), context,
                           tuple(row), np.array(row, dtype=np.int64), next(description_serials),
                           len(args), tuple(treedefs), (*arg_paths, *kwarg_paths))


description_serials = itertools.count(1)  # next() is atomic under the GIL


def flag_of(value: bool | None) -> int:
    return -1 if value is None else int(value)


# Header words a distance compares that may stand for more than one named
# field (`_closest_entries` counts those fields when they differ).
STRUCTURE_WORD, CONTEXT_WORD = 1, 3
NO_DTYPE = 0  # the dtype word of a leaf with none (a static, a Python object)


def pack_row(leaves: Sequence[LeafDescription], statics: Sequence[tuple[str, type, Any]],
             positional: int, structure: Sequence[tuple[str, str]], names: tuple[str, ...],
             context: tuple) -> list[int]:
    """A call description's packed row (layout: `nbjit.observe.distance`).

    Dynamic leaves first, then each static value as a leaf of its own: its
    kind the static's exact type, its value's hash where a leaf's shape
    goes, so a changed static counts one field, as `field_differences`
    names it."""
    row = [len(leaves) + len(statics), word_of((positional, tuple(structure))), word_of(names),
           word_of(context)]
    for leaf in leaves:
        row += (word_of(leaf.path), word_of(leaf.kind),
                NO_DTYPE if leaf.dtype is None else word_of(leaf.dtype),
                flag_of(leaf.weak_type), flag_of(leaf.committed), word_of(leaf.sharding),
                -1 if leaf.shape is None else len(leaf.shape), word_of(leaf.shape))
    for path, kind, value in statics:
        row += (word_of(path), word_of(("static", kind)), NO_DTYPE, -1, -1, 0, -1,
                word_of(value))
    return row
