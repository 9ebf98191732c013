"""Packed host inputs: a signature's small host leaves in one buffer, one put.

Where slots cannot be (a device with memory of its own), the small host
leaves are copied into one pooled staging buffer, put once, zero copy, and
a second executable runs:

    g(packed, *other_leaves) = f_jaxpr(*unpack(packed), *other_leaves)

where `f_jaxpr` is the very jaxpr JAX traced the signature to (not a new
trace of the Python function) and `unpack` slices and bitcasts the buffer
(uint32 words) back into each leaf (weak types restored). Its outputs are wrapped
by the original record's result handlers, so values, dtypes, weak types,
shardings, committedness and the tree are the original's.

`compile_packed` compiles it (on the calling thread, or on one of
`start_thread`'s, in the caller's trace context: `run_in_trace_context`);
when to do so is the policy's (`nbjit.host.policy`). Per call a packed
record claims a staging buffer from its `nbjit.host.staging.HostStaging`
pool (reused only once nothing else holds it) and writes every leaf into
its view.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from nbjit import _jax
from nbjit.core.codegen import Source, run_source
from nbjit.core.record import FastPath, Unsupported, build_record
from nbjit.host.layout import (
    FLOAT32_MAX,
    LeafLayout,
    Refused,
    Watched,
    buffer_nbytes,
    guard_and_pop,
    write_leaf,
)
from nbjit.host.staging import HostStaging

__all__ = ["POOL_CAP", "compile_packed", "run_in_trace_context", "start_thread", "wait"]

POOL_CAP = 64  # staging buffers pooled per packed record (calls in flight beyond: fresh ones)
POOL_MIN = 4  # however big: a loop keeps a few calls' transfers in flight
POOL_MAX_BYTES = 4 << 20  # a packed record's pooled staging buffers, in bytes (above POOL_MIN)


def unpack(layout: LeafLayout, packed: Any) -> Any:
    """`layout`'s value from the buffer of 32-bit words (traced inside `g`).

    Words, not bytes: an accelerator lays out a byte array in tiles, and
    regrouping every byte of a big leaf costs it far more than reading words
    (a leaf's offset is a multiple of `ALIGN`, so of 4). A leaf of 4-byte
    elements is its words bitcast; wider ones group words; narrower ones
    split them and drop the padding of the last word.
    """
    lax = jax.lax
    n = int(np.prod(layout.shape, dtype=np.int64))
    k = layout.dtype.itemsize
    dtype = layout.dtype
    if n == 0:
        value = lax.full(layout.shape, 0, dtype)
    else:
        start = layout.offset // 4
        words = lax.slice(packed, (start,), (start + -(-n * k // 4),))
        if dtype.kind == "c":
            part = np.dtype(f"f{k // 2}")
            parts = _from_words(words, n * 2, part)
            value = lax.complex(parts[0::2], parts[1::2])
        elif dtype == np.bool_:
            value = lax.ne(_from_words(words, n, np.dtype(np.uint8)), np.uint8(0))
        else:
            value = _from_words(words, n, dtype)
        value = value.reshape(layout.shape)
    return _jax.with_weak_type(value, True) if layout.weak else value


def _from_words(words: Any, n: int, dtype: np.dtype) -> Any:
    """The first `n` elements of `dtype` held in the uint32 `words` (1-D)."""
    lax = jax.lax
    k = dtype.itemsize
    if k == 4:
        return lax.bitcast_convert_type(words, dtype)
    if k > 4:
        return lax.bitcast_convert_type(words.reshape(n, k // 4), dtype)
    values = lax.bitcast_convert_type(words, dtype)  # (words, 4 // k)
    return values.reshape(-1)[:n]


def _packed_function(watched: Watched) -> Callable[..., Any]:
    """``g(packed, *other_leaves)``: the signature's jaxpr on the unpacked leaves."""
    layouts, n_leaves = watched.layouts, watched.n_leaves
    fun = _jax.jaxpr_as_fun(watched.jaxpr)
    constraints = watched.input_layouts or (None,) * len(layouts)

    def g(packed: Any, *rest: Any) -> Any:
        values: list = [None] * n_leaves
        for layout in layouts:
            values[layout.leaf] = unpack(layout, packed)
        # Each unpacked leaf is laid out as the original program's parameter
        # was (an accelerator tiles arrays; a leaf XLA were free to lay out
        # otherwise could be reduced in another order), then the barrier keeps
        # the slices/bitcasts out of f's fusions: f's computation reads
        # materialized inputs, as it reads parameters (a reduction fused with
        # its producer may sum in another order).
        unpacked = [values[s.leaf] if c is None else _jax.with_layout_constraint(values[s.leaf], c)
                    for s, c in zip(layouts, constraints, strict=True)]
        unpacked = jax.lax.optimization_barrier(unpacked)
        for layout, value in zip(layouts, unpacked, strict=True):
            values[layout.leaf] = value
        it = iter(rest)
        for j in range(n_leaves):
            if values[j] is None:
                values[j] = next(it)
        return fun(*values)

    g.__name__ = g.__qualname__ = f"packed_{watched.name}"  # what jax.log_compiles names
    return g


def compile_packed(watched: Watched, record: FastPath, leaves: list) -> FastPath | None:
    """`record` with packed host inputs (a second executable), or None where
    packing would not give the original's outputs or gains nothing. Raises
    what the compile raises."""
    layouts, n_leaves = watched.layouts, watched.n_leaves
    packed_leaves = {s.leaf for s in layouts}
    others = [leaves[j] for j in range(n_leaves) if j not in packed_leaves]
    nbytes = buffer_nbytes(layouts)
    staging = HostStaging(nbytes, [(s.offset, s.shape, s.dtype) for s in layouts],
                          min(POOL_CAP, max(POOL_MIN, POOL_MAX_BYTES // nbytes)))
    aval = _jax.ShapedArray((nbytes // 4,), np.dtype(np.uint32))
    sharding = watched.sharding
    devices = list(sharding.device_set)
    # The example's values never matter (its outputs are dropped): zeros.
    example = _jax.batched_device_put(aval, sharding, [np.zeros(nbytes // 4, np.uint32)], devices,
                                      False, False, _jax.COPY_DURING_CALL)
    jitted = _jax.jax_jit(_packed_function(watched), **watched.options)
    counters, start = watched.counters, time.perf_counter()
    try:
        _, fastpath, _ = _jax.cache_miss_of(jitted)(example, *others)
    finally:
        counters.packed_seconds += time.perf_counter() - start
        counters.packed_compiles += 1
    if fastpath is None:
        return None
    if (list(fastpath.out_avals) != list(watched.fastpath.out_avals)
            or list(fastpath.out_shardings) != list(watched.fastpath.out_shardings)):
        return None  # not the original's outputs: keep the original
    try:
        inner = build_record(fastpath, [example, *others], False)
    except Unsupported:
        return None
    if inner.uses_shard_args():
        return None  # JAX's shard_args among the steps: keep it simple
    if inner.input_of(0) is None:
        return None  # (every packed leaf unused: nothing to gain)
    if inner.step_of(0) is not None:
        return None  # the packed buffer itself would be moved: not one device
    prepare = _packed_preparer(layouts, n_leaves, inner, staging, aval, sharding, devices)
    return record.with_inputs_of(inner, prepare)


def _packed_preparer(layouts: tuple[LeafLayout, ...], n_leaves: int, inner: FastPath,
                     staging: HostStaging, aval: Any, sharding: Any, devices: list) -> Any:
    names = [f"x{j}" for j in range(n_leaves)]
    packed_leaves = {s.leaf for s in layouts}
    g_leaves = ["packed", *(names[j] for j in range(n_leaves) if j not in packed_leaves)]
    finish = (f"[{', '.join(g_leaves)}]" if inner.leaves_are_inputs
              else f"inner([{', '.join(g_leaves)}])")
    src = Source()
    with src.block("def prepare(leaves):"):
        src.line(f"{', '.join(names)}, = leaves")
        with guard_and_pop(src, "item", ""):
            with src.block("if getrefcount(item[0]) != FREE:"):
                src.lines(["append(item)", "item = claim()"])
        with src.block("try:"):
            # An item is (staging, *views): leaf j's view is item[1 + j].
            for j, s in enumerate(layouts, start=1):
                write_leaf(src, s, f"item[{j}]", names[s.leaf])
        with src.block("except BaseException:"):
            src.lines(["release(item)", "raise"])
        src.line("packed = put(AVAL, SHARDING, [item[0]], DEVICES, False, False, ZERO_COPY)")
        with src.block("if item[-1] is not None:  # pooled (an unpooled item ends with None): "
                       "back to the pool"):
            src.line("append(item)")
        src.line(f"return {finish}")
    scope = {"unguarded": _jax.host_transfers_unguarded,
             "guard": _jax.transfer_guard_host_to_device, "Refused": Refused,
             "popleft": staging.free.popleft, "append": staging.free.append,
             "claim": staging.claim, "release": staging.release,
             "getrefcount": sys.getrefcount, "FREE": staging.FREE_REFCOUNT,
             "put": _jax.batched_device_put, "AVAL": aval, "SHARDING": sharding,
             "DEVICES": devices, "ZERO_COPY": _jax.ZERO_COPY, "F32MAX": FLOAT32_MAX,
             "inner": inner.prepare, "staging": staging}
    return run_source(src.text(), "packed prepare", scope)["prepare"]


# ---------------------------------------------------------------------------
# Compiling on a thread of its own (XLA compiles without the GIL)


def run_in_trace_context(context: tuple, run: Callable[[], None]) -> bool:
    """Runs `run()` in the trace context `context` (a node's); False, without
    running it, where this thread cannot enter it.

    Every config State of `trace_context()` is set thread-locally to the
    context's value; then `run` runs only if this thread's `trace_context()`
    equals `context` entry for entry (a mesh, or another context manager
    that is not a State, cannot be entered here).
    """
    states = _jax.trace_context_states
    if len(states) != len(context):  # options registered since nbjit was imported
        states = _jax.refresh_trace_context_states()
        if len(states) != len(context):
            return False
    with contextlib.ExitStack() as stack:
        for state, value in zip(states, context, strict=True):
            if state is not None and state.value != value:
                stack.enter_context(state(value))
        if _jax.trace_context() != context:
            return False
        run()
        return True


_threads: set[threading.Thread] = set()  # background compiles in flight
_threads_lock = threading.Lock()


def start_thread(run: Callable[[], None]) -> None:
    """Runs `run()` on a daemon thread of its own, counted by `wait`."""

    def target() -> None:
        try:
            run()
        finally:
            with _threads_lock:
                _threads.discard(threading.current_thread())

    thread = threading.Thread(target=target, name="nbjit-pack", daemon=True)
    with _threads_lock:
        _threads.add(thread)
    thread.start()


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
