"""Interleaved rounds, the probes' way of timing variants side by side."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def interleaved(variants: dict[str, Any], measure: Callable[[Any], Any],
                rounds: int) -> dict[str, list]:
    """name -> what `measure(variant)` returned, round by round: every variant
    once a round, in alternating order, with the garbage collector off."""
    out: dict[str, list] = {k: [] for k in variants}
    names = list(variants)
    gc.disable()
    try:
        for r in range(rounds):
            for k in (names if r % 2 else names[::-1]):
                out[k].append(measure(variants[k]))
    finally:
        gc.enable()
    return out
