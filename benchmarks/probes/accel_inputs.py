"""Probe: where a big host input's microseconds go on an accelerator, and which
ways of putting it keep the guarantee (no write after the call changes a
result) at jax.jit's cost (run on a TPU or GPU; docs/host-inputs.md's
accelerator part is written from its output).

    python benchmarks/probes/accel_inputs.py [floors|safety|loop|profile ...]
                                             [--only WAY,...] [--json FILE]

--only keeps the loop's variants (and the floors' ways) named, plus jax.jit.

floors: one put of a numpy array (400 KiB, 3 MiB, 25 MiB) by each way, time
  until the call returns and until the device array is ready:
    zc_caller      the caller's array, ZERO_COPY (jax.jit's way: racy)
    staged_zc      a copy into a warm private buffer, then ZERO_COPY
    streamed_zc    the same copy with non-temporal stores (copy_kinds.py's
                   kernel), then ZERO_COPY
    during         the caller's array, IMMUTABLE_ONLY_DURING_CALL
    until          the caller's array, IMMUTABLE_UNTIL_TRANSFER_COMPLETES
    pinned         the caller's array copied into pinned host memory during
                   the call (a put to memory_kind="pinned_host"), then a
                   device copy of that (a DMA, no host copy)
    pinned_donate  the same, the pinned buffer donated to the device copy
safety: a write right after the put (while the device is busy), 60 tries per
  way and size: how many device values changed.
loop: the no-block MLP loop (new numpy batch from a pool of 8 each step),
  per-step time of hand-made input paths, each then jax.jit on device arrays,
  against jax.jit and nbjit on the numpy batch (interleaved rounds).
profile: where a profiled hit's time outside its five phases lies (before
  the first stamp, after the last), for the profile test's bound.
"""

# ruff: noqa: E731, B023  (a probe: small lambdas name the ways, called in the
# iteration of the loop that binds their names)

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src.lib import _jax as X

import nbjit
from nbjit.core.inputs.pools import BufferPool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_kinds import aligned, stream_copy  # noqa: E402

dev = jax.devices()[0]
S = jax.sharding.make_single_device_sharding(dev)
ZC = X.HostBufferSemantics.ZERO_COPY
DURING = X.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
UNTIL = X.HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES
try:
    PIN = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
except Exception:  # a backend without pinned host memory
    PIN = None
ALWAYS = X.ArrayCopySemantics.ALWAYS_COPY
DONATE = X.ArrayCopySemantics.DONATE_INPUT
RESULTS: dict = {"jax": jax.__version__, "device": f"{dev.platform} {dev.device_kind}",
                 "memory_kinds": [m.kind for m in dev.addressable_memories()]}


ONLY: set[str] = set()  # --only: the ways and variants kept (empty: all)


def log(*a) -> None:
    print(*a, flush=True)


def put(x, sharding, sem):
    aval = jcore.ShapedArray(x.shape, x.dtype)
    return X.batched_device_put(aval, sharding, [x], [dev], False, False, sem)


def to_device(p, cs=ALWAYS):
    return X.batched_copy_array_to_devices_with_sharding(
        [p], [S._internal_device_list], [S], [cs])[0]


def aligned_empty(shape, dtype):
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return aligned(nbytes).view(dtype).reshape(shape)


def streamed(dst, src):
    """copy_kinds.py's non-temporal copy, where both are whole blocks of 64 bytes."""
    if dst.nbytes % 64 or not src.flags.c_contiguous or src.dtype != dst.dtype:
        np.copyto(dst, src)
    else:
        stream_copy(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))


class Ring:
    """Warm private buffers, one reused once only its pool holds it
    (nbjit's `BufferPool`: its free count is measured, not counted by hand).
    Until 2026-12-06 this ring compared counts with a hand count one too low
    and never reused a buffer: every stage copied into a new array."""

    def __init__(self, shape, dtype, n=8, copy=np.copyto):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.pool = BufferPool(nbytes, lambda: aligned_empty(shape, dtype), n)
        warm = [self.pool.claim() for _ in range(n)]
        for b in warm:
            b.fill(0)
            self.pool.release(b)
        del warm, b
        self.copy = copy

    def stage(self, x):
        b = self.pool.claim()
        self.pool.release(b)  # (held here until the put holds it)
        self.copy(b, x)
        return b


