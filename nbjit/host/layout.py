"""How a signature's host leaves lie in one staging buffer.

Resident slots (`nbjit.host.resident`) write a signature's host leaves into
one 64-byte-aligned buffer, each leaf at an aligned offset in its canonical
dtype: one `LeafLayout` per leaf. This module holds the layouts, what may be
laid out (`PACKABLE`), what the policy knows of a watched signature
(`Watched`) and the generated statements that write a leaf into its view
(numpy converts, as jaxlib's conversion of a host value; a value it would
not convert as jaxlib does raises `Refused`: JAX's own path).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from nbjit._common import ALIGN, PYTHON_SCALARS, align_up
from nbjit.core.codegen import Source

__all__ = ["FLOAT32_MAX", "RESIDENT_SLOTS", "HostCounters", "LeafLayout", "PACKABLE", "Refused",
           "Watched", "buffer_nbytes", "guard_and_pop", "host_counters", "lay_out",
           "python_type", "write_leaf"]

FLOAT32_MAX = float(np.finfo(np.float32).max)

# The host room's way for a record's host leaves (`FastPath.host_path`, and
# the strategy named when it is given up).
RESIDENT_SLOTS = "resident slots"

# numpy dtypes whose bytes XLA reads with the same bit layout (int4 & co. are
# two per byte in XLA, not in numpy: never laid out).
PACKABLE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128))
try:
    import ml_dtypes as _ml_dtypes

    PACKABLE = PACKABLE | {np.dtype(_ml_dtypes.bfloat16)}
except ImportError:  # pragma: no cover - jax depends on ml_dtypes
    pass


class Refused(Exception):
    """A call the staging write cannot take exactly: JAX's own path takes it."""


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """Where one host leaf lies in a staging buffer, and what it is."""

    leaf: int  # index into the call's dynamic leaves
    offset: int  # byte offset in the buffer
    shape: tuple[int, ...]
    dtype: np.dtype
    weak: bool
    python: type | None  # the Python scalar type of this leaf, None for numpy values

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Watched:
    """What the host-input policy knows of one signature when it arms it
    (fixed from then on): JAX's fast-path data, the layouts of the small
    leaves whose bytes are counted (`layouts`) and of every resident leaf,
    the one device's sharding, and the jitted function's namespace counters
    (`nbjit.core.cache.Counters`: its host counters, `host_counters`, and
    the strategies given up)."""

    fastpath: Any
    layouts: tuple[LeafLayout, ...]  # small leaves, compared call to call while counting
    n_leaves: int
    sharding: Any
    counters: Any
    # What resident slots hold: any host leaf, up to `RESIDENT_MAX_BYTES` in all.
    resident_layouts: tuple[LeafLayout, ...] = ()


def lay_out(layouts: Sequence[LeafLayout]) -> list[LeafLayout]:
    """`layouts` with offsets anew, in order, each aligned."""
    placed, offset = [], 0
    for layout in layouts:
        placed.append(dataclasses.replace(layout, offset=offset))
        offset += align_up(layout.nbytes)
    return placed


def buffer_nbytes(layouts: Sequence[LeafLayout]) -> int:
    """The aligned size of a buffer holding `layouts` (at least `ALIGN`)."""
    end = max(layout.offset + layout.nbytes for layout in layouts)
    return max(ALIGN, align_up(end))


def write_leaf(src: Source, layout: LeafLayout, view: str, x: str) -> None:
    """Adds to `src` the statements writing leaf `x` into `view` (numpy converts)."""
    if layout.python is float and layout.dtype == np.float32:
        # numpy warns where jaxlib's conversion (a C cast) is silent: JAX's path
        with src.block(f"if not -F32MAX <= {x} <= F32MAX and {x} == {x}:"):
            src.line("raise Refused")
    elif layout.python is complex and layout.dtype == np.complex64:
        with src.block(f"if not (-F32MAX <= {x}.real <= F32MAX"
                       f" and -F32MAX <= {x}.imag <= F32MAX):"):
            src.line("raise Refused")
    src.line(f"{view}[{'()' if layout.python is not None else '...'}] = {x}")


def python_type(x: Any) -> type | None:
    """`x`'s type if it is a Python scalar (written with ``[()]``), else None."""
    t = type(x)
    return t if t in PYTHON_SCALARS else None


@contextlib.contextmanager
def guard_and_pop(src: Source, item: str, busy: str) -> Iterator[Source]:
    """Both preparers' first statements: a guarded transfer goes to JAX's
    path, then the oldest free buffer or slot is popped into `item` (or, with
    none free, claimed: ``claim(busy)``); what the ``with`` adds runs after a
    pop."""
    with src.block("if guard.value is not None and not unguarded():"):
        src.line("raise Refused  # a guarded transfer: JAX's path logs or raises per leaf")
    with src.block("try:"):
        src.line(f"{item} = popleft()")
    with src.block("except IndexError:"):
        src.line(f"{item} = claim({busy})")
    with src.block("else:"):
        yield src


class HostCounters:
    """The host room's counters for one cache namespace (`Counters.extension("host")`),
    reported by `nbjit.stats()`: signatures given resident host inputs (`policy`)."""

    __slots__ = ("resident",)

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.resident = 0

    def fields(self) -> dict[str, Any]:
        """The `nbjit.DispatchStats` fields they give."""
        return {"resident": self.resident}


def host_counters(counters: Any) -> HostCounters:
    """The host's counters inside a namespace's `nbjit.core.cache.Counters`."""
    return counters.extension("host", HostCounters)
