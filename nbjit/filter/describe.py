"""Misses of a `filter_jit` function described by the wrapped call.

nbjit explains a miss by comparing the call's description with the closest
cached one (`nbjit.observe.explain`). The inner function's own arguments
(one list of arrays and a static key, the plain tuple
`nbjit.filter.static.static_key` makes) would say only "the static argument
changed"; this describes the wrapped function's arguments instead, every
leaf by its path: array leaves as nbjit.jit describes them, every other leaf
as a static value (``model.layers[1].activation``), so an explained miss
names the Module field that changed. Runs on misses only.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from jax import tree_util

from nbjit.filter.leaves import is_array
from nbjit.filter.static import rebuild_call
from nbjit.observe import descriptions as _descriptions

__all__ = ["describe_filter_call"]


def describe_filter_call(static: tuple, arrays: list, context: tuple,
                         signature: inspect.Signature | None = None
                         ) -> _descriptions.CallDescription:
    """The description of one call, from its static key and traced arrays;
    `signature`, the wrapped function's, names the paths
    (`nbjit.observe.descriptions.argument_paths`)."""
    fun, args, kwargs = rebuild_call(static, arrays, None)
    leaves: list[_descriptions.LeafDescription] = []
    statics: list[tuple[str, type, Any]] = []
    structure: list[tuple[str, str]] = []
    treedefs: list[tuple[str, Any]] = []
    names = tuple(sorted(kwargs))
    arg_paths, kwarg_paths = _descriptions.argument_paths(signature, len(args), names)
    parts = [("fun", fun)] if fun is not None else []  # a plain function: not in the key
    parts += [*zip(arg_paths, args, strict=True),
              *zip(kwarg_paths, (kwargs[name] for name in names), strict=True)]
    for path, value in parts:
        pairs, treedef = tree_util.tree_flatten_with_path(value)
        _descriptions.add_structure(path, treedef, structure, treedefs)
        for key_path, leaf in pairs:
            leaf_path = path + tree_util.keystr(key_path)
            if is_array(leaf):
                leaves.append(_descriptions.describe_leaf(leaf_path, leaf))
            else:
                statics.append((leaf_path, type(leaf), leaf))
    row = _descriptions.pack_row(leaves, statics, len(args), structure, names, context)
    return _descriptions.CallDescription(
        tuple(leaves), tuple(statics), names, tuple(structure), context, tuple(row),
        np.array(row, dtype=np.int64), next(_descriptions.description_serials), len(args),
        tuple(treedefs), tuple(path for path, _ in parts))
