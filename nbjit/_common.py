"""Helpers and constants every other nbjit module may use; imports nothing of nbjit's.

One definition of what several rooms need: the Python scalar types that
are host values, the 64-byte alignment the CPU client uses host memory in
place at. Helpers that need JAX (the process label, the call site, function
names, aval text) live one step up, in `nbjit.observe.names`, below every
report and below multi-controller agreement.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

PYTHON_SCALARS = frozenset({bool, int, float, complex})
"""Python scalars that are host values (not JAX's shape-polymorphic dims)."""

ALIGN = 64
"""Bytes: the CPU client uses host memory in place when it is aligned to this."""


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
