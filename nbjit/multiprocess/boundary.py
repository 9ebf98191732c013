"""The frame at which a process-spanning program's source locations stop.

Lowered under `_jax.locations_without_callers(run.__code__)`, JAX takes
this file for the user's code: an operation with no frame of the user's own
inside the traced function (a constant, the function's return, `jnp.sum`
jitted as it is) is located here, at one line on every process, instead of
at the line of whichever call traced it (`nbjit.multiprocess.program`).
Every frame of this file counts as the user's there, so nothing else
belongs in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["run"]

T = TypeVar("T")


def run(call: Callable[[], T]) -> T:
    """`call()`, from the frame that stands in for its callers' in source locations."""
    return call()