class PinnedRing:
    """Pinned host buffers the runtime allocated, written through their own
    address (one host copy, ours), then copied to the device (a DMA). A
    buffer is written again once its last device copy is ready."""

    def __init__(self, shape, dtype, n=8):
        import ctypes

        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self.slots = []
        for _ in range(n):
            p = put(np.zeros(shape, dtype), PIN, DURING)
            p.block_until_ready()
            raw = (ctypes.c_byte * nbytes).from_address(p.unsafe_buffer_pointer())
            view = np.ctypeslib.as_array(raw).view(dtype).reshape(shape)
            self.slots.append([p, view, None])
        self.i = 0

    def put(self, x):
        slot = self.slots[self.i]
        self.i = (self.i + 1) % len(self.slots)
        if slot[2] is not None:
            slot[2].block_until_ready()
        np.copyto(slot[1], x)
        slot[2] = d = to_device(slot[0])
        return d


def ways(shape, dtype):
    ring = Ring(shape, dtype)
    stream_ring = Ring(shape, dtype, copy=streamed)
    w = {
        "zc_caller": lambda x: put(x, S, ZC),
        "staged_zc": lambda x: put(ring.stage(x), S, ZC),
        "streamed_zc": lambda x: put(stream_ring.stage(x), S, ZC),
        "during": lambda x: put(x, S, DURING),
        "until": lambda x: put(x, S, UNTIL),
    }
    if PIN is not None:
        w["pinned"] = lambda x: to_device(put(x, PIN, DURING))
        w["pinned_donate"] = lambda x: to_device(put(x, PIN, DURING), DONATE)
        try:
            w["pinned_raw"] = PinnedRing(shape, dtype).put
        except Exception as e:
            log("pinned_raw unavailable:", type(e).__name__, str(e)[:200])
    return w


SIZES = {"400K": (128, 784), "3M": (1024, 784), "25M": (6400, 1024)}


def section_floors() -> None:
    out = {}
    for name, shape in SIZES.items():
        src = [np.random.default_rng(i).standard_normal(shape, np.float32) for i in range(4)]
        row = {}
        reps = 40 if name != "25M" else 12
        for wname, fn in ways(shape, np.float32).items():
            if ONLY and wname not in ONLY:
                continue
            ret, rdy = [], []
            try:
                for i in range(reps + 3):
                    x = src[i % 4]
                    t0 = time.perf_counter()
                    y = fn(x)
                    t1 = time.perf_counter()
                    y.block_until_ready()
                    t2 = time.perf_counter()
                    if i >= 3:
                        ret.append(t1 - t0)
                        rdy.append(t2 - t0)
                    del y
                row[wname] = [round(statistics.median(ret) * 1e6, 1),
                              round(statistics.median(rdy) * 1e6, 1)]
                y = fn(src[1])
                if not np.array_equal(np.asarray(y), src[1]):
                    row[wname + "_WRONG_VALUES"] = True
            except Exception as e:  # a way the backend lacks
                row[wname] = f"{type(e).__name__}: {e}"[:200]
        # the pinned way split in two: the copy into pinned memory, the DMA
        if PIN is not None:
            pin_ret, dma_ret, dma_rdy = [], [], []
            for i in range(reps + 3):
                x = src[i % 4]
                t0 = time.perf_counter()
                p = put(x, PIN, DURING)
                t1 = time.perf_counter()
                d = to_device(p)
                t2 = time.perf_counter()
                d.block_until_ready()
                t3 = time.perf_counter()
                if i >= 3:
                    pin_ret.append(t1 - t0)
                    dma_ret.append(t2 - t1)
                    dma_rdy.append(t3 - t1)
                del p, d
            row["pinned_split_put_us"] = round(statistics.median(pin_ret) * 1e6, 1)
            row["pinned_split_dma_return_ready_us"] = [round(statistics.median(dma_ret) * 1e6, 1),
                                                       round(statistics.median(dma_rdy) * 1e6, 1)]
        # a copy alone, into a warm buffer
        b = np.empty(shape, np.float32)
        ts = []
        for i in range(reps):
            t0 = time.perf_counter()
            np.copyto(b, src[i % 4])
            ts.append(time.perf_counter() - t0)
        row["copy_warm"] = round(statistics.median(ts) * 1e6, 1)
        # 20 puts back to back, then one block (what a loop sees): us each
        for wname in ("zc_caller", "staged_zc", "streamed_zc", "pinned", "pinned_raw", "until"):
            fn = ways(shape, np.float32).get(wname)
            if fn is None or (ONLY and wname not in ONLY):
                continue
            t = []
            for _ in range(3):
                ys = []
                t0 = time.perf_counter()
                for i in range(20):
                    ys.append(fn(src[i % 4]))
                t1 = time.perf_counter()
                jax.block_until_ready(ys)
                t.append(((t1 - t0) / 20 * 1e6, (time.perf_counter() - t0) / 20 * 1e6))
                del ys
            row[wname + "_x20"] = [round(statistics.median(v[0] for v in t), 1),
                                   round(statistics.median(v[1] for v in t), 1)]
        out[name] = row
        log("floors", name, json.dumps(row))
    RESULTS["floors"] = out


