"""What a host value is, and private copies of host values for JAX's own path.

Host values are classified in one place, `host_dtype` (in
`nbjit.core.values`, re-exported here): the keys and the input steps
(`nbjit.host.steps`) agree on what a host value is. `private_host_copies`
gives JAX's own path (a miss, a slow call) copies no caller can write into.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import ALIGN, PYTHON_SCALARS
from nbjit.core import hooks as _hooks
from nbjit.core.values import PYTHON_SCALAR_DTYPES, canonical_dtypes, host_dtype

__all__ = ["PRIVATE_COPY_ALWAYS_BYTES", "PYTHON_SCALAR_DTYPES", "canonical_dtypes", "host_dtype",
           "private_host_copies"]

ArrayImpl = _jax.ArrayImpl


# Private copies for JAX's own path


# Up to this size a copy costs less than reading the array's address; above it
# only a 64-byte-aligned array is copied where jaxlib copies any other itself
# while the call runs (it never uses it in place: the CPU from jaxlib 0.11.2
# on, `_jax.jax_path_reads_host_arrays_during_call`); elsewhere every one is.
PRIVATE_COPY_ALWAYS_BYTES = 64 << 10


def _private_leaf(x: Any) -> Any:
    if type(x) is not np.ndarray:
        return x
    if (x.nbytes <= PRIVATE_COPY_ALWAYS_BYTES or x.__array_interface__["data"][0] % ALIGN == 0
            or not _jax.jax_path_reads_host_arrays_during_call()):
        return x.copy()
    return x


def private_host_copies(args: tuple, kwargs: dict, static_positions: Sequence[int],
                        static_names: Sequence[str]) -> tuple[tuple, dict]:
    """`args` and `kwargs` with every numpy array among the dynamic ones copied.

    JAX's own path (a miss, a slow call) uses a 64-byte-aligned numpy array
    in place on CPU, so a caller writing into it after the call could change
    the result; a private copy cannot be written by anyone. Static arguments
    are left alone (they enter keys by ``==``). Arguments with no numpy
    array in them are returned as they are (same objects).
    """
    changed_args = _private_changes(enumerate(args), static_positions)
    changed_kwargs = _private_changes(kwargs.items(), static_names)
    if changed_args:
        args = tuple(changed_args.get(i, x) for i, x in enumerate(args))
    if changed_kwargs:
        kwargs = {**kwargs, **changed_kwargs}
    return args, kwargs


def _private_changes(items: Any, static: Sequence[Any]) -> dict:
    """position or name -> private copy, for the dynamic arguments with numpy in them."""
    changed = {}
    for where, x in items:
        t = type(x)
        if t is ArrayImpl or t in PYTHON_SCALARS or where in static:
            continue
        y = _private_tree(x)
        if y is not x:
            changed[where] = y
    return changed


def _private_tree(x: Any) -> Any:
    if type(x) is np.ndarray:
        return _private_leaf(x)
    leaves, treedef = _jax.flatten_for_dispatch(x)
    private = [_private_leaf(leaf) for leaf in leaves]
    if all(p is leaf for p, leaf in zip(private, leaves, strict=True)):
        return x
    return treedef.unflatten(private)


_hooks.set_private_copies(private_host_copies)  # JAX's own path (core.dispatch) copies through it
