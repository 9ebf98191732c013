"""Resident slots: one signature's pool of host buffers that device arrays alias.

A slot is a 64-byte-aligned staging buffer with, made once, a zero-copy
device array over each leaf's view of it. A slot is free again once the
last call that read it is done, which its *fence* tells: that call's
smallest output, kept while that call may still run, since every output of
a computation is ready exactly when the computation is. A fence found ready
is dropped (`None`: the slot is free), when its slot is claimed and by a
sweeper thread every `SWEEP_EVERY_S` while pools live (`sweep_ready_fences`),
so that once the computations are done `jax.live_arrays()` lists each
slot's device arrays only, not the outputs the caller dropped. A fence
that was deleted cannot tell: its slot is retired, and after
`ResidentSlots.MAX_RETIRED` the pool gives its slots up. The bytes slots
and fences hold are bounded per signature and per process (`HeldBytes`);
a pool is freed with its record (no reference cycle holds it until a
collection).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import ALIGN, align_up
from nbjit.core.codegen import Source, run_source
from nbjit.core.inputs.fallbacks import gave_up
from nbjit.core.inputs.fallbacks import why as fallback_why
from nbjit.host.layout import RESIDENT_SLOTS, LeafLayout, buffer_nbytes

__all__ = ["PROCESS_MAX_BYTES", "RESIDENT_CAP", "RETIRED", "ROTATE_SLOTS", "SIGNATURE_MAX_BYTES",
           "CallStreaks", "HeldBytes", "ResidentSlots", "SWEEP_EVERY_S", "SlotLayout",
           "resident_bytes", "sweep_ready_fences"]

RESIDENT_CAP = 32  # slots per signature (calls in flight beyond: per-leaf puts)
# What one signature's slots may hold, their fences (the outputs they keep
# alive) included: at least one slot, more only within this.
SIGNATURE_MAX_BYTES = 32 << 20
# What every signature's slots hold together, in this process: a slot that
# would pass it is not made (that call takes the per-leaf puts).
PROCESS_MAX_BYTES = 512 << 20
# Slots a signature that writes on every call keeps (`ResidentSlots.add_spares`):
# a call takes the least recently used, since the slot the last call's
# computation read is still in the worker core's cache, and writing it again
# first takes those lines back from there (docs/host-inputs.md).
ROTATE_SLOTS = 3

RETIRED = object()  # the fence of a slot that is never used again
# How often the sweeper thread drops ready fences while pools live.
SWEEP_EVERY_S = 0.25


class HeldBytes:
    """The bytes one pool's slots and fences hold, and their part of the
    process's total (`resident_bytes()`, at most `PROCESS_MAX_BYTES`).

    Every change is made under one lock for every pool. Once `release`d
    (the pool died, or gave its slots up) the pool holds nothing and takes
    nothing more.
    """

    __slots__ = ("nbytes", "released")

    lock = threading.Lock()
    total = 0  # every live pool's bytes together

    def __init__(self) -> None:
        self.nbytes = 0
        self.released = False

    def take(self, nbytes: int) -> bool:
        """Counts `nbytes` more, unless that passes the process's bound."""
        with HeldBytes.lock:
            if self.released or HeldBytes.total + nbytes > PROCESS_MAX_BYTES:
                return False
            HeldBytes.total += nbytes
            self.nbytes += nbytes
            return True

    def give(self, nbytes: int) -> None:
        """Counts `nbytes` fewer (nothing once released: all were given back)."""
        with HeldBytes.lock:
            if not self.released:
                HeldBytes.total -= nbytes
                self.nbytes -= nbytes

    def release(self) -> None:
        """Gives back everything this pool holds, for good."""
        with HeldBytes.lock:
            if not self.released:
                HeldBytes.total -= self.nbytes
                self.nbytes = 0
                self.released = True


def resident_bytes() -> int:
    """Bytes the resident slots of this process hold (staging and fences)."""
    return HeldBytes.total


