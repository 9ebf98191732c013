"""The host-input policy: one object per watched signature owns its host inputs' life.

Every host leaf (a numpy array or scalar, a Python scalar) bound for one
device normally becomes its own device buffer, one put each
(`nbjit.core.inputs.steps.HostInput`). When a cached signature keeps bringing
new host values on a device whose zero-copy put aliases host memory (the
CPU), its host leaves become resident instead (`nbjit.host.resident`: no
compile, no transfer; the signature's own executable reads slots of host
memory the call wrote).

After a miss, `nbjit.host.watch.on_miss` arms a `HostPolicy` for a
signature whose host leaves qualify, and the node holds it (`node.host_policy`).

The policy is the only code that asks for a node's record to be replaced
after the miss path inserted it, in one method (`HostPolicy._swap`, through
the cache's compare-and-swap `Namespace.replace_record`: the node's record
is replaced only if it is still the one the policy expects), and only along
`TRANSITIONS`:

  * PER_LEAF: a put per host leaf; the watching record's memos (built with
    `on_fresh` = this policy) report new values. After `ARM_AFTER` new
    values within ``2 * ARM_AFTER`` calls (leaves too big for a memo:
    `ARM_AFTER` calls whose bytes differ from the last call's, counted by
    the counting record, which gives up after ``2 * ARM_AFTER`` calls) -> ARMING.
  * ARMING: the next call makes the slots (a few puts, once) -> RESIDENT;
    where slots cannot be -> GIVEN_UP (armed at once for a big leaf: back
    to PER_LEAF, counting new values as above).
  * RESIDENT: slots given up (deleted fences, an output aliasing a slot)
    -> GIVEN_UP.

A value the slot write would not convert as jaxlib does (a Python float
beyond float32's range, an int that overflows), and any active
host-to-device transfer guard, send the call to JAX's own path, which
converts, logs or raises as jax.jit does.

Switch: ``NBJIT_PACK_HOST_INPUTS=0`` in the environment (read at import),
or `set_enabled(False)` at run time (no new policies are armed and none
moves on from PER_LEAF; records already resident stay so until their
entries are cleared).
"""

from __future__ import annotations

import enum
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nbjit.core.inputs.fallbacks import gave_up
from nbjit.core.inputs.steps import HostInput
from nbjit.core.record import FastPath, build_record
from nbjit.host import resident as _resident
from nbjit.host.layout import RESIDENT_SLOTS, Watched, host_counters
from nbjit.host.slots import ResidentSlots

__all__ = ["ARM_AFTER", "TRANSITIONS", "HostPolicy", "Stage", "enabled", "set_enabled"]

ARM_AFTER = 8  # new host values seen (within 2 * ARM_AFTER calls) before arming

_enabled = os.environ.get("NBJIT_PACK_HOST_INPUTS", "1").strip().lower() not in (
    "0", "false", "no", "off")


def enabled() -> bool:
    """Whether new signatures may get resident host inputs."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turns resident host inputs on or off for signatures from now on."""
    global _enabled
    _enabled = bool(on)


class Stage(enum.Enum):
    """Where a watched signature's host inputs are; the record each installs."""

    PER_LEAF = "per-leaf"  # the watching record (or the counting one): a put per leaf
    ARMING = "arming"  # the building record: the next call makes slots
    RESIDENT = "resident"  # the resident record: values written into slots, no transfer
    GIVEN_UP = "given up"  # the watching record, for good


S = Stage
# (from, to) -> why. `HostPolicy._swap` makes these moves and no others.
TRANSITIONS: dict[tuple[Stage, Stage], str] = {
    (S.PER_LEAF, S.PER_LEAF): "armed: the watching (or counting) record replaces the miss's;"
                              " or counting done: switched off, or the same values came back",
    (S.PER_LEAF, S.ARMING): "ARM_AFTER new values seen (by the memos, or by the counting"
                            " record's byte compare); or at once where slots may hold a"
                            " leaf too big for a memo (its put always costs more than"
                            " a copy into a slot)",
    (S.ARMING, S.PER_LEAF): "armed at once, but no slots: new values are counted as before",
    (S.ARMING, S.RESIDENT): "slots made",
    (S.ARMING, S.GIVEN_UP): "no slots",
    (S.RESIDENT, S.GIVEN_UP): "slots given up (deleted fences, an aliased output)",
}
del S

