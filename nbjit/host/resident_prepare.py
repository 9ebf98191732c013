"""A resident record's generated `prepare(leaves)`: the call's host leaves
written into a free slot, whose device arrays go to the executable.

Each emitter below adds its statements and returns the names they read,
which together are the generated function's scope. A leaf of
`COMPARE_MIN_BYTES` or more is compared with what its slot holds and
written only if it differs; while such leaves stay unchanged the executable
runs before the compare (`SPECULATE_AFTER`), and its results come back as
`RanInputs`, which the record's `execute` (`speculating_execute`) hands on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import memcmp
from nbjit.core.codegen import Source, run_source
from nbjit.core.record import FastPath
from nbjit.host.layout import FLOAT32_MAX, LeafLayout, Refused, guard_and_pop, write_leaf
from nbjit.host.slots import RETIRED, ResidentSlots, SlotLayout

__all__ = ["COMPARE_MIN_BYTES", "PROBE_EVERY", "SPECULATE_AFTER", "WAKE_AFTER_IDLE",
           "WRITE_AFTER", "RanInputs", "compared", "resident_preparer", "speculating_execute",
           "unchanged"]

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
# Calls in a row that found the signature's last computation done before a
# call wakes the worker. The wake saves the worker's wake-up latency only
# where every call waits for it (a loop that blocks on each result); in a
# loop that blocks every few steps, the first call after the wait would pay
# for a second wake-up of the runtime's threads (on a busy machine, one more
# chance to be preempted while they start) for a gain of one latency per wait.
WAKE_AFTER_IDLE = 2


def compared(layout: LeafLayout) -> bool:
    """Whether the leaf is compared with its slot before it is written (an
    array of COMPARE_MIN_BYTES or more, with a C library to compare)."""
    return layout.python is None and layout.nbytes >= COMPARE_MIN_BYTES and _memcmp is not None


def resident_preparer(layouts: list[LeafLayout], n_leaves: int, inner: FastPath,
                      pool: ResidentSlots, fallback: Any, speculative: bool,
                      rotate: bool, wake: Callable[[], Any] | None) -> Any:
    """The prepare of a resident record: `inner` is the record over the
    slots' arrays, `fallback` the per-leaf puts; `speculative`, run before
    the compare (a leaf compared); `rotate`, take spare slots once new
    values come on every call; `wake`, dispatched before the writes."""
    at = pool.slot_layout  # where a slot holds what
    names = [f"x{j}" for j in range(n_leaves)]
    arrays = {s.leaf: f"slot[{at.array(j)}]" for j, s in enumerate(layouts)}
    new_leaves = [arrays.get(j, names[j]) for j in range(n_leaves)]
    finish = (f"[{', '.join(new_leaves)}]" if inner.leaves_are_inputs
              else f"inner([{', '.join(new_leaves)}])")
    # The same bytes as the slot holds already: no write (see COMPARE_MIN_BYTES).
    compares = {j: f"same(slot[{at.address(j)}], {names[s.leaf]}, {s.nbytes}, D{j})"
                for j, s in enumerate(layouts) if compared(s)}
    src = Source()
    scope: dict[str, Any] = {"inner": inner.prepare, "append": pool.free.append,
                             "F32MAX": FLOAT32_MAX, "Refused": Refused}  # (`finish`, `write`)
    if compares:
        scope.update(same=unchanged, **{f"D{j}": layouts[j].dtype for j in compares})

    def write(j: int) -> None:
        write_leaf(src, layouts[j], f"slot[{at.view(j)}]", names[layouts[j].leaf])

    with src.block("def prepare(leaves):"):
        src.line(f"{', '.join(names)}, = leaves")
        scope.update(_emit_claim(src, pool, fallback))
        if speculative:  # (a leaf compared)
            scope.update(_emit_speculate(
                src, pool, inner, [j for j in range(len(layouts)) if j not in compares], write,
                finish, " and ".join(compares.values())))
        if wake:
            scope.update(_emit_wake(src, pool, wake))
        with src.block("try:"):
            scope.update(_emit_writes(src, pool, len(layouts), write, compares, rotate))
        with src.block("except BaseException:"):
            src.lines(["append(slot)  # (its fence still holds: no call reads it)", "raise"])
        src.line(f"return {finish}")
    # Out of its own scope: a function in its globals is a cycle, and this
    # scope may hold the executable (`run`), which must die with the record
    # without waiting for a gc pass.
    return run_source(src.text(), "resident prepare", scope, __name__).pop("prepare")


def _emit_claim(src: Source, pool: ResidentSlots, fallback: Any) -> dict[str, Any]:
    """A free slot into ``slot``: the oldest free one if its fence says its
    last call is done, else a new one (`ResidentSlots.claim`); none, the
    per-leaf puts (`fallback`)."""
    with guard_and_pop(src, "slot", "None"):
        with src.block(f"if (fence := slot[{SlotLayout.FENCE}]) is not None:"):
            with src.block("try:"):
                src.line("busy = not ready(fence)")
            with src.block("except RuntimeError:  # a deleted fence cannot tell: "
                           "claim retires the slot, and counts it"):
                src.line(f"busy, slot[{SlotLayout.FENCE}] = True, RETIRED")
            with src.block("if busy:"):
                src.line("slot = claim(slot)")
    with src.block("if slot is None:  # every slot still read by a call in flight: "
                   "a put per leaf"):
        src.line("return fallback(leaves)")
    return {"unguarded": _jax.host_transfers_unguarded,
            "guard": _jax.transfer_guard_host_to_device, "Refused": Refused,
            "popleft": pool.free.popleft, "claim": pool.claim, "ready": _jax.array_ready,
            "RETIRED": RETIRED, "fallback": fallback}


def _emit_writes(src: Source, pool: ResidentSlots, n: int, write: Callable[[int], None],
                 compares: dict[int, str], rotate: bool) -> dict[str, Any]:
    """The writes of the `n` leaves; with `compares` (leaf j -> its compare),
    each compared leaf is written only where it differs, except while new
    values come on every call (WRITE_AFTER calls in a row, probed every
    PROBE_EVERY), when they are written without a compare."""
    if not compares:
        for j in range(n):
            write(j)
        return {}
    with src.block("if streaks.changed >= WRITE_AFTER and streaks.changed % PROBE_EVERY:"):
        if rotate:
            with src.block("if streaks.changed == WRITE_AFTER:"):
                src.line("spare()")
        src.line("streaks.changed += 1")
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
            src.lines(["streaks.unchanged = 0", "streaks.changed += 1"])
        with src.block("else:"):
            src.lines(["streaks.unchanged += 1", "streaks.changed = 0"])
    return {"streaks": pool.streaks, "WRITE_AFTER": WRITE_AFTER, "PROBE_EVERY": PROBE_EVERY,
            "spare": pool.add_spares}


def _emit_speculate(src: Source, pool: ResidentSlots, inner: FastPath, small: list[int],
                    write: Callable[[int], None], finish: str, compare: str) -> dict[str, Any]:
    """Every compared leaf unchanged for SPECULATE_AFTER calls in a row: the
    leaves that are not compared (`small`: small ones, Python scalars) are
    written, the executable runs on the slot, and the compare runs while it
    does. Equal: the inputs go back as `RanInputs` carrying that run's
    results. Not equal: that run's outputs fence the slot (it reads it), and
    this call takes the per-leaf puts. Either way the result is the
    executable's on the bytes the caller's values held during the call."""
    with src.block("if streaks.unchanged >= SPECULATE_AFTER:"):
        if small:
            with src.block("try:"):
                for j in small:
                    write(j)
            with src.block("except BaseException:"):
                src.lines(["append(slot)", "raise"])
        with src.block("try:"):
            src.lines([f"inputs = {finish}", "results = run(inputs)"])
        with src.block("except BaseException:  # (JAX's path then takes the call)"):
            src.lines(["append(slot)", "streaks.unchanged = 0", "raise"])
        src.lines(["streaks.speculated += 1", "unchanged = False"])
        with src.block("try:"):
            src.line(f"unchanged = {compare}")
        with src.block("finally:"):
            with src.block("if not unchanged:"):
                src.lines(["streaks.unchanged, streaks.changed = 0, 1", "streaks.differed += 1",
                           f"slot[{SlotLayout.FENCE}] = consume(results, handlers)[FENCE]",
                           "append(slot)"])
        with src.block("if not unchanged:"):
            src.line("return fallback(leaves)")
        src.lines(["inputs = RanInputs(inputs)", "inputs.results = results", "return inputs"])
    return {"streaks": pool.streaks, "SPECULATE_AFTER": SPECULATE_AFTER,
            "run": inner.execute, "RanInputs": RanInputs,
            "consume": _jax.ExecuteResults.consume_with_handlers,
            "handlers": inner.out_handlers, "FENCE": pool.fence_index}


def _emit_wake(src: Source, pool: ResidentSlots, wake: Callable[[], Any]) -> dict[str, Any]:
    """Writes of `nbjit.host.resident.WAKE_MIN_BYTES` to `WAKE_MAX_BYTES`:
    while this signature's last call is done (the runtime's worker thread
    idle, soon asleep), and was done at the call before too (WAKE_AFTER_IDLE
    calls in a row: a loop that waits for every call), `wake` dispatches a
    trivial computation first (`nbjit.host.waker`), so the worker wakes
    while the values are written and takes the call's computation without
    sleeping in between. A loop that waits only every few calls finds it
    done once per wait: it is not woken there (see WAKE_AFTER_IDLE)."""
    with src.block("try:"):
        with src.block(f"if not free or (last := free[-1][{SlotLayout.FENCE}]) is None "
                       "or ready(last):  # (None: found done and dropped)"):
            src.line("streaks.idle += 1")
            with src.block("if streaks.idle >= WAKE_AFTER_IDLE:"):
                src.line("wake()")
        with src.block("else:"):
            src.line("streaks.idle = 0")
    # A spare slot's fence is None, a deleted one raises, and another thread
    # may take the last free slot meanwhile: this call does not wake.
    with src.block("except (TypeError, RuntimeError, IndexError):"):
        src.line("pass")
    return {"free": pool.free, "ready": _jax.array_ready, "wake": wake, "streaks": pool.streaks,
            "WAKE_AFTER_IDLE": WAKE_AFTER_IDLE}


class RanInputs(list):
    """The inputs a resident prepare returns when it ran the executable on
    them already (before its compare): `results` are that run's, which the
    record's `execute` (`speculating_execute`) hands back instead of running."""

    __slots__ = ("results",)
    results: Any


def speculating_execute(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The `execute` of a resident record whose prepare may run the executable
    itself: inputs that already ran (`RanInputs`) give their results."""
    def execute(inputs: Any) -> Any:
        if type(inputs) is RanInputs:
            return inputs.results
        return run(inputs)

    return execute


_memcmp = memcmp  # (None: no C library, every leaf written)


def unchanged(address: int, x: Any, nbytes: int, dtype: np.dtype) -> bool:
    """Whether host value `x` has exactly the `nbytes` at `address` (a slot's
    view of `dtype`): same dtype, C order, the same bytes."""
    return (type(x) is np.ndarray and x.dtype is dtype and x.flags.c_contiguous
            and not _memcmp(address, x.__array_interface__["data"][0], nbytes))  # type: ignore[misc]
