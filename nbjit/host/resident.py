"""Resident host inputs: fresh host values written where the executable reads them.

On a device whose zero-copy put aliases host memory (the CPU), a call
writes its host values into a free *slot* (`nbjit.host.slots`: host memory
with a device array over each leaf's view) and hands the signature's own
executable the slot's arrays: no transfer at all. `resident_record` makes
a signature's record so: its slots, its generated prepare
(`nbjit.host.resident_prepare`) and, for writes of `WAKE_MIN_BYTES` to
`WAKE_MAX_BYTES`, a trivial computation dispatched first to wake the
runtime's worker (`nbjit.host.waker`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from nbjit.core.inputs.fallbacks import gave_up
from nbjit.core.record import FastPath, Unsupported, build_record
from nbjit.host.layout import RESIDENT_SLOTS, Watched, lay_out
from nbjit.host.resident_prepare import compared, resident_preparer, speculating_execute
from nbjit.host.slots import ResidentSlots
from nbjit.host.waker import waker

__all__ = ["ROTATE_MIN_BYTES", "WAKE_MAX_BYTES", "WAKE_MIN_BYTES", "NoSlots", "resident_record"]

# Bytes a call writes (every resident leaf together) from which, and below
# which, it wakes the runtime's worker first. Below, the write is shorter
# than the worker's wait for new work; from WAKE_MAX_BYTES the computation's
# read of the freshly written bytes costs more than the wake.
WAKE_MIN_BYTES = 16 << 10
WAKE_MAX_BYTES = 1 << 20
# A signature that writes this much or more on every call (none of its
# leaves compared, or new values on WRITE_AFTER calls in a row) keeps
# `nbjit.host.slots.ROTATE_SLOTS` slots and writes the least recently used.
ROTATE_MIN_BYTES = 16 << 10


class NoSlots(Exception):
    """This signature's host inputs cannot be resident; `args[0]` says why."""


def resident_record(watched: Watched, record: FastPath, leaves: list,
                    on_broken: Callable[[], None]) -> tuple[FastPath, ResidentSlots]:
    """`record` with resident host inputs and its slots; `NoSlots` where they cannot be.

    The slots' fence is the smallest output (no output: no slots). The first
    resident call checks that no output aliases a slot (XLA's outputs are new
    buffers unless donated, and nothing here donates). `on_broken` is called
    if the slots are given up later (it must not hold the record: a
    generated function and its scope form a cycle, so what the scope holds,
    the pool, must not hold a record, or its executable waits for a gc pass).
    """
    # An empty leaf's put stays (nothing to write).
    layouts = lay_out([s for s in watched.resident_layouts if s.nbytes])
    fence = _fence(list(watched.fastpath.out_avals))
    if not layouts:
        raise NoSlots("no host leaf with bytes to write")
    if fence is None:
        raise NoSlots("no output to fence a slot with")
    fence_index, fence_bytes = fence
    input_index = record.input_of(layouts[0].leaf)
    if input_index is None:  # (a host leaf of the record's is never pruned)
        raise NoSlots("the first resident leaf is not an input")
    pool = ResidentSlots(layouts, watched.sharding, fence_index, input_index, on_broken,
                         fence_bytes, functools.partial(gave_up, counters=watched.counters))
    slot = pool.claim(None)
    if slot is None:
        raise NoSlots("no slot: the device copies a zero-copy put, or the process's"
                      " slots hold PROCESS_MAX_BYTES")
    pool.free.append(slot)
    example = list(leaves)
    for s, array in zip(layouts, pool.slot_layout.arrays(slot), strict=True):
        example[s.leaf] = array
    try:
        inner = build_record(watched.fastpath, example, False)
    except Unsupported as why:
        raise NoSlots(f"no record over the slots' arrays: {why.args[0]}") from why
    if inner.executable is not record.executable:
        raise NoSlots("the slots' arrays take another executable")
    if any(inner.step_of(s.leaf) is not None for s in layouts):
        raise NoSlots("a slot array would be moved: not where the executable wants it")
    speculative = any(map(compared, layouts))  # (runs before its compare)
    written = sum(s.nbytes for s in layouts)
    rotate = written >= ROTATE_MIN_BYTES
    if rotate and not speculative:  # (written on every call: its spare slots now)
        pool.add_spares()
    wake = waker(pool.devices[0]) if WAKE_MIN_BYTES <= written < WAKE_MAX_BYTES else None
    prepare = resident_preparer(layouts, watched.n_leaves, inner, pool, record.prepare,
                                speculative, rotate, wake)
    # The record over the slots' arrays, with the resident prepare (and, where
    # a prepare may run the executable itself, the execute that takes its results).
    resident = inner.replaced(prepare=prepare, fence=pool.fence,
                              execute=speculating_execute(inner.execute) if speculative else None,
                              host_path=RESIDENT_SLOTS)
    return resident, pool


def _fence(out_avals: list) -> tuple[int, int] | None:
    """(index, bytes) of the smallest output (a slot keeps it alive while free), or None."""
    best, best_bytes = None, 0
    for i, aval in enumerate(out_avals):
        try:
            nbytes = int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        except TypeError:  # an extended dtype (PRNG keys): not a plain buffer
            continue
        if best is None or nbytes < best_bytes:
            best, best_bytes = i, nbytes
    return None if best is None else (best, best_bytes)