class SlotLayout:
    """What a slot of `n` leaves holds: a list (generated code reads it by a
    constant index) ``[fence, *arrays, *views, *addresses, staging]``, where
    leaf j (in the pool's `layouts` order) has device array ``array(j)``,
    host view ``view(j)`` and that view's address ``address(j)``; the
    fence (`FENCE`: the output that tells when the slot is free) comes first,
    the staging buffer (`STAGING`) last."""

    __slots__ = ("n",)

    FENCE = 0
    STAGING = -1

    def __init__(self, n: int) -> None:
        self.n = n

    def array(self, j: int) -> int:
        return 1 + j

    def view(self, j: int) -> int:
        return 1 + self.n + j

    def address(self, j: int) -> int:
        return 1 + 2 * self.n + j

    def make(self, arrays: list, views: list, staging: np.ndarray) -> list:
        """A new slot, its fence None."""
        return [None, *arrays, *views, *[view.ctypes.data for view in views], staging]

    def arrays(self, slot: list) -> list:
        return slot[self.array(0):self.array(self.n)]


class CallStreaks:
    """What a resident prepare (`nbjit.host.resident_prepare`) counts from call
    to call: calls in a row whose compared leaves were all `unchanged`, calls
    in a row with one `changed` (or written without a compare); runs of the
    executable before the compare (`speculated`) and, of those, compares that
    `differed`; calls in a row that found the last computation done (`idle`)."""

    __slots__ = ("unchanged", "changed", "speculated", "differed", "idle")

    def __init__(self) -> None:
        self.unchanged = self.changed = self.speculated = self.differed = self.idle = 0


