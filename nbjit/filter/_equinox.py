"""Every use of equinox's internals in nbjit lives here, behind a version check.

`nbjit.filter` reproduces `equinox.filter_jit` and needs a few of equinox's
private names (its callback filter and error message, its cache clears, its
function names, its sentinel, its deprecation check, its array types). As
`nbjit._jax` does for JAX, this module imports them in one place and refuses
an equinox outside the range they were checked against (pyproject.toml's
``nbjit[equinox]`` bound; CI runs equinox's core suite on the lowest and the
newest supported). Imported only when `filter_jit` is first used.
"""

from __future__ import annotations

from typing import Any

import equinox
import equinox._jit as _eqx_jit
from equinox import EquinoxRuntimeError, Module, Partial, field, module_update_wrapper
from equinox._caches import cache_clears
from equinox._compile_utils import get_fn_names
from equinox._custom_types import sentinel
from equinox._deprecate import deprecated_0_10
from equinox._filters import _ARRAY_TYPES

__all__ = ["ARRAY_TYPES", "EQUINOX_VERSION", "EquinoxRuntimeError", "Module", "Partial",
           "cache_clears", "callback_filter", "deprecated_0_10", "error_message", "field",
           "get_fn_names", "last_error_info", "module_update_wrapper", "sentinel"]

SUPPORTED = ((0, 13, 8), (0, 14))  # lowest supported, first unsupported


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


EQUINOX_VERSION = _version_tuple(equinox.__version__)
if not SUPPORTED[0] <= EQUINOX_VERSION < SUPPORTED[1]:
    raise ImportError(
        f"nbjit.filter_jit supports equinox >= 0.13.8, < 0.14 (found equinox "
        f"{equinox.__version__}); install a supported version, e.g. "
        "pip install 'equinox>=0.13.8,<0.14'")

ARRAY_TYPES = _ARRAY_TYPES  # jax.Array (tracers too), numpy arrays and scalars, literals
callback_filter = _eqx_jit._FilterCallback.filter  # hides "jax.pure_callback failed"
error_message = _eqx_jit._on_error_msg  # an eqx.error_if failure's message, as equinox's


def last_error_info() -> Any:
    """(message, stack) of the last `eqx.error_if` failure, or None."""
    return _eqx_jit.last_error_info
