"""What a host value is: the one classification the keys (`nbjit.core.keys`)
and the input steps (`nbjit.host.steps`) share.

It sits in the core because a call's key depends on it (a hit reads
`canonical_dtypes` and calls `host_dtype` directly, with no registry in
between); the host room re-exports it from `nbjit.host.values`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbjit import _jax

__all__ = ["PYTHON_SCALAR_DTYPES", "canonical_dtypes", "host_dtype"]


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

