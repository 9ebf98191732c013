"""Fresh host values without a transfer per leaf: resident slots, else packing.

Every host leaf (a numpy array or scalar, a Python scalar) bound for one
device normally becomes its own device buffer, one put each. When a cached
signature keeps bringing new host values, its small host leaves take one
of two ways instead, tried in this order:

**Resident slots** (no compile; where a zero-copy put aliases host memory,
i.e. the CPU). A slot is a 64-byte-aligned staging buffer with, made once,
a device array over each leaf's view of it (each leaf at a 64-byte-aligned
offset, in its canonical dtype). A call writes its host values into a free
slot and runs the signature's own executable on the slot's arrays: no
transfer at all. A slot is free again once the last call that read it is
done, which its *fence* tells: that call's smallest output (at most
`FENCE_MAX_BYTES`), kept by the slot until it is reused, since every
output of a computation is ready exactly when the computation is. A fence
that was deleted (donated elsewhere) cannot tell, so its slot is retired;
after `ResidentSlots.MAX_RETIRED` retired slots the signature goes back to
its per-leaf puts. At most `RESIDENT_CAP` slots per signature; a call that
finds none free takes the per-leaf path. The first resident call checks
that no output aliases a slot (XLA's outputs are new buffers unless
donated, and nothing here donates).

**Packing** (where slots cannot be: a device with memory of its own). The
small host leaves are copied into one pooled staging buffer, put once,
zero copy, and a second executable runs:

    g(packed, *other_leaves) = f_jaxpr(*unpack(packed), *other_leaves)

where `f_jaxpr` is the very jaxpr JAX traced the signature to (not a new
trace of the Python function) and `unpack` slices and bitcasts the uint8
buffer back into each leaf (weak types restored). Its outputs are wrapped
by the original record's result handlers, so values, dtypes, weak types,
shardings, committedness and the tree are the original's.

Policy (`Plan.fresh`):
  * armed on a miss whose record has a host leaf that qualifies
    (`SLOT_MAX_BYTES` each, `TOTAL_MAX_BYTES` together; a dtype whose bits
    XLA stores as numpy does), all inputs and outputs on one device, no
    donation, no explicit in/out shardings; packing needs two such leaves
    (one leaf would still cost one put);
  * when the memo (`nbjit.core.record.HostInput`) has seen `PACK_AFTER` new
    values within ``2 * PACK_AFTER`` calls (leaves too big for a memo:
    after `PACK_AFTER` calls), the next call makes the slots (a few puts,
    once) and the node's record resident (`node.record = resident`, one
    attribute store; the hit path reads it once per call); where slots
    cannot be, it starts the compile of the packed executable on a thread
    of its own (XLA compiles without the GIL) and calls go on on the
    per-leaf path until it is done;
  * the thread compiles in the caller's exact trace context: it enters
    every config State of `trace_context()` with the node's value, then
    compiles only if its own `trace_context()` equals the node's context
    entry for entry. Where it does not (a context manager that is not a
    State, say), the next call compiles on the calling thread instead,
    costing that call a second compile as a miss would (`BACKGROUND =
    False` does that always);
  * a compile that fails leaves the signature on its per-leaf path for
    good; an interrupted one (KeyboardInterrupt) re-arms it.
Never: donation, effects (no fast path at all), debug_nans/infs (those
calls never reach a record), more than one device, explicit layouts (no
record either), dtypes not in `_PACKABLE`.

Per call a packed record claims a staging buffer from its
`nbjit.host.plan.HostStaging` pool (reused only once nothing else holds
it), a resident one a slot; either writes every leaf into its view
(numpy's casts, as jaxlib's conversion of a host value). A value the write
would not convert as jaxlib does (a Python float beyond float32's range,
an int that overflows), and any active host-to-device transfer guard, send
the call to JAX's own path, which converts, logs or raises as jax.jit does.

Switch: ``NBJIT_PACK_HOST_INPUTS=0`` in the environment (read at import),
or `set_enabled(False)` at run time (no new plans are armed; records
already resident or packed stay so until their entries are cleared);
`RESIDENT = False` skips slots (packing only, as on a device without them).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from nbjit import _jax
from nbjit.core.codegen import run_source
from nbjit.host import plan as _sharding

__all__ = ["PACK_AFTER", "SLOT_MAX_BYTES", "TOTAL_MAX_BYTES", "arm", "enabled", "set_enabled",
           "wait"]

PACK_AFTER = 8  # new host values seen (within 2 * PACK_AFTER calls) before packing
SLOT_MAX_BYTES = 64 << 10  # a bigger host leaf keeps its own put
TOTAL_MAX_BYTES = 256 << 10  # a packed buffer's size limit
# Compile the packed executable on a thread of its own (False: on the calling
# thread, at the call that finds packing due).
BACKGROUND = True
POOL_CAP = 64  # staging buffers pooled per packed record (calls in flight beyond: fresh ones)
POOL_MAX_BYTES = 4 << 20  # ... and at most this many bytes of them
# Resident host inputs (see "Resident slots"): tried before packing; False packs.
RESIDENT = True
RESIDENT_CAP = 32  # slots per signature (calls in flight beyond: per-leaf puts)
FENCE_MAX_BYTES = 64 << 10  # the output a slot keeps alive to know its call is done
_ALIGN = 64
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_COPY_DURING_CALL = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL

# numpy dtypes whose bytes XLA reads with the same bit layout (int4 & co. are
# packed two per byte by XLA, not by numpy: never packed).
_PACKABLE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128))
try:
    import ml_dtypes as _ml_dtypes

    _PACKABLE = _PACKABLE | {np.dtype(_ml_dtypes.bfloat16)}
except ImportError:  # pragma: no cover - jax depends on ml_dtypes
    pass

_enabled = os.environ.get("NBJIT_PACK_HOST_INPUTS", "1").strip().lower() not in (
    "0", "false", "no", "off")


def enabled() -> bool:
    """Whether new signatures may get packed host inputs."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turns packing of host inputs on or off for signatures compiled from now on."""
    global _enabled
    _enabled = bool(on)


