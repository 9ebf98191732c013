"""Helpers for the tests of resident host inputs (tests/test_resident*.py,
tests/test_host_policy.py): the node a call hits, whether its record runs
resident, its slots, and calls with new values every time against jax.jit."""

from __future__ import annotations

import jax
import numpy as np
from _diff import assert_same_outputs

import nbjit
from nbjit.host import policy as _policy
from nbjit.host import slots as _slots

CALLS = 3 * _policy.ARM_AFTER  # enough fresh calls to go resident, then run resident


def node_of(f, *args, **kwargs):
    """The cache node the call ``f(*args, **kwargs)`` hits."""
    node, _ = f._entry_for(args, kwargs)
    assert node is not None
    return node


def is_resident(f, *args, **kwargs) -> bool:
    """Whether the call's record runs a resident prepare and fence."""
    record = node_of(f, *args, **kwargs).record
    return "<resident prepare " in record.prepare.__code__.co_filename and (
        record.fence is not None)


def pool_of(f, *args, **kwargs) -> _slots.ResidentSlots:
    """The slots of the call's resident record."""
    return node_of(f, *args, **kwargs).host_policy.resident


def run_fresh(fn, make_args, calls=CALLS, **jit_options):
    """Calls nbjit.jit(fn) and jax.jit(fn) with new values each call; returns
    (the nbjit one, the last call's arguments)."""
    f, g = nbjit.jit(fn, **jit_options), jax.jit(fn, **jit_options)
    for i in range(calls):
        args = make_args(i)
        assert_same_outputs(f(*args), g(*args))
    return f, args


def fresh_pair(i):
    """Two small float32 arrays holding values new at each `i`."""
    return np.full(3, i, np.float32), np.full(3, -i / 3, np.float32)
