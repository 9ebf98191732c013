"""Call shapes: what a call's arguments look like to its binder, worked out once.

A call shape is ``len(args)``, or ``(len(args), *kwargs)`` with keywords;
`Split` says which of its arguments are static, and `shape_marker` gives the
one object that heads every all-array key of a key shape.
"""

from __future__ import annotations

from typing import Any

from nbjit import _jax
from nbjit.core.keys import treedef_id
from nbjit.core.structure import Readers

__all__ = ["ShapeMarker", "Split", "call_shape", "shape_marker"]


class Split:
    """Which arguments of one call shape are static, worked out once.

    `static_positions` and `dynamic_positions` index the positional
    arguments; `static_names` and `dynamic_names` (both sorted, the order in
    which JAX flattens keyword arguments) the keywords. `key_shape` is the
    shape with sorted names: keyword order never changes a signature.
    """

    __slots__ = ("shape", "key_shape", "nargs", "names", "static_positions",
                 "dynamic_positions", "static_names", "dynamic_names", "readers")

    def __init__(self, shape: Any, static_argnums: tuple[int, ...],
                 static_argnames: frozenset[str]) -> None:
        nargs, names = (shape, ()) if type(shape) is int else (shape[0], shape[1:])
        static = sorted({i if i >= 0 else i + nargs for i in static_argnums})
        self.shape = shape
        self.key_shape = (nargs, *sorted(names)) if names else nargs
        self.nargs = nargs
        self.names = names
        self.static_positions = tuple(i for i in static if 0 <= i < nargs)
        self.dynamic_positions = tuple(i for i in range(nargs) if i not in self.static_positions)
        self.static_names = tuple(sorted(static_argnames.intersection(names)))
        self.dynamic_names = tuple(sorted(k for k in names if k not in static_argnames))
        self.readers: Readers | None = None  # built with the first unrolled binder

    def leaves_treedef_id(self) -> int:
        """The treedef id of this shape's dynamic arguments when each is a leaf."""
        tree: Any = (0,) * len(self.dynamic_positions)
        if self.dynamic_names:
            tree = (tree, dict.fromkeys(self.dynamic_names, 0))
        return treedef_id(_jax.flatten_for_dispatch(tree)[1])


class ShapeMarker:
    """Heads the keys of one key shape's all-array form: hashed and compared by
    identity (a tuple would be hashed on every call)."""

    __slots__ = ("key_shape",)

    def __init__(self, key_shape: Any) -> None:
        self.key_shape = key_shape

    def __repr__(self) -> str:
        return f"ShapeMarker({self.key_shape!r})"


_shape_markers: dict[Any, ShapeMarker] = {}


def shape_marker(key_shape: Any) -> ShapeMarker:
    """The one marker of `key_shape` (every function's binders share it)."""
    return _shape_markers.setdefault(key_shape, ShapeMarker(key_shape))


def call_shape(args: tuple, kwargs: dict) -> Any:
    return (len(args), *kwargs) if kwargs else len(args)
