"""The static part of a `filter_jit` call: its key, and the call rebuilt from it.

A call's key (`static_key`) is a plain tuple, so nbjit's cache hashes and
compares it in C: the wrapped function's static part (`FunStatic`), the
treedef of ``(args, kwargs)`` and the non-array leaves, with None where an
array is (equinox's `hashable_partition`). At trace time `rebuild_call`
puts the traced arrays back in place.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax

from nbjit.filter.leaves import split_leaves

__all__ = ["PLAIN_FUNCTION", "FunStatic", "merge", "partition_fun", "rebuild_call", "static_key"]


def static_key(fun: FunStatic, treedef: Any, statics: tuple, first_count: int = -1) -> tuple:
    """What of a call is static, as one plain tuple (hashed and compared in C):
    the function's static part, the treedef of ``(args, kwargs)``, its
    non-array leaves (None where an array is), and under the except-first
    layout how many arrays the first argument has.

    Equal when equinox's static parts are equal: treedefs equal and leaves
    pairwise ``==`` (identity first, as tuples compare). A leaf whose
    ``__hash__`` or ``__eq__`` raises makes the lookup raise; nbjit then takes
    JAX's path, which raises what jax.jit raises for such a static argument.
    """
    return (fun, treedef, statics, first_count)


def rebuild_call(static: tuple, arrays: list, plain: Callable | None) -> tuple[Any, tuple, dict]:
    """(fun, args, kwargs) from a static key and the traced arrays (trace time
    only); `plain` is the function when the key holds PLAIN_FUNCTION for it."""
    fun_static, treedef, statics, _ = static
    count = fun_static.count
    fun = plain if fun_static is PLAIN_FUNCTION else fun_static.rebuild(arrays[:count])
    args, kwargs = treedef.unflatten(merge(statics, arrays[count:]))
    return fun, args, kwargs


class FunStatic:
    """The static part of the wrapped function (itself a pytree: a Module, a
    bound method, a `jtu.Partial`). Its hash is computed once."""

    __slots__ = ("treedef", "statics", "count", "_hash", "key")

    def __init__(self, treedef: Any, statics: tuple, plain: bool = False) -> None:
        self.treedef = treedef
        self.statics = statics
        self.count = sum(1 for x in statics if x is None)
        self._hash = hash((treedef, statics))
        # What a call's key holds: a plain Python function has a jitted
        # function of its own (weakly keyed by it), so its key need not hold
        # it, and must not (the cache entries would keep it alive).
        self.key = PLAIN_FUNCTION if plain else self

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (self is other or type(other) is FunStatic and self._hash == other._hash
                and self.treedef == other.treedef and self.statics == other.statics)

    def rebuild(self, arrays: list) -> Any:
        return self.treedef.unflatten(merge(self.statics, arrays))


PLAIN_FUNCTION = FunStatic(jax.tree_util.tree_structure(0), ("a plain function",))


def partition_fun(fun: Any) -> tuple[tuple, FunStatic]:
    """(the function's arrays, its static part), as equinox's hashable_partition."""
    leaves, treedef = jax.tree_util.tree_flatten(fun)
    arrays, statics = split_leaves(leaves)
    return tuple(arrays), FunStatic(treedef, statics, type(fun) is types.FunctionType)


def merge(statics: tuple, arrays: list) -> list:
    """The leaves: `statics` with its Nones replaced by `arrays`, in order."""
    it = iter(arrays)
    return [next(it) if x is None else x for x in statics]
