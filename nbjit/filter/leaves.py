"""Which leaves `filter_jit` traces: exactly equinox's `is_array` ones."""

from __future__ import annotations

from typing import Any

from nbjit import _jax
from nbjit.filter._equinox import ARRAY_TYPES

__all__ = ["ARRAY_TYPES", "array_kinds", "is_array", "split_leaves"]


# type -> equinox's is_array for its instances, for every type but tracers:
# is_array is an isinstance test, which for those depends on the type alone
# (a tracer is a jax.Array only when its aval is an array's, so tracers are
# tested one by one and never learnt).
array_kinds: dict[type, bool] = {}


def is_array(x: Any) -> bool:
    kind = type(x)
    known = array_kinds.get(kind)
    if known is None:
        known = isinstance(x, ARRAY_TYPES)
        if not isinstance(x, _jax.Tracer):
            array_kinds[kind] = known
    return known


def split_leaves(leaves: list) -> tuple[list, tuple]:
    """(the array leaves, the leaves with None where an array is): the general
    path, for calls with a leaf type not learnt yet or a tracer."""
    flags = [is_array(x) for x in leaves]
    arrays = [x for x, flag in zip(leaves, flags, strict=True) if flag]
    statics = tuple([None if flag else x for x, flag in zip(leaves, flags, strict=True)])
    return arrays, statics