class _Refused(Exception):
    """A packed call the staging write cannot take exactly: JAX's own path takes it."""


# ---------------------------------------------------------------------------
# Slots


@dataclasses.dataclass(frozen=True)
class _Slot:
    leaf: int  # index into the call's dynamic leaves
    offset: int  # byte offset in the packed buffer
    shape: tuple[int, ...]
    dtype: np.dtype
    weak: bool
    python: type | None  # the Python scalar type of this leaf, None for numpy values

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def unpack(self, packed: Any) -> Any:
        """This slot's value from the uint8 buffer (traced inside `g`)."""
        lax = jax.lax
        n = int(np.prod(self.shape, dtype=np.int64))
        k = self.dtype.itemsize
        dtype = self.dtype
        if n == 0:
            value = lax.full(self.shape, 0, dtype)
        else:
            seg = lax.slice(packed, (self.offset,), (self.offset + n * k,))
            if dtype == np.bool_:
                value = lax.ne(seg, lax.full_like(seg, 0))
            elif dtype.kind == "c":
                part = np.dtype(f"f{k // 2}")
                parts = lax.bitcast_convert_type(seg.reshape(n, 2, k // 2), part)
                value = lax.complex(parts[:, 0], parts[:, 1])
            elif k == 1:
                value = lax.bitcast_convert_type(seg, dtype)
            else:
                value = lax.bitcast_convert_type(seg.reshape(n, k), dtype)
            value = value.reshape(self.shape)
        return _jax.with_weak_type(value, True) if self.weak else value


def _write_source(slot: _Slot, j: int, x: str) -> str:
    """The statement writing leaf `x` into the item's view `j` (numpy converts)."""
    view = f"item[{j}]"
    if slot.python is float and slot.dtype == np.float32:
        # numpy warns where jaxlib's conversion (a C cast) is silent: JAX's path
        return (f"        if not -F32MAX <= {x} <= F32MAX and {x} == {x}:\n"
                f"            raise Refused\n        {view}[()] = {x}\n")
    if slot.python is complex and slot.dtype == np.complex64:
        return (f"        if not (-F32MAX <= {x}.real <= F32MAX"
                f" and -F32MAX <= {x}.imag <= F32MAX):\n"
                f"            raise Refused\n        {view}[()] = {x}\n")
    if slot.python is not None:
        return f"        {view}[()] = {x}\n"
    return f"        {view}[...] = {x}\n"


# Both preparers: a guarded transfer goes to JAX's path, then the oldest free
# buffer or slot is popped (or, with none free, claimed).
_GUARD_AND_POP = """\
    if guard.value is not None and not unguarded():
        raise Refused  # a guarded transfer: JAX's path logs or raises per leaf
    try:
        {item} = popleft()
    except IndexError:
        {item} = claim({busy})
    else:
"""

_PREPARE_TEMPLATE = """\
def prepare(leaves):
{unpack}""" + _GUARD_AND_POP.format(item="item", busy="") + """\
        if getrefcount(item[0]) != FREE:
            append(item)
            item = claim()
    try:
{writes}    except BaseException:
        release(item)
        raise
    packed = put(AVAL, SHARDING, [item[0]], DEVICES, False, False, ZERO_COPY)
    if item[-1] is not None:  # pooled (an unpooled item ends with None): back to the pool
        append(item)
    return {finish}
"""


# ---------------------------------------------------------------------------
# Plans


_IDLE, _DUE, _BUILDING, _DONE = range(4)


class Plan:
    """One node's packing: armed on its miss, built on its hot calls."""

    __slots__ = ("node_ref", "record", "jaxpr", "slots", "n_leaves", "options", "counters",
                 "out_avals", "out_shardings", "device_sharding", "state", "count",
                 "window_start", "lock", "builder", "counter", "name", "sync", "fastpath",
                 "resident", "seen", "calls", "__weakref__")

    def __init__(self, node: Any, record: Any, jaxpr: Any, slots: list[_Slot], n_leaves: int,
                 options: dict, counters: Any, fastpath: Any, device_sharding: Any) -> None:
        self.node_ref = weakref.ref(node)
        self.record = record
        self.jaxpr = jaxpr
        self.slots = slots
        self.n_leaves = n_leaves
        self.options = options
        self.counters = counters
        self.out_avals = list(fastpath.out_avals)
        self.out_shardings = list(fastpath.out_shardings)
        self.fastpath = fastpath
        self.resident: ResidentSlots | None = None
        self.device_sharding = device_sharding
        self.name = "function"
        self.sync = False  # compile on the calling thread (see `_start_background`)
        self.state = _IDLE
        self.count = 0
        self.window_start = 0
        self.seen: list[bytes] | None = None  # the last counted call's bytes (`counter`)
        self.calls = 0  # calls counted by `counter`
        self.lock = threading.Lock()
        self.builder = dataclasses.replace(
            record, prepare=_weak_prepare(self, "_build_then_prepare"))
        # For leaves without a memo (bigger than its limit) no memo miss says a
        # value is new: this record compares each call's bytes with the last
        # call's instead, until packing is due or given up.
        self.counter = dataclasses.replace(
            record, prepare=_weak_prepare(self, "_count_then_prepare"))

    def counts_calls(self) -> bool:
        """Whether a packed leaf has no memo (so no memo miss announces new values)."""
        return any(not h.memo for h in self.hosts())

    def hosts(self) -> list:
        return [s for s in self.record.step_objects() if getattr(s, "on_fresh", None) is not None]

    def fresh(self) -> None:
        """A host leaf of this signature brought a new value (the memo missed)."""
        if self.state != _IDLE or not _enabled:
            return
        node = self.node_ref()
        if node is None:
            return
        hits = node.hits
        if not 0 <= hits - self.window_start <= 2 * PACK_AFTER:
            self.window_start = hits
            self.count = 0
        self.count += 1
        if self.count >= PACK_AFTER and node.record is self.record:
            self.state = _DUE
            node.record = self.builder  # the next call builds, then runs as before

    def _count_then_prepare(self, leaves: list) -> list:
        """Counts the calls whose packable values differ from the last call's
        bytes: the same arrays every call are not fresh values and get no slots.
        Packing is due after `PACK_AFTER` new values; with fewer within
        ``2 * PACK_AFTER`` calls the node goes back to its plain record for
        good, so comparing (a copy of up to `TOTAL_MAX_BYTES`) costs only the
        first calls of a signature."""
        node = self.node_ref()
        seen = [np.asarray(leaves[s.leaf]).tobytes() for s in self.slots]
        if seen != self.seen:
            self.count += 1
        self.seen, self.calls = seen, self.calls + 1
        if node is None or node.record is not self.counter:
            return self.record.prepare(leaves)
        if self.count >= PACK_AFTER:
            if self.state == _IDLE and _enabled:
                self.state = _DUE
                node.record = self.builder
            else:
                node.record = self.record
            self.seen = None
        elif self.calls >= 2 * PACK_AFTER:  # the same values come back
            node.record = self.record
            self.seen = None
        return self.record.prepare(leaves)

    def _build_then_prepare(self, leaves: list) -> list:
        if self.lock.acquire(blocking=False):
            try:
                if self.state == _DUE and RESIDENT and not self.sync:
                    self._try_resident(leaves)
                if self.state == _DUE and self.jaxpr is None:  # one leaf: nothing to pack
                    self.state = _DONE
                    node = self.node_ref()
                    if node is not None and node.record is self.builder:
                        node.record = self.record
                if self.state == _DUE:
                    if BACKGROUND and not self.sync:
                        self._start_background(leaves)
                    else:
                        self._build(leaves)
            finally:
                self.lock.release()
        return self.record.prepare(leaves)

    def _try_resident(self, leaves: list) -> None:
        """Makes the node's record resident (no compile) where this device allows it."""
        node = self.node_ref()
        if node is None:
            return
        try:
            record = _resident_record(self, leaves)
        except Exception:  # never breaks a call: packing (or today's path) goes on
            record = None
        if record is not None and node.record is self.builder:
            self.state = _DONE
            node.record = record  # one attribute store
            self.counters.resident += 1

    def _start_background(self, leaves: list) -> None:
        """Compiles on a thread of its own while calls take today's path.

        The thread enters the node's trace context (every config State of
        `trace_context()` set thread-locally to the node's value) and
        compiles only if its `trace_context()` then equals the node's,
        entry for entry; else (a mesh or another context manager that is
        not a State) the next call compiles on the calling thread.
        """
        node = self.node_ref()
        if node is None:
            return
        self.state = _BUILDING
        node.record = self.record  # calls go on as before meanwhile
        example = [_private(x) for x in leaves]  # (their values never matter)
        thread = threading.Thread(target=self._background, args=(example, node.context),
                                  name="nbjit-pack", daemon=True)
        with _threads_lock:
            _threads.add(thread)
        thread.start()

    def _background(self, leaves: list, context: tuple) -> None:
        try:
            with contextlib.ExitStack() as stack:
                for state, value in zip(_jax.trace_context_states, context, strict=True):
                    if state is not None and state.value != value:
                        stack.enter_context(state(value))
                if _jax.trace_context() != context:
                    self.sync, self.state = True, _DUE  # the next call compiles itself
                    node = self.node_ref()
                    if node is not None and node.record is self.record:
                        node.record = self.builder
                    return
                self.state = _DUE
                self._build(leaves, background=True)
        except BaseException:  # never lets a thread's error escape; today's path goes on
            self.state = _DONE
        finally:
            with _threads_lock:
                _threads.discard(threading.current_thread())

    def _build(self, leaves: list, background: bool = False) -> None:
        node = self.node_ref()
        current = self.record if background else self.builder  # what the node holds now
        self.state = _BUILDING
        packed = None
        try:
            packed = self._compile(leaves)
        except Exception:
            packed = None
        except BaseException:  # interrupted: today's path, armed again
            self.state, self.count, self.calls = _IDLE, 0, 0
            if node is not None and node.record is current:
                node.record = self.counter if self.counts_calls() else self.record
            if background:
                return
            raise
        self.state = _DONE
        if node is not None and node.record is current:
            node.record = self.record if packed is None else packed  # one attribute store

    def _compile(self, leaves: list) -> Any:
        from nbjit.core.record import Unsupported, build_record  # (nbjit.core.record imports us)

        slots = self.slots
        packed_leaves = {s.leaf for s in slots}
        others = [leaves[j] for j in range(self.n_leaves) if j not in packed_leaves]
        nbytes = _packed_nbytes(slots)
        staging = _sharding.HostStaging(nbytes, [(s.offset, s.shape, s.dtype) for s in slots],
                                        max(1, min(POOL_CAP, POOL_MAX_BYTES // nbytes)))
        aval = _jax.ShapedArray((nbytes,), np.dtype(np.uint8))
        sharding = self.device_sharding
        devices = list(sharding.device_set)
        # The example's values never matter (its outputs are dropped): zeros.
        example = _jax.batched_device_put(aval, sharding, [np.zeros(nbytes, np.uint8)], devices,
                                          False, False, _COPY_DURING_CALL)
        fun = _jax.jaxpr_as_fun(self.jaxpr)
        n_leaves = self.n_leaves

        def g(packed: Any, *rest: Any) -> Any:
            values: list = [None] * n_leaves
            for slot in slots:
                values[slot.leaf] = slot.unpack(packed)
            # The barrier keeps the slices/bitcasts out of f's fusions: f's
            # computation reads materialized inputs, as it reads parameters
            # (a reduction fused with its producer may sum in another order).
            unpacked = jax.lax.optimization_barrier([values[s.leaf] for s in slots])
            for slot, value in zip(slots, unpacked, strict=True):
                values[slot.leaf] = value
            it = iter(rest)
            for j in range(n_leaves):
                if values[j] is None:
                    values[j] = next(it)
            return fun(*values)

        g.__name__ = g.__qualname__ = f"packed_{self.name}"  # what jax.log_compiles names
        jitted = _jax.jax_jit(g, **self.options)
        start = time.perf_counter()
        try:
            _, fastpath, _ = _jax.cache_miss_of(jitted)(example, *others)
        finally:
            self.counters.packed_seconds += time.perf_counter() - start
            self.counters.packed_compiles += 1
        if fastpath is None:
            return None
        if (list(fastpath.out_avals) != self.out_avals
                or list(fastpath.out_shardings) != self.out_shardings):
            return None  # not the original's outputs: keep the original
        try:
            inner = build_record(fastpath, [example, *others], False)
        except Unsupported:
            return None
        steps = inner.step_objects()
        if any(getattr(s, "index", None) is None for s in steps):
            return None  # JAX's shard_args among the steps: keep it simple
        n_consts = len(inner.consts)
        if inner.kept is not None and 0 not in inner.kept:
            return None  # (every slot unused: nothing to gain)
        if any(s.index == n_consts for s in steps):
            return None  # the packed buffer itself would be moved: not one device
        prepare = _packed_preparer(slots, n_leaves, inner, staging, aval, sharding, devices)
        return dataclasses.replace(
            self.record, executable=inner.executable, execute=inner.execute,
            consts=inner.consts, kept=inner.kept, steps=inner.steps,
            leaves_are_inputs=False, prepare=prepare)


def _private(x: Any) -> Any:
    return x.copy() if type(x) is np.ndarray else x


_threads: set[threading.Thread] = set()  # background compiles in flight
_threads_lock = threading.Lock()


def wait(timeout: float | None = None) -> bool:
    """Waits for the background compiles in flight; True if none is left."""
    with _threads_lock:
        threads = list(_threads)
    for thread in threads:
        thread.join(timeout)
    with _threads_lock:
        return not _threads


# At exit, compiles still in flight are waited for (briefly): a daemon thread
# inside XLA while the runtime shuts down is best avoided.
atexit.register(wait, 10.0)


def _weak_prepare(plan: Plan, method: str) -> Any:
    """``prepare(leaves)`` calling `plan`'s `method`, holding the plan weakly: a
    plan's records refer back to it without a cycle (the node holds the plan;
    its executables, and JAX's caches keyed on its jaxpr, die with the node)."""
    ref = weakref.ref(plan)
    fallback = plan.record.prepare

    def prepare(leaves: list) -> list:
        live = ref()
        return fallback(leaves) if live is None else getattr(live, method)(leaves)

    return prepare


def _packed_nbytes(slots: list[_Slot]) -> int:
    end = max(s.offset + s.nbytes for s in slots)
    return max(_ALIGN, -(-end // _ALIGN) * _ALIGN)


def _packed_preparer(slots: list[_Slot], n_leaves: int, inner: Any, staging: Any, aval: Any,
                     sharding: Any, devices: list) -> Any:
    names = [f"x{j}" for j in range(n_leaves)]
    unpack = f"    {', '.join(names)}, = leaves\n"
    writes = "".join(_write_source(s, j, names[s.leaf]) for j, s in enumerate(slots, start=1))
    packed_leaves = {s.leaf for s in slots}
    g_leaves = ["packed", *(names[j] for j in range(n_leaves) if j not in packed_leaves)]
    finish = (f"[{', '.join(g_leaves)}]" if inner.leaves_are_inputs
              else f"inner([{', '.join(g_leaves)}])")
    source = _PREPARE_TEMPLATE.format(unpack=unpack, writes=writes, finish=finish)
    scope = {"unguarded": _jax.host_transfers_unguarded,
             "guard": _jax.transfer_guard_host_to_device, "Refused": _Refused,
             "popleft": staging.free.popleft, "append": staging.free.append,
             "claim": staging.claim, "release": staging.release,
             "getrefcount": sys.getrefcount, "FREE": staging.FREE_REFCOUNT,
             "put": _jax.batched_device_put, "AVAL": aval, "SHARDING": sharding,
             "DEVICES": devices, "ZERO_COPY": _jax.ZERO_COPY, "F32MAX": _FLOAT32_MAX,
             "inner": inner.prepare, "staging": staging}
    return run_source(source, "packed prepare", scope)["prepare"]


# ---------------------------------------------------------------------------
# Resident slots
#
# On a device whose zero-copy put aliases host memory (the CPU), a slot is a
# staging buffer with a device array over each leaf's view of it, made once.
# A call writes its host values into a free slot and hands the executable
# the slot's arrays: no transfer at all, and the signature's own executable.
# A slot is free once the last call that read it is done. That call's
# smallest output (the *fence*, kept by the slot) says so: every output of
# a computation is ready exactly when the computation is. A fence that was
# deleted (donated, say) says nothing, so its slot is never used again.


_RETIRED = object()  # the fence of a slot that is never used again

_RESIDENT_TEMPLATE = """\
def prepare(leaves):
{unpack}""" + _GUARD_AND_POP.format(item="slot", busy="None") + """\
        if (fence := slot[0]) is not None:
            try:
                busy = not ready(fence)
            except Exception:  # a deleted fence cannot tell: claim retires the slot
                busy, slot[0] = True, RETIRED
            if busy:
                slot = claim(slot)
    if slot is None:  # every slot still read by a call in flight: a put per leaf
        return fallback(leaves)
    try:
{writes}    except BaseException:
        append(slot)  # (its fence still holds: no call reads it)
        raise
    return {finish}
"""


class ResidentSlots:
    """The slots of one resident record (see the section's comment).

    A slot is a list ``[fence, *device arrays, *views, staging]``. `free`
    is claimed with ``popleft`` and refilled with ``append`` (atomic under
    the GIL); `by_array` finds a slot from its first device array (the
    fence hook sees the call's inputs, nothing else). At most `cap` slots
    exist; a call that finds none free takes the per-leaf path.
    """

    __slots__ = ("slots", "avals", "sharding", "devices", "nbytes", "cap", "free", "by_array",
                 "made", "retired", "fence_index", "input_index", "broken", "on_broken", "fence",
                 "__weakref__")

    MAX_RETIRED = 8  # slots retired (deleted fences) before the signature gives slots up

    def __init__(self, slots: list[_Slot], sharding: Any, fence_index: int,
                 input_index: int) -> None:
        self.slots = slots
        self.avals = [_jax.ShapedArray(s.shape, s.dtype, weak_type=s.weak) for s in slots]
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.nbytes = nbytes = _packed_nbytes(slots)
        self.cap = max(1, min(RESIDENT_CAP, POOL_MAX_BYTES // nbytes))
        self.free: collections.deque = collections.deque()
        self.by_array: dict[int, list] = {}
        self.made = 0
        self.fence_index = fence_index
        self.input_index = input_index
        self.retired = 0
        self.broken = False
        self.on_broken: Callable[[], None] | None = None
        self.fence = self._make_fence()

    def new_slot(self) -> list | None:
        """A new slot, or None where a zero-copy put does not alias its view."""
        raw = np.zeros(self.nbytes + _ALIGN, np.uint8)  # zeros: padding bytes are defined
        skip = -raw.ctypes.data % _ALIGN
        staging = raw[skip:skip + self.nbytes]
        views = [staging[s.offset:s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
                 for s in self.slots]
        arrays = []
        for view, aval in zip(views, self.avals, strict=True):
            array = _jax.batched_device_put(aval, self.sharding, [view], self.devices, False,
                                            False, _jax.ZERO_COPY)
            if array.unsafe_buffer_pointer() != view.ctypes.data:
                return None  # a copy (device memory, or a runtime that copies): no slots
            arrays.append(array)
        slot = [None, *arrays, *views, staging]
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
            if busy[0] is _RETIRED:
                self.retire(busy)
            else:
                self.free.append(busy)
        if self.made >= self.cap or self.broken:
            return None
        return self.new_slot()

    def retire(self, slot: list) -> None:
        """Never uses `slot` again (the runtime keeps its memory while anything reads it)."""
        if self.by_array.pop(id(slot[1]), None) is not None:
            self.made -= 1
            self.retired += 1
            if self.retired >= self.MAX_RETIRED:
                self.give_up()

    def give_up(self) -> None:
        """No slots from now on: the signature goes back to its per-leaf record."""
        self.broken = True
        self.cap = 0
        self.free.clear()
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
        source = (f"def fence(inputs, outs):\n"
                  f"    slot = get(id(x := inputs[{self.input_index}]))\n"
                  f"    if slot is not None and slot[1] is x:\n"
                  f"        slot[0] = outs[{self.fence_index}]\n"
                  f"        if CHECKED:\n"
                  f"            append(slot)\n"
                  f"        else:\n"
                  f"            first(slot, outs)\n")
        return run_source(source, "resident fence", scope)["fence"]

    def _check_outputs(self, slot: list, outs: list) -> bool:
        """Whether no output aliases the slot's memory (else slots are given up)."""
        staging = slot[-1]
        start = staging.ctypes.data
        stop = start + staging.nbytes
        try:
            pointers = [o.unsafe_buffer_pointer() for o in outs if o.size]
        except Exception:
            pointers = [start]
        if any(start <= p < stop for p in pointers):
            # (Never seen: XLA's outputs are new buffers unless donated.) This
            # slot is never written again, so the caller's outputs stay valid.
            self.by_array.pop(id(slot[1]), None)
            self.give_up()
            return False
        return True


def _resident_record(plan: Plan, leaves: list) -> Any:
    """The plan's record with resident host inputs, or None where they cannot be."""
    from nbjit.core.record import Unsupported, build_record  # (nbjit.core.record imports us)

    slots = [s for s in plan.slots if s.nbytes]  # an empty leaf's put stays (nothing to write)
    fence_index = _fence_index(plan.out_avals)
    if not slots or fence_index is None:
        return None
    record = plan.record
    # Offsets anew for the slots kept.
    kept_slots, offset = [], 0
    for s in slots:
        kept_slots.append(dataclasses.replace(s, offset=offset))
        offset += -(-s.nbytes // _ALIGN) * _ALIGN
    n_consts = len(record.consts)
    kept = record.kept
    first = kept_slots[0].leaf
    input_index = n_consts + (first if kept is None else kept.index(first))
    pool = ResidentSlots(kept_slots, plan.device_sharding, fence_index, input_index)
    slot = pool.claim(None)
    if slot is None:
        return None
    pool.free.append(slot)
    arrays = slot[1:1 + len(kept_slots)]
    example = list(leaves)
    for s, array in zip(kept_slots, arrays, strict=True):
        example[s.leaf] = array
    try:
        inner = build_record(plan.fastpath, example, False)
    except Unsupported:
        return None
    if inner.executable is not record.executable:
        return None
    moved = set()
    for step in inner.step_objects():
        moved.update(getattr(step, "indices", ()))
        if getattr(step, "index", None) is not None:
            moved.add(step.index)
    if any(n_consts + (s.leaf if kept is None else kept.index(s.leaf)) in moved
           for s in kept_slots):
        return None  # a slot array would be moved: not where the executable wants it
    prepare = _resident_preparer(kept_slots, plan.n_leaves, inner, pool, record.prepare)
    resident = dataclasses.replace(record, steps=inner.steps, prepare=prepare, fence=pool.fence)
    # A generated function and its scope form a cycle: what the scope holds
    # (the pool) must not hold a record, or its executable waits for a gc pass.
    plan_ref, fence = weakref.ref(plan), pool.fence

    def on_broken() -> None:
        live = plan_ref()
        node = None if live is None else live.node_ref()
        if node is not None and node.record.fence is fence:
            node.record = live.record

    pool.on_broken = on_broken
    plan.resident = pool
    return resident


def _fence_index(out_avals: list) -> int | None:
    """The smallest output no bigger than `FENCE_MAX_BYTES` (a slot keeps it alive)."""
    best, best_bytes = None, FENCE_MAX_BYTES + 1
    for i, aval in enumerate(out_avals):
        try:
            nbytes = int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        except TypeError:  # an extended dtype (PRNG keys): not a plain buffer
            continue
        if nbytes < best_bytes:
            best, best_bytes = i, nbytes
    return best


def _resident_preparer(slots: list[_Slot], n_leaves: int, inner: Any, pool: ResidentSlots,
                       fallback: Any) -> Any:
    names = [f"x{j}" for j in range(n_leaves)]
    unpack = f"    {', '.join(names)}, = leaves\n"
    m = len(slots)
    writes = "".join(_write_source(s, 1 + m + j, names[s.leaf]).replace("item[", "slot[")
                     for j, s in enumerate(slots))
    arrays = {s.leaf: f"slot[{1 + j}]" for j, s in enumerate(slots)}
    new_leaves = f"[{', '.join(arrays.get(j, names[j]) for j in range(n_leaves))}]"
    finish = new_leaves if inner.leaves_are_inputs else f"inner({new_leaves})"
    source = _RESIDENT_TEMPLATE.format(unpack=unpack, writes=writes, finish=finish)
    scope = {"unguarded": _jax.host_transfers_unguarded,
             "guard": _jax.transfer_guard_host_to_device, "Refused": _Refused,
             "popleft": pool.free.popleft, "append": pool.free.append, "claim": pool.claim,
             "ready": _jax.ArrayImpl.is_ready, "RETIRED": _RETIRED, "fallback": fallback,
             "F32MAX": _FLOAT32_MAX, "inner": inner.prepare, "pool": pool}
    return run_source(source, "resident prepare", scope)["prepare"]


# ---------------------------------------------------------------------------
# Arming (on a miss)


def arm(jitted: Any, node: Any, record: Any, fastpath: Any, leaves: list, args: tuple,
        kwargs: dict) -> Plan | None:
    """Arms packing for a freshly linked node if it qualifies (see the module docs)."""
    from nbjit.core.record import HostInput

    if not _enabled or jitted._donates or _jax.post_hook_state.value is not None:
        return None
    options = jitted._options
    if any(k in options for k in ("in_shardings", "out_shardings")):
        return None
    n_consts = len(record.consts)
    hosts = [s for s in record.step_objects() if type(s) is HostInput and s.index >= n_consts]
    if not hosts:
        return None
    shardings = list(fastpath.in_shardings) + list(fastpath.out_shardings)
    device_sharding = hosts[0].sharding
    if not all(type(s) is _jax.SingleDeviceSharding for s in shardings) or any(
            s.device_set != device_sharding.device_set for s in shardings):
        return None
    kept = record.kept
    slots, offset = [], 0
    for h in hosts:
        if h.dtype not in _PACKABLE:
            continue
        leaf = h.index - n_consts if kept is None else kept[h.index - n_consts]
        x = leaves[leaf]
        t = type(x)
        python = t if t in (bool, int, float, complex) else None
        slot = _Slot(leaf, offset, tuple(h.aval.shape), h.dtype, bool(h.aval.weak_type), python)
        if slot.nbytes > SLOT_MAX_BYTES or offset + slot.nbytes > TOTAL_MAX_BYTES:
            continue
        slots.append(slot)
        offset += -(-slot.nbytes // _ALIGN) * _ALIGN
    if not slots:
        return None
    jaxpr = None  # one slot: resident or nothing (packing one leaf gains nothing)
    if len(slots) >= 2:
        try:
            jaxpr = _jax.traced_jaxpr(jitted._jax_jitted, args, kwargs)
        except Exception:
            return None
        in_avals = list(jaxpr.in_avals)
        if len(in_avals) != len(leaves):
            return None
        for s in slots:
            a = in_avals[s.leaf]
            if (tuple(a.shape), np.dtype(a.dtype), bool(a.weak_type)) != (
                    s.shape, s.dtype, s.weak):
                return None
    g_options = {k: v for k, v in options.items()
                 if k in ("keep_unused", "device", "backend", "compiler_options")}
    plan = Plan(node, record, jaxpr, slots, len(leaves), g_options, jitted._counters,
                fastpath, device_sharding)
    plan.name = str(getattr(jitted, "__name__", "function"))
    packed_leaves = {s.leaf for s in slots}
    for h in hosts:
        leaf = h.index - n_consts if kept is None else kept[h.index - n_consts]
        if leaf in packed_leaves:
            h.on_fresh = weakref.WeakMethod(plan.fresh)
    node.plan = plan  # the plan lives as long as its node
    if plan.counts_calls():
        node.record = plan.counter
    return plan