class ResidentSlots:
    """The slots of one resident record (see the module's docstring).

    A slot is a list laid out as `slot_layout` (a `SlotLayout`) says. `free`
    is claimed with ``popleft`` and refilled with ``append`` (atomic under
    the GIL); `by_array` finds a slot from its first device array (the
    fence hook sees the call's inputs, nothing else). At most `cap` slots
    exist; a call that finds none free takes the per-leaf path.
    `on_broken`, given when the pool is made, is called once if the pool
    gives its slots up; `on_given_up(strategy, why)` is told why, then, and
    when spare slots cannot be made. `streaks` are the generated prepare's
    (`nbjit.host.resident_prepare`).
    """

    __slots__ = ("layouts", "avals", "sharding", "devices", "nbytes", "slot_bytes", "cap", "free",
                 "by_array", "made", "retired", "fence_index", "input_index", "broken", "on_broken",
                 "fence", "held", "streaks", "slot_layout", "on_given_up", "__weakref__")

    MAX_RETIRED = 8  # slots retired (deleted fences) before the signature gives slots up

    def __init__(self, layouts: list[LeafLayout], sharding: Any, fence_index: int,
                 input_index: int, on_broken: Callable[[], None] | None = None,
                 fence_bytes: int = 0,
                 on_given_up: Callable[[str, BaseException | str], None] | None = None) -> None:
        self.layouts = layouts
        self.slot_layout = SlotLayout(len(layouts))
        self.avals = [_jax.ShapedArray(s.shape, s.dtype, weak_type=s.weak) for s in layouts]
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.nbytes = nbytes = buffer_nbytes(layouts)
        # A slot costs its staging and the fence it keeps alive while free.
        self.slot_bytes = nbytes + ALIGN + fence_bytes
        self.cap = max(1, min(RESIDENT_CAP, SIGNATURE_MAX_BYTES // self.slot_bytes))
        self.held = HeldBytes()  # this pool's part of `resident_bytes()`
        weakref.finalize(self, self.held.release)
        _pools.add(self)  # (weakly: `sweep_ready_fences`)
        _start_sweeper()
        self.free: collections.deque = collections.deque()
        self.by_array: dict[int, list] = {}
        self.made = 0
        self.fence_index = fence_index
        self.input_index = input_index
        self.retired = 0
        self.broken = False
        self.on_broken = on_broken
        self.on_given_up = on_given_up
        self.fence = self._make_fence()
        self.streaks = CallStreaks()

    def new_slot(self) -> list | None:
        """A new slot, or None where a zero-copy put does not alias its view
        (or the process's slots already hold `PROCESS_MAX_BYTES`)."""
        if not self.held.take(self.slot_bytes):
            return None
        slot = None
        try:
            slot = self._make_slot()
        finally:
            if slot is None:
                self.held.give(self.slot_bytes)
        return slot

    def _make_slot(self) -> list | None:
        raw = np.zeros(self.nbytes + ALIGN, np.uint8)  # zeros: padding bytes are defined
        address = raw.ctypes.data
        skip = align_up(address) - address
        staging = raw[skip:skip + self.nbytes]
        views = [staging[s.offset:s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
                 for s in self.layouts]
        arrays = []
        for view, aval in zip(views, self.avals, strict=True):
            array = _jax.batched_device_put(aval, self.sharding, [view], self.devices, False,
                                            False, _jax.ZERO_COPY)
            if _jax.buffer_address(array) != view.ctypes.data:
                return None  # a copy (device memory, or a runtime that copies): no slots
            arrays.append(array)
        slot = self.slot_layout.make(arrays, views, staging)
        self.by_array[id(arrays[0])] = slot
        self.made += 1
        return slot

    def claim(self, busy: list | None) -> list | None:
        """A new slot under the cap, else None, after `busy` (the oldest free
        slot, popped and found still read) goes back to the pool or is retired.

        No other free slot is tried: they were freed later, so their calls
        were dispatched later and are the less likely to be done (a loop
        with many calls in flight would pay a readiness test per slot).
        """
        if busy is not None:
            if busy[SlotLayout.FENCE] is RETIRED:
                self.retire(busy)
            else:
                self.free.append(busy)
        if self.made >= self.cap or self.broken:
            return None
        return self.new_slot()

    def add_spares(self) -> None:
        """Free slots up to `ROTATE_SLOTS` (within the cap): a call takes the
        oldest free slot, so calls that write rotate through them."""
        while self.made < min(ROTATE_SLOTS, self.cap) and not self.broken:
            try:
                slot = self.new_slot()
            except Exception as error:  # (out of memory: the slots there are do)
                self._tell("spare slots", error)
                return
            if slot is None:
                return
            self.free.append(slot)

    def retire(self, slot: list) -> None:
        """Never uses `slot` again (the runtime keeps its memory while anything reads it)."""
        if self.by_array.pop(id(slot[self.slot_layout.array(0)]), None) is not None:
            self.made -= 1
            self.held.give(self.slot_bytes)  # (given up: every slot's bytes are back already)
            self.retired += 1
            if self.retired >= self.MAX_RETIRED:
                self.give_up(f"{self.retired} slots retired: their fences were deleted")

    def give_up(self, why: str) -> None:
        """No slots from now on, for `why`: `on_broken` sends the signature back
        to its per-leaf record."""
        self._tell(RESIDENT_SLOTS, why)
        self.broken = True
        self.cap = 0
        self.free.clear()
        self.held.release()
        if (on_broken := self.on_broken) is not None:
            on_broken()

    def _make_fence(self) -> Callable[[Any, list], None]:
        """``fence(inputs, outs)``, after a hit: the slot the call read (if any)
        keeps its fence and is free again. The first fenced call checks its outputs."""
        scope = {"get": self.by_array.get, "append": self.free.append, "CHECKED": False}

        ref = weakref.ref(self)  # (the pool holds the fence: no cycle back)

        def first(slot: list, outs: list) -> bool:
            """Whether the outputs were checked (and the slot is free again)."""
            pool = ref()
            if pool is not None and pool._check_outputs(slot, outs):
                pool.free.append(slot)
                return True
            return False

        scope["first"] = first
        src = Source()
        with src.block("def fence(inputs, outs):"):
            # (CHECKED set through the globals: `first` holding the scope would be a cycle)
            src.line("global CHECKED")
            src.line(f"slot = get(id(x := inputs[{self.input_index}]))")
            with src.block(f"if slot is not None and slot[{self.slot_layout.array(0)}] is x:"):
                src.line(f"slot[{SlotLayout.FENCE}] = outs[{self.fence_index}]")
                with src.block("if CHECKED:"):
                    src.line("append(slot)")
                with src.block("else:"):
                    src.line("CHECKED = first(slot, outs)")
        # Out of its own scope: a function in its globals is a cycle, which would
        # keep the slots (the scope's `get`, `append`) until a collection.
        return run_source(src.text(), "resident fence", scope, __name__).pop("fence")

    def drop_ready_fences(self) -> None:
        """Drops the fences of free slots whose computations are done (their slots
        are free: `None`), so that no output the caller dropped stays alive."""
        ready = _jax.array_ready
        for slot in tuple(self.free):  # (a copy: the deque may change meanwhile)
            fence = slot[SlotLayout.FENCE]
            # None, RETIRED, or a deleted fence (its claim retires the slot)
            if type(fence) is not _jax.ArrayImpl or fence.is_deleted():
                continue
            # No eval-breaker check falls between this test and the store, so
            # under the GIL no thread sets a newer fence in between (one that
            # claimed the slot after the copy above set its own: then skipped).
            if ready(fence) and slot[SlotLayout.FENCE] is fence:
                slot[SlotLayout.FENCE] = None

    def _check_outputs(self, slot: list, outs: list) -> bool:
        """Whether no output aliases the slot's memory (else slots are given up)."""
        staging = slot[SlotLayout.STAGING]
        start = staging.ctypes.data
        stop = start + staging.nbytes
        why = "an output aliases a slot"
        try:
            pointers = [_jax.buffer_address(o) for o in outs if o.size]
        except Exception as error:  # taken as aliasing, and said
            pointers, why = [start], f"outputs' addresses unread: {fallback_why(error)}"
        if any(start <= p < stop for p in pointers):
            # (Never seen: XLA's outputs are new buffers unless donated.) This
            # slot is never written again, so the caller's outputs stay valid.
            self.by_array.pop(id(slot[self.slot_layout.array(0)]), None)
            self.give_up(why)
            return False
        return True

    def _tell(self, strategy: str, why: BaseException | str) -> None:
        if (tell := self.on_given_up) is not None:
            tell(strategy, why)

_pools: weakref.WeakSet[ResidentSlots] = weakref.WeakSet()  # every live pool
_sweeper: threading.Thread | None = None  # the running sweeper, if any
_sweeper_lock = threading.Lock()


def sweep_ready_fences() -> None:
    """Drops every pool's fences that are ready (`ResidentSlots.drop_ready_fences`)."""
    for pool in list(_pools):
        pool.drop_ready_fences()


def _sweep_while_pools_live() -> None:
    """The sweeper: a loop that stops leaves its last calls' outputs as fences,
    which nothing asks about again until the signature's next call. Never
    from a gc callback: jaxlib 0.10.2 crashed when a collection inside its
    own code ran one that asked an array `is_ready`."""
    global _sweeper
    while True:
        time.sleep(SWEEP_EVERY_S)
        with _sweeper_lock:
            if not _pools:  # (a new pool starts another)
                _sweeper = None
                return
        try:
            sweep_ready_fences()
        except Exception as error:  # never dies of it: the next claim checks its fence anyway
            gave_up("the fence sweep", error, None)


def _start_sweeper() -> None:
    global _sweeper
    with _sweeper_lock:
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_while_pools_live, daemon=True,
                                        name="nbjit-resident-fences")
            _sweeper.start()
