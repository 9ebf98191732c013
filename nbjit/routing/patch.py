"""Routing `jax.jit` to `nbjit.jit`: `patch_jax`, `unpatch_jax`, `patched_jax`.

Only the public name `jax.jit` is rebound. So:

  * code that looks up `jax.jit` when it runs (``@jax.jit`` in a module
    imported after patching, ``jax.jit(f)`` in a function) gets nbjit.jit;
  * a name bound earlier with ``from jax import jit`` keeps JAX's jit: patch
    before importing the model code (``python -m nbjit run`` does);
  * JAX's internal uses of jit (jax.numpy, lax, JAX's own transformations)
    stay JAX's: they call `jax._src.api.jit`, which is never touched.

When equinox is installed, `equinox.filter_jit` is routed the same way to
`nbjit.filter_jit` (``filter_jit=False`` leaves it alone; patching imports
equinox then): code that reads ``eqx.filter_jit`` when it runs gets nbjit's,
a name bound earlier with ``from equinox import filter_jit`` keeps
equinox's, and equinox's own internal uses stay equinox's.

The patch is process-wide (a module attribute), not per thread. Its state is
one switch (`patch_jax` / `unpatch_jax`) plus a count of open `patched_jax()`
blocks: `jax.jit` is nbjit's while the switch is on or any block is open, and
when neither holds it gets back exactly the object it had before the patch
(JAX's jit, or whatever else had rebound it). All changes happen under one lock.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import jax

from nbjit import filter as _filter
from nbjit.core import dispatch as dispatch

__all__ = ["patch_jax", "unpatch_jax", "patched_jax", "is_jax_patched"]

_lock = threading.RLock()
_switch = False  # patch_jax() called and not yet undone
_open_blocks = 0  # patched_jax() blocks entered and not yet left (all threads)
_saved: list[Any] = []  # [what jax.jit was] while patched
_route_filter_jit = True  # the last patch_jax / patched_jax call's `filter_jit`
_saved_filter: list[Any] = []  # [(the equinox module, what its filter_jit was)] while routed


def patch_jax(*, filter_jit: bool = True) -> None:
    """Routes `jax.jit` to `nbjit.jit` (and, with `filter_jit` and equinox
    installed, `equinox.filter_jit` to `nbjit.filter_jit`) until `unpatch_jax()`;
    calling it again does nothing.

    Patch before importing code that does ``from jax import jit``: such names
    are bound at import and keep JAX's jit.
    """
    global _switch, _route_filter_jit
    with _lock:
        _switch = True
        _route_filter_jit = filter_jit
        _apply()


def unpatch_jax() -> None:
    """Undoes `patch_jax()`: `jax.jit` is again what it was before (unless a
    `patched_jax()` block is still open; it is restored when the last one closes).
    Calling it when not patched does nothing.
    """
    global _switch
    with _lock:
        _switch = False
        _apply()


@contextlib.contextmanager
def patched_jax(*, filter_jit: bool = True) -> Iterator[None]:
    """``with nbjit.patched_jax():`` routes `jax.jit` to `nbjit.jit` inside the
    block (and `equinox.filter_jit` to `nbjit.filter_jit`, as `patch_jax`).

    Blocks nest, and may be open in several threads at once: `jax.jit` stays
    nbjit's until the last one closes (and `patch_jax()`, if called, is undone).
    """
    global _open_blocks, _route_filter_jit
    with _lock:
        _open_blocks += 1
        _route_filter_jit = filter_jit
        _apply()
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            _apply()


def is_jax_patched() -> bool:
    """True while `jax.jit` is routed to `nbjit.jit` by this module."""
    with _lock:
        return bool(_saved)


def _apply() -> None:
    """Makes `jax.jit` agree with the switch and the open blocks (lock held)."""
    want = _switch or _open_blocks > 0
    _apply_filter_jit(want and _route_filter_jit)
    if want and not _saved:
        _saved.append(jax.jit)
        jax.jit = dispatch.jit  # type: ignore[assignment]  # the patch itself
    elif not want and _saved:
        previous = _saved.pop()
        if jax.jit is dispatch.jit:
            jax.jit = previous
        else:  # someone rebound it after us: theirs stays
            warnings.warn(
                f"nbjit: jax.jit was rebound to {jax.jit!r} while patched; leaving it "
                f"(it would have been restored to {previous!r})",
                RuntimeWarning, stacklevel=3)


def _apply_filter_jit(want: bool) -> None:
    """Makes `equinox.filter_jit` agree with `want` (lock held); nothing without equinox."""
    if want and not _saved_filter:
        if not _filter.equinox_available():
            return
        try:  # an equinox outside the versions filter_jit supports keeps its own
            importlib.import_module("nbjit.filter.jit")
        except ImportError as error:
            warnings.warn(f"nbjit: equinox.filter_jit left as it is: {error}", RuntimeWarning,
                          stacklevel=4)
            return
        equinox = importlib.import_module("equinox")
        _saved_filter.append((equinox, equinox.filter_jit))
        setattr(equinox, "filter_jit", _filter.filter_jit)  # noqa: B010 (a module typed loosely)
    elif not want and _saved_filter:
        equinox, previous = _saved_filter.pop()
        if equinox.filter_jit is _filter.filter_jit:
            setattr(equinox, "filter_jit", previous)  # noqa: B010
        else:  # someone rebound it after us: theirs stays
            warnings.warn(
                f"nbjit: equinox.filter_jit was rebound to {equinox.filter_jit!r} while "
                f"patched; leaving it (it would have been restored to {previous!r})",
                RuntimeWarning, stacklevel=4)
