"""What a host value is, and private copies of host values for JAX's own path.

Host values are classified in one place, `host_dtype`: the keys
(`nbjit.core.keys`) and the input steps (`nbjit.core.inputs.steps`) agree on
what a host value is, and a hit reads `canonical_dtypes` and calls
`host_dtype` directly. `private_host_copies` gives JAX's own path (a miss, a
slow call) copies no caller can write into.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import ALIGN, PYTHON_SCALARS
from nbjit.core.inputs.staging import immutable

__all__ = ["PRIVATE_COPY_ALWAYS_BYTES", "PYTHON_SCALAR_DTYPES", "canonical_dtypes", "host_dtype",
           "private_host_copies", "scalar_converts_exactly"]

ArrayImpl = _jax.ArrayImpl


class _CanonicalDtypes(dict):
    """dtype -> canonical dtype for one x64 setting, filled on first use.

    Read with the plain (C) ``dict.get``, then `resolve` on a miss: numeric
    dtypes are stored, others (strings, objects, float0) give None each
    time, and JAX's own path handles them.
    """

    def __init__(self, x64: bool) -> None:
        super().__init__()
        self._x64 = x64

    def resolve(self, dtype: Any) -> np.dtype | None:
        try:
            if not _is_numeric(dtype):
                return None
            with _jax.enable_x64(self._x64):
                canonical = np.dtype(_jax.canonicalize_dtype(dtype))
            self[dtype] = canonical
        except TypeError:  # an unhashable or odd "dtype" of some exotic subclass
            return None
        return canonical


def _is_numeric(dtype: np.dtype) -> bool:
    """bool, integers, floats, complex, and ml_dtypes' (bfloat16, float8, ...)."""
    return dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes"


# x64 setting -> {dtype: canonical dtype}
canonical_dtypes = {False: _CanonicalDtypes(False), True: _CanonicalDtypes(True)}
# Python scalar type -> the dtype JAX gives it before canonicalisation (weakly typed)
PYTHON_SCALAR_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64),
                        float: np.dtype(np.float64), complex: np.dtype(np.complex128)}


def host_dtype(x: Any, canonical: dict) -> np.dtype | None:
    """The canonical (x64-squashed) dtype a host value enters as; None if not one.

    Host values: numpy arrays and scalars of numeric dtypes, Python bool,
    int, float and complex (as in jaxlib, an int's range is checked when it
    is converted, and JAX's own path reports an overflow).
    """
    t = type(x)
    if t is np.ndarray or isinstance(x, np.generic):
        dtype = x.dtype
    elif (dtype := PYTHON_SCALAR_DTYPES.get(t)) is None:
        return None
    try:
        canonical_dtype = canonical.get(dtype)
    except TypeError:  # unhashable
        return None
    if canonical_dtype is not None:
        return canonical_dtype
    return canonical.resolve(dtype)  # type: ignore[attr-defined]  # a _CanonicalDtypes


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def scalar_converts_exactly(x: Any, dtype: np.dtype) -> bool:
    """Whether host scalar `x` (a Python or numpy scalar) converts to `dtype`
    by numpy as jaxlib converts it, with no warning: a bool to bool, an int
    within the integer dtype's range (jaxlib raises for one beyond), a float
    within float32's range or any to float64 (jaxlib's cast of a bigger one
    is numpy's with an overflow warning), a numpy scalar already of `dtype`.
    Anything else (complex, a numpy scalar to convert) is left to jaxlib."""
    t = type(x)
    if t is bool:
        return dtype.kind == "b"
    if t is int:
        if dtype.kind not in "iu":
            return False
        info = np.iinfo(dtype)
        return info.min <= x <= info.max
    if t is float:
        return dtype == np.float64 or (dtype == np.float32
                                       and (abs(x) <= _FLOAT32_MAX or not math.isfinite(x)))
    return isinstance(x, np.generic) and x.dtype == dtype


# ---------------------------------------------------------------------------
# Private copies for JAX's own path

# Up to this size a copy costs less than reading the array's address; above it,
# on the CPU, only a 64-byte-aligned array is copied (jaxlib copies any other
# itself while the call runs: it never uses it in place). Where the default
# device has memory of its own (an accelerator) every array is copied: its
# transfer reads the caller's array after the call returns; so is it on the
# CPU before jaxlib 0.11.2, whose client may read it after the call too
# (`_jax.jax_path_reads_host_arrays_during_call`). An array no one can write
# (`staging.immutable`) is never copied: whenever JAX reads it, it reads the
# call's values, as a launch record's put does.
PRIVATE_COPY_ALWAYS_BYTES = 64 << 10


def _private_leaf(x: Any, every: bool) -> Any:
    if type(x) is not np.ndarray or (not x.flags.writeable and immutable(x)):
        return x
    if (every or x.nbytes <= PRIVATE_COPY_ALWAYS_BYTES
            or x.__array_interface__["data"][0] % ALIGN == 0):
        return x.copy()
    return x


def private_host_copies(args: tuple, kwargs: dict, static_positions: Sequence[int],
                        static_names: Sequence[str]) -> tuple[tuple, dict]:
    """`args` and `kwargs` with every numpy array among the dynamic ones copied
    (but those no one can write: `staging.immutable`).

    JAX's own path (a miss, a slow call) uses a 64-byte-aligned numpy array
    in place on CPU, and on an accelerator reads any numpy array after the
    call returns, so a caller writing into it after the call could change
    the result; a private copy cannot be written by anyone. Static arguments
    are left alone (they enter keys by ``==``). Arguments with no numpy
    array in them are returned as they are (same objects).
    """
    every = not _jax.jax_path_reads_host_arrays_during_call()
    changed_args = _private_changes(enumerate(args), static_positions, every)
    changed_kwargs = _private_changes(kwargs.items(), static_names, every)
    if changed_args:
        args = tuple(changed_args.get(i, x) for i, x in enumerate(args))
    if changed_kwargs:
        kwargs = {**kwargs, **changed_kwargs}
    return args, kwargs


def _private_changes(items: Any, static: Sequence[Any], every: bool) -> dict:
    """position or name -> private copy, for the dynamic arguments with numpy in them."""
    changed = {}
    for where, x in items:
        t = type(x)
        if t is ArrayImpl or t in PYTHON_SCALARS or where in static:
            continue
        y = _private_tree(x, every)
        if y is not x:
            changed[where] = y
    return changed


def _private_tree(x: Any, every: bool) -> Any:
    if type(x) is np.ndarray:
        return _private_leaf(x, every)
    leaves, treedef = _jax.flatten_for_dispatch(x)
    private = [_private_leaf(leaf, every) for leaf in leaves]
    if all(p is leaf for p, leaf in zip(private, leaves, strict=True)):
        return x
    return treedef.unflatten(private)
