"""The jitted function under a `filter_jit` wrapper, and what its key holds.

`filter_jit(fun)` calls one nbjit `PjitFunction` per wrapped function (and
layout, see below): ``inner(arrays, static)`` with `static` a static
argument. `arrays` are the call's traced leaves (the function's own first,
then the arguments'), each a positional argument (`make_inner`'s layouts),
so nbjit's binder keys them without flattening; `static` is a `static_key` tuple: the argument
treedef and the non-array leaves, compared as equinox compares its static
part (``==`` and ``hash``, identity first). Under ``donate="*-except-first"`` the first
argument's arrays come as a list of their own: ``inner(donated, kept, static)``.

At trace time `inner` rebuilds the function and its arguments, calls it, and
returns the output as it is when all its leaves are arrays (JAX's own
unflatten of the outputs rebuilds it; no second one), else its arrays and
an `OutputRecipe` that holds everything else (a pytree node without
children, so JAX keeps it in the output treedef and every hit returns the
trace-time objects). A computation that holds a host callback (an
`eqx.error_if` check) also outputs a marker that the caller waits on
(`split_output`, `finish`).
"""

from __future__ import annotations

import contextlib
import inspect
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from nbjit import _jax
from nbjit.core.dispatch import PjitFunction
from nbjit.core.hooks import JitExtension
from nbjit.filter import describe
from nbjit.filter.leaves import split_leaves
from nbjit.filter.static import merge, rebuild_call

__all__ = ["FilterExtension", "OutputRecipe", "filter_pjit", "finish", "make_inner",
           "split_output"]


class OutputRecipe:
    """How an output with non-array leaves rebuilds: its treedef and its
    non-array leaves (None where an array is), and whether a marker output
    follows the arrays. Compared by identity (each trace makes its own)."""

    __slots__ = ("treedef", "statics", "blocks")

    def __init__(self, treedef: Any, statics: tuple, blocks: bool) -> None:
        self.treedef = treedef
        self.statics = statics
        self.blocks = blocks

    def rebuild(self, arrays: list) -> Any:
        return self.treedef.unflatten(merge(self.statics, arrays))


# A node without children: JAX keeps it in the output treedef, and its
# outputs still re-flatten to arrays (which JAX's fast-path data requires).
jax.tree_util.register_pytree_node(
    OutputRecipe, lambda recipe: ((), recipe), lambda recipe, _: recipe)


def split_output(out: Any) -> tuple[Any, Any]:
    """Trace time: ``(out, marker)`` when every output leaf is an array (JAX's
    own unflatten of the outputs then rebuilds the output), else ``(arrays,
    recipe)``; `marker` is an array to wait on when the computation holds a
    host callback, else None, and with a recipe the marker (if any) is the
    last of `arrays`."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    arrays, statics = split_leaves(leaves)
    marker = jnp.array(0) if _jax.traced_callbacks() else None  # the marker, as equinox's
    if len(arrays) == len(leaves):
        return out, marker
    if marker is not None:
        arrays.append(marker)
    return arrays, OutputRecipe(treedef, statics, marker is not None)


def finish(out: Any, second: Any) -> tuple[Any, Any]:
    """(the wrapped function's output, the marker to wait on or None) from the
    inner function's two outputs (`split_output`'s forms)."""
    if type(second) is OutputRecipe:  # never an output leaf: a pytree node
        marker = out.pop() if second.blocks else None
        return second.rebuild(out), marker
    return out, second


def make_inner(names: tuple[str, str, str], layout: str, fun: Any) -> Callable:
    """The function nbjit jits: rebuilds the call from arrays + static key. It
    holds a plain Python `fun` weakly (its wrappers hold it while they live).

    Layouts: "spread" ``inner(static, *arrays)`` (no donation: each array a
    positional argument, which nbjit's binder keys without flattening, numpy
    ones too); "list" ``inner(arrays, static)`` (everything donated);
    "except_first" ``inner(donated, kept, static)``.
    """
    plain = weakref.ref(fun) if type(fun) is types.FunctionType else lambda: None
    if layout == "spread":
        def fun_wrapped(static: tuple, *arrays: Any) -> tuple:
            fun, args, kwargs = rebuild_call(static, list(arrays), plain())
            return split_output(fun(*args, **kwargs))
    elif layout == "except_first":
        def fun_wrapped(donated: list, kept: list, static: tuple) -> tuple:  # type: ignore[misc]
            fun, args, kwargs = rebuild_call(static, join_arrays(static, donated, kept), plain())
            return split_output(fun(*args, **kwargs))
    else:
        def fun_wrapped(arrays: list, static: tuple) -> tuple:  # type: ignore[misc]
            fun, args, kwargs = rebuild_call(static, arrays, plain())
            return split_output(fun(*args, **kwargs))
    fun_wrapped.__name__, fun_wrapped.__qualname__, fun_wrapped.__module__ = names[:3]
    return fun_wrapped


def join_arrays(static: tuple, donated: list, kept: list) -> list:
    """The except-first layout's arrays in flattening order: the function's
    (donated), the first argument's (kept), the rest (donated)."""
    count = static[0].count
    return [*donated[:count], *kept, *donated[count:]]


def split_inner_args(layout: str, inner_args: tuple) -> tuple[tuple, tuple, list]:
    """(the arguments without the static key, the static key, the arrays in
    flattening order) of one inner call."""
    if layout == "spread":
        return inner_args[1:], inner_args[0], list(inner_args[1:])
    static = inner_args[-1]
    if layout == "except_first":
        return inner_args[:-1], static, join_arrays(static, *inner_args[:2])
    return inner_args[:-1], static, list(inner_args[0])


class FilterExtension(JitExtension):
    """What `filter_jit` changes of its `PjitFunction` (`nbjit.core.hooks.JitExtension`):
    (1) XLA's "Some donated buffers were not usable" warning hidden where
    equinox hides it (donate="all" and "all-except-first"; only compiles
    warn, so only the compile and JAX's own path are wrapped), and (2) misses
    described by the wrapped function's arguments, each static leaf by its
    path (`nbjit.filter.describe`)."""

    __slots__ = ("filter_warning", "layout", "signature")

    def __init__(self, filter_warning: bool, layout: str,
                 signature: inspect.Signature | None = None) -> None:
        self.filter_warning = filter_warning
        self.layout = layout
        self.signature = signature  # the wrapped function's: names the described paths

    def jax_path(self) -> contextlib.AbstractContextManager[Any]:
        if not self.filter_warning:
            return contextlib.nullcontext()
        return _hiding_donation_warnings()

    def describe(self, args: tuple, kwargs: dict, context: tuple, description: Any) -> Any:
        try:
            _, static, arrays = split_inner_args(self.layout, args)
            return describe.describe_filter_call(static, arrays, context, self.signature)
        except Exception:  # describing must never break a call
            return description


@contextlib.contextmanager
def _hiding_donation_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable*")
        yield


def filter_pjit(fun: Callable, options: dict[str, Any], filter_warning: bool,
                layout: str, signature: inspect.Signature | None = None) -> PjitFunction:
    """The `PjitFunction` of one wrapped function (`signature`: the wrapped
    function's): nbjit's jit, composed with `FilterExtension` (no method of it
    overridden)."""
    return PjitFunction(fun, options,
                        extension=FilterExtension(filter_warning, layout, signature))