_swap_lock = threading.Lock()  # (swaps are rare: one lock for all policies)


class HostPolicy:
    """One watched signature's host inputs (see the module's docstring).

    `per_leaf` is the watching per-leaf record (its memos call `fresh`);
    `counter` and `builder` are that record with another `prepare` (count
    calls; make slots) and hold the policy weakly, so the node holds the
    policy (`node.host_policy`) and nothing holds it back.
    """

    __slots__ = ("node_ref", "watched", "per_leaf", "counter", "builder", "stage", "count",
                 "window_start", "lock", "resident", "seen", "calls", "eager", "__weakref__")

    def __init__(self, node: Any, watched: Watched, leaves: list,
                 fresh_leaves: list[int], eager: bool = False) -> None:
        self.node_ref = weakref.ref(node)
        self.watched = watched
        self.stage = Stage.PER_LEAF
        self.count = 0
        self.window_start = 0
        self.lock = threading.Lock()  # one call at a time makes slots
        self.resident: ResidentSlots | None = None
        self.seen: list[bytes] | None = None  # the last counted call's bytes (`counter`)
        self.calls = 0  # calls counted by `counter`
        # Arm at once (`install`): slots may hold a leaf too big for a memo,
        # whose put costs more than a copy into a slot, new value or not.
        self.eager = eager
        fresh = weakref.WeakMethod(self.fresh)
        self.per_leaf = build_record(watched.fastpath, leaves, False,
                                     on_fresh=dict.fromkeys(fresh_leaves, fresh))
        self.builder = self.per_leaf.replaced(
            prepare=_weak_prepare(self, HostPolicy._build_then_prepare))
        # For leaves without a memo (bigger than its limit) no memo miss says a
        # value is new: this record compares each call's bytes with the last
        # call's instead, until arming is due or given up.
        self.counter = self.per_leaf.replaced(
            prepare=_weak_prepare(self, HostPolicy._count_then_prepare))

    def _swap(self, expected: FastPath, stage: Stage, record: FastPath) -> bool:
        """The one place the policy replaces its node's record.

        Installs `record` (through the cache: `Namespace.replace_record`, a
        compare-and-swap under the cache's lock) and moves to `stage` only if
        the node still holds `expected` and ``(self.stage, stage)`` is in
        `TRANSITIONS`; False otherwise (nothing changes). The stage changes
        under `_swap_lock` alone, which is taken before the cache's lock.
        """
        with _swap_lock:
            node = self.node_ref()
            if node is None or (self.stage, stage) not in TRANSITIONS or (
                    not node.namespace.replace_record(node, expected, record)):
                return False
            self.stage = stage
            return True

    def install(self, miss_record: FastPath) -> bool:
        """Replaces the miss's record with the watching (or counting) one;
        eager, with the building one at once (the next call makes slots)."""
        watching = self._watching()
        if not self._swap(miss_record, Stage.PER_LEAF, watching):
            return False
        if self.eager:
            self._swap(watching, Stage.ARMING, self.builder)
        return True

    def _watching(self) -> FastPath:
        """PER_LEAF's record: the counting one where a watched leaf has no memo
        (no memo miss would announce its new values), else the watching one."""
        return self.counter if any(not h.memo for h in self.hosts()) else self.per_leaf

    def hosts(self) -> list[HostInput]:
        """The watched `HostInput` steps (those built with `on_fresh`)."""
        return [s for s in self.per_leaf.host_inputs().values() if s.on_fresh is not None]

    def fresh(self) -> None:
        """A watched host leaf brought a new value (its memo missed)."""
        if self.stage is not Stage.PER_LEAF or not _enabled:
            return
        node = self.node_ref()
        if node is None:
            return
        hits = node.hits
        if not 0 <= hits - self.window_start <= 2 * ARM_AFTER:
            self.window_start = hits
            self.count = 0
        self.count += 1
        if self.count >= ARM_AFTER:
            self._swap(self.per_leaf, Stage.ARMING, self.builder)  # the next call builds

    def _count_then_prepare(self, leaves: list) -> list:
        """Counts the calls whose watched values differ from the last call's
        bytes: the same arrays every call are not fresh values and get no slots.
        Arming is due after `ARM_AFTER` new values; with fewer within
        ``2 * ARM_AFTER`` calls the node goes back to its watching record for
        good, so comparing (a copy of up to `nbjit.host.watch.COUNTED_MAX_BYTES`)
        costs only the first calls of a signature."""
        seen = [np.asarray(leaves[layout.leaf]).tobytes() for layout in self.watched.layouts]
        if not seen:  # the leaves are too big to count: no new values to count
            self._swap(self.counter, Stage.PER_LEAF, self.per_leaf)
            return self.per_leaf.prepare(leaves)
        if seen != self.seen:
            self.count += 1
        self.seen, self.calls = seen, self.calls + 1
        if self.count >= ARM_AFTER:
            self.seen = None
            if _enabled:
                self._swap(self.counter, Stage.ARMING, self.builder)
            else:
                self._swap(self.counter, Stage.PER_LEAF, self.per_leaf)
        elif self.calls >= 2 * ARM_AFTER:  # the same values come back
            self.seen = None
            self._swap(self.counter, Stage.PER_LEAF, self.per_leaf)
        return self.per_leaf.prepare(leaves)

    def _build_then_prepare(self, leaves: list) -> list:
        if self.lock.acquire(blocking=False):
            try:
                self._arm(leaves)
            finally:
                self.lock.release()
        inputs = self.per_leaf.prepare(leaves)
        if self.stage is Stage.RESIDENT:  # the memos' last device copies: not read from now on
            for step in self.hosts():
                step.last = None
        return inputs

    def _arm(self, leaves: list) -> None:
        """ARMING: slots where they can be, else the per-leaf path."""
        if self.stage is not Stage.ARMING or self._try_resident(leaves):
            return
        if self.eager:  # armed for slots, not for new values: count them as before
            self.eager = False
            self._swap(self.builder, Stage.PER_LEAF, self._watching())
        else:
            self._swap(self.builder, Stage.GIVEN_UP, self.per_leaf)

    def _try_resident(self, leaves: list) -> bool:
        """Makes the node's record resident (no compile) where this device allows it."""
        try:
            made = _resident.resident_record(
                self.watched, self.per_leaf, leaves,
                _weak_call(self, HostPolicy._slots_broken))
        except Exception as error:  # never breaks a call: the per-leaf path goes on
            gave_up(RESIDENT_SLOTS, error, self.watched.counters)
            return False
        record, self.resident = made
        if not self._swap(self.builder, Stage.RESIDENT, record):
            return False
        host_counters(self.watched.counters).resident += 1
        return True

    def _slots_broken(self) -> None:
        """RESIDENT -> GIVEN_UP, if the node still runs this policy's slots."""
        node, pool = self.node_ref(), self.resident
        current = None if node is None else node.record
        if current is not None and pool is not None and current.fence is pool.fence:
            self._swap(current, Stage.GIVEN_UP, self.per_leaf)


def _weak_prepare(policy: HostPolicy, method: Callable[[HostPolicy, Any], list]
                  ) -> Callable[[Sequence[Any]], list]:
    """``prepare(leaves)`` calling `method` of `policy`, holding the policy
    weakly: a policy's records refer back to it without a cycle (the node
    holds the policy; its executables die with the node)."""
    ref = weakref.ref(policy)
    fallback = policy.per_leaf.prepare

    def prepare(leaves: Sequence[Any]) -> list:
        live = ref()
        return fallback(leaves) if live is None else method(live, leaves)

    return prepare


def _weak_call(policy: HostPolicy, method: Callable[[HostPolicy], None]) -> Callable[[], None]:
    """``call()`` calling `method` of `policy` if the policy is still alive."""
    ref = weakref.ref(policy)

    def call() -> None:
        live = ref()
        if live is not None:
            method(live)

    return call
