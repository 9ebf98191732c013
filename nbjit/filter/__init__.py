"""`nbjit.filter_jit`: equinox.filter_jit's semantics on nbjit's dispatcher.

equinox is optional (``pip install nbjit[equinox]``): this module imports
without it, and `filter_jit` imports the implementation (which imports
equinox) on its first use, raising ImportError with the fix if equinox is
missing. Every private name of equinox's it uses is imported by `_equinox`, which
refuses an equinox outside the supported range (pyproject.toml's bound).
The modules: `jit` (the wrapper Module and its call),
`inner` (the jitted function, its static key and static outputs),
`leaves` (equinox's is_array), `describe` (explained misses by leaf path).
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["equinox_available", "filter_jit"]


def equinox_available() -> bool:
    try:
        return importlib.util.find_spec("equinox") is not None
    except (ImportError, ValueError):  # blocked (sys.modules["equinox"] = None) or broken
        return False


def filter_jit(fun: Any = None, *, donate: str = "none", **jitkwargs: Any) -> Any:
    """Drop-in `equinox.filter_jit` (same arguments, outputs, caching and errors)
    whose calls run on nbjit's dispatcher. Needs equinox installed.

    Arrays (jax and numpy) are traced, every other leaf is static. Unlike
    equinox, a call waits for its outputs only when the computation holds a
    host callback (an `eqx.error_if` check); see docs/filter-jit.md.
    """
    try:
        from nbjit.filter import jit as _impl  # deferred: equinox is optional
    except ImportError as error:
        if equinox_available():  # an equinox outside the supported range (filter/_equinox.py)
            raise
        raise ImportError("nbjit.filter_jit needs equinox: pip install 'nbjit[equinox]'"
                          ) from error
    if fun is None:
        return _impl.filter_jit(donate=donate, **jitkwargs)
    return _impl.filter_jit(fun, donate=donate, **jitkwargs)
