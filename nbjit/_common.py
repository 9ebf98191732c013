"""Helpers and constants every other nbjit module may use; imports nothing of nbjit's.

One definition of what several rooms need: the Python scalar types that
are host values, the 64-byte alignment the CPU client uses host memory in
place at, and an exception's chain and traceback without what is nbjit's
(`_jax.filter_dispatch_frames` uses them; JAX's frames are `_jax`'s).
Helpers that need JAX (the process label, the call site, function names,
aval text) live one step up, in `nbjit.observe.names`, below every
report and below multi-controller agreement.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import FrameType, TracebackType

PYTHON_SCALARS = frozenset({bool, int, float, complex})
"""Python scalars that are host values (not JAX's shape-polymorphic dims)."""

ALIGN = 64
"""Bytes: the CPU client uses host memory in place when it is aligned to this."""


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    try:
        import ctypes

        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError):  # no C library to load
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return memcmp


memcmp: Callable[[int, int, int], int] | None = _libc_memcmp()
"""The C library's ``memcmp(a, b, n)`` on two addresses (ctypes: it lets go of
the GIL), or None where there is none to load. It stops at the first byte
that differs, so telling new bytes from the last ones costs next to nothing;
only equal bytes are read to the end."""


def align_up(n: int, align: int = ALIGN) -> int:
    """The smallest multiple of `align` that is at least `n`."""
    return -(-n // align) * align


def warn_past(prefixes: tuple[str, ...], message: str, category: type[Warning]) -> None:
    """`warnings.warn` attributed to the first frame whose file is outside `prefixes`
    (the user's code, not nbjit's). Walked here: Python 3.11 has no
    `skip_file_prefixes`, and 3.12.1's still names the frame right above the caller
    when that one's file is to be skipped."""
    frame: FrameType | None = sys._getframe(1)
    level = 2  # stacklevel 2: this function's caller
    while frame is not None and frame.f_code.co_filename.startswith(prefixes):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _caught_in(error: BaseException) -> FrameType | None:
    """The frame that caught `error` (its traceback's outermost), or None."""
    tb = error.__traceback__
    return None if tb is None else tb.tb_frame


def drop_internal_links(error: BaseException, caller: FrameType | None, prefix: str) -> None:
    """Unlinks, from `error`'s chain, every exception nbjit caught itself (in
    a frame of a file under `prefix`, nbjit's directory).

    A binder that meets something it cannot handle (an unhashable static
    argument, a deleted input, a refused transfer) catches the exception and
    calls JAX's own path from its ``except`` clause, so whatever JAX raises
    there gets the caught one as ``__context__`` ("During handling of the
    above exception ..."): an exception jaxlib's C++ clears and jax.jit
    never shows. Such a link (an exception caught in nbjit's code, in a
    frame of this call: not on the stack from `caller` up) becomes the
    context jax.jit's error would have: the first exception down its
    context chain that the caller's stack is handling (the call was made in
    an ``except`` block), or none; a cause nbjit made of it
    (``raise ... from``) goes. Runs only when an exception leaves a jitted
    call, over its chain once.
    """
    on_stack = set()
    while caller is not None:
        on_stack.add(id(caller))
        caller = caller.f_back

    def internal(e: BaseException) -> bool:
        frame = _caught_in(e)
        return (frame is not None and id(frame) not in on_stack
                and frame.f_code.co_filename.startswith(prefix))

    def callers_own(e: BaseException | None) -> BaseException | None:
        while e is not None and id(_caught_in(e)) not in on_stack:
            e = e.__context__
        return e

    pending, seen = [error], set()
    while pending:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if e.__cause__ is not None and internal(e.__cause__):
            e.__cause__ = None
            e.__suppress_context__ = False
        if e.__context__ is not None and internal(e.__context__):
            e.__context__ = callers_own(e.__context__)
        pending.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def traceback_without(tb: TracebackType | None, prefix: str) -> TracebackType | None:
    """`tb` with the frames of files under `prefix` (nbjit's modules, its binders) left out."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(prefix):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out
