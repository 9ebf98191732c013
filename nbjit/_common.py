"""Helpers and constants every other nbjit module may use; imports nothing of nbjit's.

One definition of what several rooms need: the Python scalar types that
are host values, the 64-byte alignment the CPU client uses host memory in
place at. Helpers that need JAX (the process label, the call site, function
names, aval text) live one step up, in `nbjit.observe.names`, below every
report and below multi-controller agreement.
"""

from __future__ import annotations

PYTHON_SCALARS = frozenset({bool, int, float, complex})
"""Python scalars that are host values (not JAX's shape-polymorphic dims)."""

ALIGN = 64
"""Bytes: the CPU client uses host memory in place when it is aligned to this."""


def align_up(n: int, align: int = ALIGN) -> int:
    """The smallest multiple of `align` that is at least `n`."""
    return -(-n // align) * align
