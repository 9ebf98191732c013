"""One program on every process: a process-spanning miss is lowered without its
callers' frames, and compiled before it runs so that processes can agree on it.

From jaxlib 0.12.1 the collectives of a CPU execution pair by a launch id
derived from the executable's fingerprint, which covers the program's
metadata: the source locations of the stack that traced and lowered it
(jaxlib's own launch ids: docs/multi-controller.md). A process whose
first call came through another frame (a warm-up helper) compiles another
fingerprint, and every process hangs. `compile_ahead` traces the call from
`boundary.run`, then lowers and compiles it with each operation located at
its innermost frame of the user's code alone, the boundary's frame standing in
for the callers' (`_jax.locations_without_callers`), so equal calls compile
equal programs whatever called them; `agreement.check` then has the
processes agree on the program before `Program.run` lets JAX's miss run it
(JAX finds it compiled in its caches). When programs differ anyway,
`first_differing_line` says where their HLO texts part.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nbjit import _jax
from nbjit.core.profiler import profiler_hooks
from nbjit.multiprocess import boundary

__all__ = ["COMPILED", "Program", "compile_ahead", "first_differing_line", "pack", "run", "unpack"]

T = TypeVar("T")
_BOUNDARY = boundary.run.__code__
COMPILED = ("fingerprint ", "HLO hash ")  # how the text of a compiled program begins
_MAX_PACKED = 1 << 20  # bytes of compressed HLO one process sends for an error message
_CONTEXT = 90  # characters shown either side of where two HLO lines first differ


@dataclass(frozen=True)
class Program:
    """What this process compiled for a call, ahead of running it: `text`, its
    entry in the call's signature; `compiled`, JAX's executable (None when JAX
    raised); `failure`, what JAX raised here tracing or lowering it."""

    text: str
    compiled: Any
    failure: Exception | None

    def run(self, miss: Callable[[], T]) -> T:
        """JAX's miss of the call: it finds this program compiled (were it lowered
        again, it would be the same); where JAX raised, JAX's error as the call
        words it (with no program to keep, nothing is lowered at the boundary)."""
        return miss() if self.failure is not None else run(miss)

    def raise_failure(self) -> None:
        """Raises JAX's error for this process's call, if it had one: on a mismatch
        an error of a process's own call comes before AgreementError."""
        if self.failure is not None:
            raise self.failure

    def hlo(self) -> str:
        """The compiled program's HLO text (for an error message)."""
        return "" if self.compiled is None else _jax.executable_text(self.compiled)


def compile_ahead(jax_jitted: Any, args: tuple, kwargs: dict) -> tuple[Program | None, float]:
    """(the program JAX compiles for this call, or None where its call takes a route
    that cannot be compiled ahead; the seconds that took). JAX's error for the
    call is kept in the program, not raised: the other processes must still hear
    from this one."""
    start = time.perf_counter()
    try:
        with profiler_hooks().compile_span():
            compiled = boundary.run(
                lambda: _jax.compile_as_called(jax_jitted, args, kwargs, _BOUNDARY))
    except Exception as error:  # JAX's, for this call: raised once the processes agree
        failed = Program(f"none: JAX raised {type(error).__name__} here", None, error)
        return failed, time.perf_counter() - start
    seconds = time.perf_counter() - start
    return (None if compiled is None else Program(_text(compiled), compiled, None)), seconds


def _text(compiled: Any) -> str:
    fingerprint = _jax.executable_fingerprint(compiled)
    if fingerprint is None:  # a runtime without fingerprints: the program's text decides
        digest = hashlib.sha256(_jax.executable_text(compiled).encode()).hexdigest()
        return f"HLO hash {digest[:32]}"
    text = fingerprint.decode("ascii", "replace")  # jaxlib's are decimal digits
    return f"fingerprint {text if text.isalnum() else fingerprint.hex()}"


def run(miss: Callable[[], T]) -> T:
    """JAX's miss of a process-spanning call, lowered (if it lowers) as
    `compile_ahead` lowers: its source locations stop at the boundary."""
    with _jax.locations_without_callers(_BOUNDARY):
        return boundary.run(miss)


# ---------------------------------------------------------------------------
# Where two programs differ (an AgreementError's message)


def pack(text: str) -> str:
    """`text` compressed for the key-value store; empty when too large to send."""
    packed = base64.b64encode(zlib.compress(text.encode(), 6)).decode("ascii")
    return packed if len(packed) <= _MAX_PACKED else ""


def unpack(packed: str | None) -> str | None:
    if not packed:
        return None
    try:
        return zlib.decompress(base64.b64decode(packed)).decode()
    except (binascii.Error, zlib.error, UnicodeDecodeError):
        return None


def first_differing_line(mine: str, theirs: str | None, who: str) -> str:
    """A sentence naming the first line where this process's HLO (`mine`) and
    `who`'s (`theirs`; None: it did not arrive) differ, both lines shown."""
    if theirs is None:
        return (f"The HLO of {who}'s program did not arrive (too large to send, or that "
                "process did not send it), so where they differ is not shown.")
    a, b = mine.splitlines(), theirs.splitlines()
    for number, (x, y) in enumerate(zip(a, b, strict=False), 1):
        if x != y:
            column = len(os.path.commonprefix([x, y]))
            return (f"Their HLO first differs at line {number}: here `{_around(x, column)}`, "
                    f"{who}: `{_around(y, column)}`.")
    if len(a) != len(b):
        return f"Their HLO is the same up to line {min(len(a), len(b))}, where one ends."
    return "Their HLO texts are equal: the fingerprints differ in what the text leaves out."


def _around(line: str, column: int) -> str:
    start, end = max(0, column - _CONTEXT), column + _CONTEXT
    return ("..." if start else "") + line[start:end].strip() + ("..." if end < len(line) else "")
