"""Resident host inputs: fresh host values written where the executable reads them.

On a device whose zero-copy put aliases host memory (the CPU), a slot is a
64-byte-aligned staging buffer with, made once, a device array over each
leaf's view of it (`LeafLayout`s). A call writes its host values into a
free slot and hands the signature's own executable the slot's arrays: no
transfer at all. A slot is free again once the last call that read it is
done, which its *fence* tells: that call's smallest output, kept by the slot
until it is reused (its bytes count in the slot's cost), since every output
of a computation is ready exactly when the computation is. A fence that
was deleted (donated elsewhere) cannot tell, so its slot is retired; after
`ResidentSlots.MAX_RETIRED` retired slots the signature goes back to its
per-leaf record (the pool's `on_broken`). At most `RESIDENT_CAP` slots per
signature, within `SIGNATURE_MAX_BYTES` (slots and fences; one slot at
least) and, for every pool of the process together, `PROCESS_MAX_BYTES`; a
call that finds none free takes the per-leaf path. The first
resident call checks that no output aliases a slot (XLA's outputs are new
buffers unless donated, and nothing here donates).

A leaf of `COMPARE_MIN_BYTES` or more is compared with what its slot holds
and written only if it differs. Once every compared leaf has been unchanged
for `SPECULATE_AFTER` calls in a row, a call writes only the other leaves, runs,
and compares while the computation runs; a difference drops that run and
takes the puts.

Writes: a call that writes `WAKE_MIN_BYTES` to `WAKE_MAX_BYTES` while the
signature's last computation is done, as it was at the call before
(`WAKE_AFTER_IDLE`: a loop waiting for every call), first dispatches a
trivial computation (`_waker`), so the runtime's worker thread wakes while
the values are written; a signature that writes `ROTATE_MIN_BYTES` or more
on every call keeps `ROTATE_SLOTS` slots and writes the one used longest ago.
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import ALIGN, align_up
from nbjit.core.codegen import Source, run_source
from nbjit.core.record import FastPath, Unsupported, build_record
from nbjit.host.layout import (
    FLOAT32_MAX,
    LeafLayout,
    Refused,
    Watched,
    buffer_nbytes,
    guard_and_pop,
    lay_out,
    write_leaf,
)

__all__ = ["COMPARE_MIN_BYTES", "PROBE_EVERY", "PROCESS_MAX_BYTES", "RESIDENT_CAP",
           "ROTATE_MIN_BYTES", "ROTATE_SLOTS",
           "SIGNATURE_MAX_BYTES", "SPECULATE_AFTER", "WAKE_AFTER_IDLE", "WAKE_MAX_BYTES",
           "WAKE_MIN_BYTES",
           "WRITE_AFTER", "ResidentSlots",
           "resident_bytes", "resident_record"]

RESIDENT_CAP = 32  # slots per signature (calls in flight beyond: per-leaf puts)
# What one signature's slots may hold, their fences (the outputs they keep
# alive) included: at least one slot, more only within this.
SIGNATURE_MAX_BYTES = 32 << 20
# What every signature's slots hold together, in this process: a slot that
# would pass it is not made (that call takes the per-leaf puts).
PROCESS_MAX_BYTES = 512 << 20
# From this size a leaf is compared with what its slot holds before it is
# written, and not written when equal. A compare costs about what a copy
# does, but leaves the slot's cache lines clean: a copy leaves them dirty in
# this core's cache, and the computation, on another thread, then reads them
# from there. Below this size the copy measured cheaper, from it the compare
# (docs/host-inputs.md). A new value usually differs in its first bytes,
# where the compare stops: it then costs the copy and the compare's Python
# (which WRITE_AFTER spares values that are new on every call).
COMPARE_MIN_BYTES = 64 << 10
# After this many calls in a row in which every compared leaf was unchanged,
# a call writes the other leaves, runs the executable on the slot, and
# compares while it runs. The runtime's worker thread, idle between calls,
# waits a few microseconds for new work and then sleeps; waking it costs far
# more than the compare (docs/host-inputs.md), so the call dispatches before
# anything that grows with the array. A leaf that then differs costs that run
# (its results are dropped, its outputs fence the slot, the call takes the
# puts) and ends the streak.
SPECULATE_AFTER = 4
# After this many calls in a row with a compared leaf changed, leaves are
# written without a compare (a compare that finds a difference still costs
# its Python before the dispatch, which can be enough to let the worker
# thread sleep), and compared again every PROBE_EVERY calls to notice
# values that stay.
WRITE_AFTER = 4
PROBE_EVERY = 16
# Bytes a call writes (every resident leaf together) from which, and below
# which, it wakes the runtime's worker first (`_emit_wake`). Below, the write is
# shorter than the worker's wait for new work; from WAKE_MAX_BYTES the
# computation's read of the freshly written bytes costs more than the wake.
WAKE_MIN_BYTES = 16 << 10
WAKE_MAX_BYTES = 1 << 20
# Calls in a row that found the signature's last computation done before a
# call wakes the worker. The wake saves the worker's wake-up latency only
# where every call waits for it (a loop that blocks on each result); in a
# loop that blocks every few steps, the first call after the wait would pay
# for a second wake-up of the runtime's threads (on a busy machine, one more
# chance to be preempted while they start) for a gain of one latency per wait.
WAKE_AFTER_IDLE = 2
# A signature that writes ROTATE_MIN_BYTES or more on every call (none of its
# leaves compared, or new values on WRITE_AFTER calls in a row) keeps
# ROTATE_SLOTS slots and writes the least recently used: the slot the last
# call's computation read is still in the worker core's cache, and writing it
# again first takes those lines back from there (docs/host-inputs.md).
ROTATE_MIN_BYTES = 16 << 10
ROTATE_SLOTS = 3
_WAKE_LEAVES = 2048  # float32s summed: enough work that the runtime does not run it inline
_wakers: dict[Any, Callable[[], Any] | None] = {}

_held = [0]  # bytes of every live pool's slots and fences (under _held_lock)
_held_lock = threading.Lock()


def resident_bytes() -> int:
    """Bytes the resident slots of this process hold (staging and fences)."""
    return _held[0]


def _reserve(nbytes: int) -> bool:
    with _held_lock:
        if _held[0] + nbytes > PROCESS_MAX_BYTES:
            return False
        _held[0] += nbytes
        return True


def _release(cell: list) -> None:
    """Gives back what a pool held (at its death, or when it gives its slots up)."""
    with _held_lock:
        _held[0] -= cell[0]
        cell[0] = 0



_RETIRED = object()  # the fence of a slot that is never used again


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


class ResidentSlots:
    """The slots of one resident record (see the module's docstring).

    A slot is a list laid out as `slot_layout` (a `SlotLayout`) says. `free`
    is claimed with ``popleft`` and refilled with ``append`` (atomic under
    the GIL); `by_array` finds a slot from its first device array (the
    fence hook sees the call's inputs, nothing else). At most `cap` slots
    exist; a call that finds none free takes the per-leaf path.
    `on_broken`, given when the pool is made, is called once if the pool
    gives its slots up.
    """

    __slots__ = ("layouts", "avals", "sharding", "devices", "nbytes", "slot_bytes", "cap", "free",
                 "by_array", "made", "retired", "fence_index", "input_index", "broken", "on_broken",
                 "fence", "held", "streak", "counts", "slot_layout", "__weakref__")

    MAX_RETIRED = 8  # slots retired (deleted fences) before the signature gives slots up

    def __init__(self, layouts: list[LeafLayout], sharding: Any, fence_index: int,
                 input_index: int, on_broken: Callable[[], None] | None = None,
                 fence_bytes: int = 0) -> None:
        self.layouts = layouts
        self.slot_layout = SlotLayout(len(layouts))
        self.avals = [_jax.ShapedArray(s.shape, s.dtype, weak_type=s.weak) for s in layouts]
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.nbytes = nbytes = buffer_nbytes(layouts)
        # A slot costs its staging and the fence it keeps alive while free.
        self.slot_bytes = nbytes + ALIGN + fence_bytes
        self.cap = max(1, min(RESIDENT_CAP, SIGNATURE_MAX_BYTES // self.slot_bytes))
        self.held = [0]  # this pool's part of `resident_bytes()`
        weakref.finalize(self, _release, self.held)
        self.free: collections.deque = collections.deque()
        self.by_array: dict[int, list] = {}
        self.made = 0
        self.fence_index = fence_index
        self.input_index = input_index
        self.retired = 0
        self.broken = False
        self.on_broken = on_broken
        self.fence = self._make_fence()
        # Calls in a row whose compared leaves were all unchanged, and calls
        # in a row with one that changed (or written without a compare).
        self.streak = [0, 0]
        self.counts = [0, 0]  # runs before the compare; of those, compares that differed

    def new_slot(self) -> list | None:
        """A new slot, or None where a zero-copy put does not alias its view
        (or the process's slots already hold `PROCESS_MAX_BYTES`)."""
        if not _reserve(self.slot_bytes):
            return None
        slot = None
        try:
            slot = self._make_slot()
        finally:
            with _held_lock:
                if slot is None:
                    _held[0] -= self.slot_bytes
                else:
                    self.held[0] += self.slot_bytes
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
            if array.unsafe_buffer_pointer() != view.ctypes.data:
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
            if busy[SlotLayout.FENCE] is _RETIRED:
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
            except Exception:  # (out of memory: the slots there are do)
                return
            if slot is None:
                return
            self.free.append(slot)

    def retire(self, slot: list) -> None:
        """Never uses `slot` again (the runtime keeps its memory while anything reads it)."""
        if self.by_array.pop(id(slot[self.slot_layout.array(0)]), None) is not None:
            self.made -= 1
            with _held_lock:  # (the runtime frees its memory once nothing reads it)
                if not self.broken:  # (given up: `give_up` released every slot's bytes)
                    self.held[0] -= self.slot_bytes
                    _held[0] -= self.slot_bytes
            self.retired += 1
            if self.retired >= self.MAX_RETIRED:
                self.give_up()

    def give_up(self) -> None:
        """No slots from now on: `on_broken` sends the signature back to its per-leaf record."""
        self.broken = True
        self.cap = 0
        self.free.clear()
        _release(self.held)
        if (on_broken := self.on_broken) is not None:
            on_broken()

    def _make_fence(self) -> Callable[[Any, list], None]:
        """``fence(inputs, outs)``, after a hit: the slot the call read (if any)
        keeps its fence and is free again. The first fenced call checks its outputs."""
        scope = {"get": self.by_array.get, "append": self.free.append, "CHECKED": False}

        ref = weakref.ref(self)  # (the pool holds the fence: no cycle back)

        def first(slot: list, outs: list) -> None:
            pool = ref()
            if pool is not None and pool._check_outputs(slot, outs):
                scope["CHECKED"] = True
                pool.free.append(slot)

        scope["first"] = first
        src = Source()
        with src.block("def fence(inputs, outs):"):
            src.line(f"slot = get(id(x := inputs[{self.input_index}]))")
            with src.block(f"if slot is not None and slot[{self.slot_layout.array(0)}] is x:"):
                src.line(f"slot[{SlotLayout.FENCE}] = outs[{self.fence_index}]")
                with src.block("if CHECKED:"):
                    src.line("append(slot)")
                with src.block("else:"):
                    src.line("first(slot, outs)")
        return run_source(src.text(), "resident fence", scope)["fence"]

    def _check_outputs(self, slot: list, outs: list) -> bool:
        """Whether no output aliases the slot's memory (else slots are given up)."""
        staging = slot[SlotLayout.STAGING]
        start = staging.ctypes.data
        stop = start + staging.nbytes
        try:
            pointers = [o.unsafe_buffer_pointer() for o in outs if o.size]
        except Exception:
            pointers = [start]
        if any(start <= p < stop for p in pointers):
            # (Never seen: XLA's outputs are new buffers unless donated.) This
            # slot is never written again, so the caller's outputs stay valid.
            self.by_array.pop(id(slot[self.slot_layout.array(0)]), None)
            self.give_up()
            return False
        return True


def resident_record(watched: Watched, record: FastPath, leaves: list,
                    on_broken: Callable[[], None]) -> tuple[FastPath, ResidentSlots] | None:
    """`record` with resident host inputs and its slots, or None where they cannot be.

    `on_broken` is called if the slots are given up later (it must not hold
    the record: a generated function and its scope form a cycle, so what
    the scope holds, the pool, must not hold a record, or its executable
    waits for a gc pass).
    """
    # An empty leaf's put stays (nothing to write).
    layouts = lay_out([s for s in watched.resident_layouts if s.nbytes])
    fence = _fence(list(watched.fastpath.out_avals))
    if not layouts or fence is None:
        return None
    fence_index, fence_bytes = fence
    input_index = record.input_of(layouts[0].leaf)
    if input_index is None:  # (a host leaf of the record's is never pruned)
        return None
    pool = ResidentSlots(layouts, watched.sharding, fence_index, input_index, on_broken,
                         fence_bytes)
    slot = pool.claim(None)
    if slot is None:
        return None
    pool.free.append(slot)
    example = list(leaves)
    for s, array in zip(layouts, pool.slot_layout.arrays(slot), strict=True):
        example[s.leaf] = array
    try:
        inner = build_record(watched.fastpath, example, False)
    except Unsupported:
        return None
    if inner.executable is not record.executable:
        return None
    if any(inner.step_of(s.leaf) is not None for s in layouts):
        return None  # a slot array would be moved: not where the executable wants it
    speculative = any(map(_compared, layouts))  # (runs before its compare: SPECULATE_AFTER)
    written = sum(s.nbytes for s in layouts)
    rotate = written >= ROTATE_MIN_BYTES
    if rotate and not speculative:  # (written on every call: its spare slots now)
        pool.add_spares()
    wake = _waker(pool.devices[0]) if WAKE_MIN_BYTES <= written < WAKE_MAX_BYTES else None
    prepare = _resident_preparer(layouts, watched.n_leaves, inner, pool, record.prepare,
                                 speculative, rotate, wake)
    # The record over the slots' arrays, with the resident prepare (and, where
    # a prepare may run the executable itself, the execute that takes its results).
    resident = inner.replaced(prepare=prepare, fence=pool.fence,
                              execute=_speculating_execute(inner.execute) if speculative else None)
    return resident, pool


def _compared(layout: LeafLayout) -> bool:
    """Whether the leaf is compared with its slot before it is written (an
    array of COMPARE_MIN_BYTES or more, with a C library to compare)."""
    return layout.python is None and layout.nbytes >= COMPARE_MIN_BYTES and _memcmp is not None


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


def _resident_preparer(layouts: list[LeafLayout], n_leaves: int, inner: FastPath,
                       pool: ResidentSlots, fallback: Any, speculative: bool,
                       rotate: bool, wake: Callable[[], Any] | None) -> Any:
    """The prepare of a resident record: `rotate`, take spare slots once new
    values come on every call; `wake`, dispatched before the writes."""
    at = pool.slot_layout  # where a slot holds what
    names = [f"x{j}" for j in range(n_leaves)]
    arrays = {s.leaf: f"slot[{at.array(j)}]" for j, s in enumerate(layouts)}
    new_leaves = [arrays.get(j, names[j]) for j in range(n_leaves)]
    finish = (f"[{', '.join(new_leaves)}]" if inner.leaves_are_inputs
              else f"inner([{', '.join(new_leaves)}])")
    # The same bytes as the slot holds already: no write (see COMPARE_MIN_BYTES).
    compares = {j: f"same(slot[{at.address(j)}], {names[s.leaf]}, {s.nbytes}, D{j})"
                for j, s in enumerate(layouts) if _compared(s)}
    src = Source()

    def write(j: int) -> None:
        write_leaf(src, layouts[j], f"slot[{at.view(j)}]", names[layouts[j].leaf])

    with src.block("def prepare(leaves):"):
        src.line(f"{', '.join(names)}, = leaves")
        with guard_and_pop(src, "slot", "None"):
            with src.block(f"if (fence := slot[{at.FENCE}]) is not None:"):
                with src.block("try:"):
                    src.line("busy = not ready(fence)")
                with src.block("except Exception:  # a deleted fence cannot tell: "
                               "claim retires the slot"):
                    src.line(f"busy, slot[{at.FENCE}] = True, RETIRED")
                with src.block("if busy:"):
                    src.line("slot = claim(slot)")
        with src.block("if slot is None:  # every slot still read by a call in flight: "
                       "a put per leaf"):
            src.line("return fallback(leaves)")
        if speculative:  # (a leaf compared)
            _emit_speculate(src, [j for j in range(len(layouts)) if j not in compares], write,
                            finish, " and ".join(compares.values()))
        if wake:
            _emit_wake(src)
        with src.block("try:"):
            _emit_writes(src, len(layouts), write, compares, rotate)
        with src.block("except BaseException:"):
            src.lines(["append(slot)  # (its fence still holds: no call reads it)", "raise"])
        src.line(f"return {finish}")
    scope = {"unguarded": _jax.host_transfers_unguarded,
             "guard": _jax.transfer_guard_host_to_device, "Refused": Refused,
             "popleft": pool.free.popleft, "append": pool.free.append, "claim": pool.claim,
             "ready": _jax.ArrayImpl.is_ready, "RETIRED": _RETIRED, "fallback": fallback,
             "F32MAX": FLOAT32_MAX, "inner": inner.prepare, "pool": pool, "same": _unchanged,
             "streak": pool.streak, "WRITE_AFTER": WRITE_AFTER, "PROBE_EVERY": PROBE_EVERY,
             "free": pool.free, "wake": wake, "spare": pool.add_spares, "idle": [0],
             "WAKE_AFTER_IDLE": WAKE_AFTER_IDLE,
             **{f"D{j}": s.dtype for j, s in enumerate(layouts)}}
    if speculative:
        scope.update(counts=pool.counts, SPECULATE_AFTER=SPECULATE_AFTER, run=inner.execute,
                     RanInputs=RanInputs,
                     consume=_jax.ExecuteResults.consume_with_handlers,
                     handlers=inner.out_handlers, FENCE=pool.fence_index)
    # Out of its own scope: a function in its globals is a cycle, and this
    # scope may hold the executable (`run`), which must die with the record
    # without waiting for a gc pass.
    return run_source(src.text(), "resident prepare", scope).pop("prepare")


def _emit_writes(src: Source, n: int, write: Callable[[int], None], compares: dict[int, str],
                 rotate: bool) -> None:
    """The writes of the `n` leaves; with `compares` (leaf j -> its compare),
    each compared leaf is written only where it differs, except while new
    values come on every call (WRITE_AFTER calls in a row, probed every
    PROBE_EVERY), when they are written without a compare."""
    if not compares:
        for j in range(n):
            write(j)
        return
    with src.block("if streak[1] >= WRITE_AFTER and streak[1] % PROBE_EVERY:"):
        if rotate:
            with src.block("if streak[1] == WRITE_AFTER:"):
                src.line("spare()")
        src.line("streak[1] += 1")
        for j in range(n):
            write(j)
    with src.block("else:"):
        src.line("changed = False")
        for j in range(n):
            if j not in compares:
                write(j)
                continue
            with src.block(f"if not {compares[j]}:"):
                src.line("changed = True")
                write(j)
        with src.block("if changed:"):
            src.lines(["streak[0] = 0", "streak[1] += 1"])
        with src.block("else:"):
            src.lines(["streak[0] += 1", "streak[1] = 0"])


def _emit_speculate(src: Source, small: list[int], write: Callable[[int], None], finish: str,
                    compare: str) -> None:
    """Every compared leaf unchanged for SPECULATE_AFTER calls in a row: the
    leaves that are not compared (`small`: small ones, Python scalars) are
    written, the executable runs on the slot, and the compare runs while it
    does. Equal: its results go back with the inputs (`RanInputs`), and
    the record's `execute` takes them. Not equal: that run's outputs fence the
    slot (it reads it), and this call takes the per-leaf puts. Either way
    the result is the executable's on the bytes the caller's values held
    during the call."""
    with src.block("if streak[0] >= SPECULATE_AFTER:"):
        if small:
            with src.block("try:"):
                for j in small:
                    write(j)
            with src.block("except BaseException:"):
                src.lines(["append(slot)", "raise"])
        with src.block("try:"):
            src.lines([f"inputs = {finish}", "results = run(inputs)"])
        with src.block("except Exception:  # (the puts' path raises what it raises, or runs)"):
            src.lines(["append(slot)", "streak[0] = 0", "return fallback(leaves)"])
        src.lines(["counts[0] += 1", "unchanged = False"])
        with src.block("try:"):
            src.line(f"unchanged = {compare}")
        with src.block("finally:"):
            with src.block("if not unchanged:"):
                src.lines(["streak[0], streak[1] = 0, 1", "counts[1] += 1",
                           f"slot[{SlotLayout.FENCE}] = consume(results, handlers)[FENCE]",
                           "append(slot)"])
        with src.block("if not unchanged:"):
            src.line("return fallback(leaves)")
        src.lines(["inputs = RanInputs(inputs)", "inputs.results = results", "return inputs"])


def _emit_wake(src: Source) -> None:
    """Writes of WAKE_MIN_BYTES to WAKE_MAX_BYTES: while this signature's
    last call is done (the runtime's worker thread idle, soon asleep), and
    was done at the call before too (WAKE_AFTER_IDLE calls in a row: a loop
    that waits for every call), a trivial computation is dispatched first,
    so the worker wakes while the values are written and takes the call's
    computation without sleeping in between. A loop that waits only every
    few calls finds it done once per wait: it is not woken there (see
    WAKE_AFTER_IDLE)."""
    with src.block("try:"):
        with src.block(f"if not free or ready(free[-1][{SlotLayout.FENCE}]):"):
            src.line("idle[0] += 1")
            with src.block("if idle[0] >= WAKE_AFTER_IDLE:"):
                src.line("wake()")
        with src.block("else:"):
            src.line("idle[0] = 0")
    with src.block("except Exception:  # (a retired or deleted fence, a slot taken meanwhile: "
                   "no wake)"):
        src.line("pass")


class RanInputs(list):
    """The inputs a resident prepare returns when it ran the executable on
    them already (before its compare): `results` are that run's, which the
    record's `execute` (`_speculating_execute`) hands back instead of running."""

    __slots__ = ("results",)
    results: Any


def _speculating_execute(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The `execute` of a resident record whose prepare may run the executable
    itself: inputs that already ran (`RanInputs`) give their results."""
    def execute(inputs: Any) -> Any:
        if type(inputs) is RanInputs:
            return inputs.results
        return run(inputs)

    return execute




def nbjit_wake_worker(v: Any) -> Any:  # (so named in compile logs)
    return v.sum()


def _waker(device: Any) -> Callable[[], Any] | None:
    """A call dispatching a trivial computation on `device`, made once per
    device (None where it cannot be compiled: no wake)."""
    try:
        return _wakers[device]
    except KeyError:
        pass
    if not _jax.cpu_async_dispatch():  # (no worker thread to wake)
        return _wakers.setdefault(device, None)
    waker = None
    try:
        ones = np.ones(_WAKE_LEAVES, np.float32)
        v = _jax.batched_device_put(_jax.ShapedArray(ones.shape, ones.dtype),
                                    _jax.SingleDeviceSharding(device), [ones], [device],
                                    True, True, _jax.COPY_DURING_CALL)
        execute = _jax.compiled_execute(_jax.jax_jit(nbjit_wake_worker).lower(v).compile())
        arguments = [v]
        execute(arguments)
        waker = functools.partial(execute, arguments)
    except Exception:  # (a backend without it: calls just do not wake the worker first)
        waker = None
    return _wakers.setdefault(device, waker)


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    try:
        import ctypes

        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError):  # (no C library to load: always write)
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return memcmp


_memcmp = _libc_memcmp()


def _unchanged(address: int, x: Any, nbytes: int, dtype: np.dtype) -> bool:
    """Whether host value `x` has exactly the `nbytes` at `address` (a slot's
    view of `dtype`): same dtype, C order, the same bytes."""
    return (type(x) is np.ndarray and x.dtype is dtype and x.flags.c_contiguous
            and not _memcmp(address, x.__array_interface__["data"][0], nbytes))  # type: ignore[misc]