def section_safety() -> None:
    busy = jax.jit(lambda a: jnp.linalg.matrix_power(a, 40))
    big = jnp.eye(1024) * 1.0001
    out = {}
    for n in (2048, 262144, 1 << 20, 25 << 18):
        want = np.full(n, 1.0, np.float32)
        row = {}
        for wname, fn in ways((n,), np.float32).items():
            changed = 0
            try:
                for _ in range(15):
                    x = np.full(n, 1.0, np.float32)
                    pending = busy(big)
                    y = fn(x)
                    x[:] = 5.0
                    jax.block_until_ready(pending)
                    changed += not np.array_equal(np.asarray(y), want)
            except Exception as e:  # a way the backend lacks
                changed = f"{type(e).__name__}"
            row[wname] = changed
        out[n * 4] = row
        log("safety", n * 4, json.dumps(row))
    RESULTS["safety_changed_of_15"] = out


# The loop's model is benchmarks/training_loop.py's (its figures and these agree).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from training_loop import init, step  # noqa: E402


def section_loop(configs=((128, 512), (1024, 512), (1024, 4096)), rounds=7, steps=100) -> None:
    out = []
    for batch, width in configs:
        rng = np.random.default_rng(0)
        pool = [(rng.standard_normal((batch, 784), np.float32),
                 rng.integers(0, 10, batch).astype(np.int32)) for _ in range(8)]
        dpool = [(jax.device_put(x), jax.device_put(y)) for x, y in pool]
        params0 = init(jax.random.PRNGKey(0), (784, width, width, 10))
        jf = jax.jit(step)
        nf = nbjit.jit(step)
        wx = ways((batch, 784), np.float32)
        wy = ways((batch,), np.int32)
        variants = {
            "jax.jit": lambda p, i: jf(p, *pool[i]),
            "nbjit": lambda p, i: nf(p, *pool[i]),
            "device_floor": lambda p, i: jf(p, *dpool[i]),
            "zc_caller": lambda p, i: jf(p, wx["zc_caller"](pool[i][0]),
                                         wy["zc_caller"](pool[i][1])),
            "staged_zc": lambda p, i: jf(p, wx["staged_zc"](pool[i][0]),
                                         wy["staged_zc"](pool[i][1])),
            "streamed_zc": lambda p, i: jf(p, wx["streamed_zc"](pool[i][0]),
                                           wy["staged_zc"](pool[i][1])),
            "until_x": lambda p, i: jf(p, wx["until"](pool[i][0]), wy["staged_zc"](pool[i][1])),
        }
        if PIN is not None:
            variants["pinned_x"] = lambda p, i: jf(p, wx["pinned"](pool[i][0]),
                                                   wy["staged_zc"](pool[i][1]))
            variants["pinned_donate_x"] = lambda p, i: jf(p, wx["pinned_donate"](pool[i][0]),
                                                          wy["staged_zc"](pool[i][1]))
            variants["pinned_xy"] = lambda p, i: jf(p, wx["pinned"](pool[i][0]),
                                                    wy["pinned"](pool[i][1]))
            if "pinned_raw" in wx and "pinned_raw" in wy:
                variants["pinned_raw_xy"] = lambda p, i: jf(p, wx["pinned_raw"](pool[i][0]),
                                                            wy["pinned_raw"](pool[i][1]))

        def run(fn, n):
            p, losses, calls = params0, [], 0.0
            t0 = time.perf_counter()
            for i in range(n):
                c0 = time.perf_counter()
                p, loss = fn(p, i % 8)
                calls += time.perf_counter() - c0
                losses.append(loss)
            jax.block_until_ready((p, losses))
            return (time.perf_counter() - t0) / n, calls / n, losses

        ok = {}
        for name, fn in variants.items():
            if ONLY and name not in ONLY and name != "jax.jit":
                continue
            try:
                run(fn, 24)
                ok[name] = fn
            except Exception as e:
                log("loop", batch, width, name, "failed:", type(e).__name__, str(e)[:200])
        ref = [float(v) for v in run(ok["jax.jit"], 40)[2]]
        same = {name: [float(v) for v in run(fn, 40)[2]] == ref for name, fn in ok.items()}
        per = {k: [] for k in ok}
        ret = {k: [] for k in ok}
        gc.disable()
        try:
            names = list(ok)
            for r in range(rounds):
                for k in (names if r % 2 else names[::-1]):
                    s, c, _ = run(ok[k], steps)
                    per[k].append(s)
                    ret[k].append(c)
        finally:
            gc.enable()
        base = np.array(per["jax.jit"])
        row = {"batch": batch, "width": width,
               "jax_step_us": round(float(np.median(base)) * 1e6, 1), "variants": {}}
        for k in ok:
            ratio = np.array(per[k]) / base
            row["variants"][k] = {
                "step_us": round(float(np.median(per[k])) * 1e6, 1),
                "ratio": round(float(np.median(ratio)), 3),
                "p10_p90": [round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
                "call_us": round(float(np.median(ret[k])) * 1e6, 1),
                "losses_equal": same[k]}
        out.append(row)
        log("loop", json.dumps(row))
    RESULTS["loop"] = out


def section_profile() -> None:
    f = nbjit.jit(lambda x: x * 2.0 + 1.0)
    a = jnp.ones((8, 128))
    f(a)
    out = {}
    for label, flavour in (("timed", None), ("timed, results dropped first", "timed_drop")):
        if flavour is not None and flavour not in _flavour_names():
            from nbjit.core import flavours as fl

            base = fl.flavour("timed")
            fl.add_flavour(fl.Flavour(
                flavour, start=base.start, stamps=base.stamps,
                finish="del results; " + base.finish, leave=base.leave, scope=base.scope))
        before, after, outside = [], [], []
        with nbjit.profile() as prof:
            if flavour is not None:
                from nbjit.core import flavours as fl

                fl.use_flavour(flavour)
            for _ in range(20):
                f(a)
            keep = []
            gc.disable()
            try:
                starts, ends = [], []
                for _ in range(300):
                    X.collect_garbage()
                    s = time.perf_counter_ns()
                    keep.append(f(a))
                    ends.append(time.perf_counter_ns())
                    starts.append(s)
            finally:
                gc.enable()
        stamps = np.asarray(prof._hits[f], dtype=np.int64).reshape(-1, 6)[20:]
        starts, ends = np.asarray(starts), np.asarray(ends)
        before = stamps[:, 0] - starts
        after = ends - stamps[:, 5]
        phases = np.diff(stamps, axis=1)
        outside = (ends - starts) - phases.sum(axis=1)
        out[label] = {"overhead_ns": prof.overhead_ns,
                      "outside_median_ns": float(np.median(outside)),
                      "before_first_stamp_ns": float(np.median(before)),
                      "after_last_stamp_ns": float(np.median(after)),
                      "phases_median_ns": [float(v) for v in np.median(phases, axis=0)]}
        log("profile", label, json.dumps(out[label]))
    RESULTS["profile"] = out


def _flavour_names():
    from nbjit.core import flavours as fl

    return set(fl.flavour_names())


def main() -> None:
    args = sys.argv[1:]
    path = None
    if "--json" in args:
        i = args.index("--json")
        path = args[i + 1]
        del args[i:i + 2]
    if "--only" in args:
        i = args.index("--only")
        ONLY.update(args[i + 1].split(","))
        del args[i:i + 2]
    sections = args or ["profile", "floors", "safety", "loop"]
    log("accel_inputs:", RESULTS)
    for name in sections:
        t0 = time.perf_counter()
        globals()["section_" + name]()
        log(f"[{name}: {time.perf_counter() - t0:.0f} s]")
    if path:
        with open(path, "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
