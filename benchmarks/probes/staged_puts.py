"""Probe: host inputs on an accelerator, by hand (run on a TPU or GPU; the table in
docs/host-inputs.md, "What it was chosen from", came from it and its sequel,
staged_puts_zero_copy.py).

    python benchmarks/probes/staged_puts.py [puts|refs|loop|mutate ...]   (writes $OUT/probe47.json)

Section puts: what one put of a numpy array costs until the call returns
and until the array is ready, by method and size.
Section refs: whether jaxlib holds a reference to a staging buffer until
its transfer is done (the rule a pool's reuse rests on).
Section loop: an MLP SGD loop, a new numpy batch each step from a pool of 8,
no block per step; hand-made dispatch variants against jax.jit and nbjit.
Section mutate: a write right after the call, staged puts vs jax.jit.
"""

# ruff: noqa: B007, B023, B905, E741, F841  (a probe: closures read the loop's variables on purpose)

import gc
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src.interpreters import pxla
from jax._src.lib import _jax as X

OUT = os.environ.get("OUT", "/tmp")
results = {"jax": jax.__version__, "devices": str(jax.devices()), "backend": jax.default_backend()}
dev = jax.devices()[0]
S = jax.sharding.make_single_device_sharding(dev)
UNTIL = X.HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES
DURING = X.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
ZC = X.HostBufferSemantics.ZERO_COPY
only = set(sys.argv[1:])


def log(*a):
    print(*a, flush=True)


def bdp(x, sem):
    aval = jcore.ShapedArray(x.shape, x.dtype)
    return X.batched_device_put(aval, S, [x], [dev], False, False, sem)


def aligned(nbytes, align=4096):
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


class Ring:
    """Staging buffers reused once nothing but the ring holds them."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.bufs = []
        self.i = 0

    def get(self):
        n = len(self.bufs)
        for k in range(n):
            b = self.bufs[(self.i + k) % n]
            if sys.getrefcount(b) <= 3:  # the list, b, the argument
                self.i = (self.i + k + 1) % n
                return b
        b = (
            aligned(int(np.prod(self.shape)) * self.dtype.itemsize)
            .view(self.dtype)
            .reshape(self.shape)
        )
        self.bufs.append(b)
        return b


def med(xs):
    return float(np.median(xs)) * 1e6


# ---------------------------------------------------------------- puts
def section_puts():
    sizes = {
        "8K": 2048,
        "64K": 16384,
        "b128": 128 * 784,
        "1M": 262144,
        "b1024": 1024 * 784,
        "4M": 1 << 20,
        "25M": 25 << 18,
    }
    out = {}
    for name, n in sizes.items():
        src = [np.random.rand(n).astype(np.float32) for _ in range(4)]
        ring = Ring((n,), np.float32)
        methods = {
            "device_put": lambda x: jax.device_put(x, dev),
            "bdp_during": lambda x: bdp(x, DURING),
            "bdp_until_caller": lambda x: bdp(x, UNTIL),
            "bdp_zc_caller": lambda x: bdp(x, ZC),
            "copy_fresh_until": lambda x: bdp(np.array(x, copy=True), UNTIL),
            "ring_until": lambda x: bdp(_copy_into(ring.get(), x), UNTIL),
            "ring_during": lambda x: bdp(_copy_into(ring.get(), x), DURING),
        }
        row = {}
        reps = 30 if n < (1 << 20) else 12
        for mname, fn in methods.items():
            ret, rdy = [], []
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
            row[mname] = (round(med(ret), 1), round(med(rdy), 1))
        # back to back: 20 puts then one block (throughput as a loop sees it)
        for mname in ("bdp_during", "bdp_until_caller", "ring_until"):
            fn = methods[mname]
            ts = []
            for r in range(3):
                ys = []
                t0 = time.perf_counter()
                for i in range(20):
                    ys.append(fn(src[i % 4]))
                t1 = time.perf_counter()
                jax.block_until_ready(ys)
                t2 = time.perf_counter()
                ts.append(((t1 - t0) / 20 * 1e6, (t2 - t0) / 20 * 1e6))
                del ys
            row[mname + "_x20"] = [
                round(float(np.median([t[0] for t in ts])), 1),
                round(float(np.median([t[1] for t in ts])), 1),
            ]
        out[name] = row
        log("puts", name, json.dumps(row))
    # copies alone
    cp = {}
    for name, n in sizes.items():
        x = np.random.rand(n).astype(np.float32)
        b = aligned(n * 4).view(np.float32)
        ts, tf = [], []
        for i in range(20):
            t0 = time.perf_counter()
            np.copyto(b, x)
            t1 = time.perf_counter()
            y = np.array(x, copy=True)
            t2 = time.perf_counter()
            del y
            ts.append(t1 - t0)
            tf.append(t2 - t1)
        cp[name] = (round(med(ts), 1), round(med(tf), 1))
    out["copy_warm_fresh"] = cp
    log("copies (warm buffer, fresh)", json.dumps(cp))
    results["puts"] = out


def _copy_into(b, x):
    np.copyto(b, x)
    return b


# ---------------------------------------------------------------- refs
def section_refs():
    out = {}
    f = jax.jit(lambda a: jnp.sin(a) @ jnp.cos(a).T)
    big = jnp.ones((2048, 2048))
    for name, n in (("64K", 16384), ("4M", 1 << 20)):
        b = aligned(n * 4).view(np.float32)
        b[:] = 1
        base = sys.getrefcount(b)
        busy = [f(big) for _ in range(8)]  # keep the device busy
        y = bdp(b, UNTIL)
        after_put = sys.getrefcount(b)
        y.block_until_ready()
        time.sleep(0.01)
        after_ready = sys.getrefcount(b)
        del y
        gc.collect()
        after_del = sys.getrefcount(b)
        yz = bdp(b, ZC)
        zc_put = sys.getrefcount(b)
        yz.block_until_ready()
        zc_ready = sys.getrefcount(b)
        del yz
        zc_del = sys.getrefcount(b)
        jax.block_until_ready(busy)
        out[name] = dict(
            base=base,
            until_after_put=after_put,
            until_after_ready=after_ready,
            until_after_del=after_del,
            zc_put=zc_put,
            zc_ready=zc_ready,
            zc_del=zc_del,
        )
    log("refs", json.dumps(out))
    results["refs"] = out


# ---------------------------------------------------------------- loop
def init(key, sizes=(784, 512, 512, 10)):
    params = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        key, k1 = jax.random.split(key)
        params.append((jax.random.normal(k1, (m, n)) * np.sqrt(2 / m), jnp.zeros(n)))
    return params


def loss_fn(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    logits = h @ w + b
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def step(params, x, y):
    l, g = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, g), l


def packed_step(params, buf, nx, shape_x):
    x = jax.lax.bitcast_convert_type(buf[:nx], jnp.float32).reshape(shape_x)
    y = jax.lax.bitcast_convert_type(buf[nx:], jnp.int32)
    return step(params, x, y)


class Hand:
    """execute_sharded on a compiled step, inputs made by `make_xy`."""

    def __init__(self, compiled, params, make_inputs):
        self.exe = compiled._executable.xla_executable
        out = jax.eval_shape(step, params, *self._dummy)
        self.tree = jax.tree.structure(out)
        avals = [jcore.ShapedArray(o.shape, o.dtype) for o in jax.tree.leaves(out)]
        self.handlers = [pxla.global_aval_to_result_handler(a, S, True) for a in avals]
        self.make_inputs = make_inputs

    _dummy = ()

    def __call__(self, params, x, y):
        flat = jax.tree.leaves(params)
        ins = self.make_inputs(flat, x, y)
        outs = self.exe.execute_sharded(ins).consume_with_handlers(self.handlers)
        return self.tree.unflatten(outs)


def section_loop(batches_sizes=(128, 1024), rounds=7, steps=100):
    out = {}
    for B in batches_sizes:
        rng = np.random.default_rng(0)
        pool = [
            (rng.standard_normal((B, 784), np.float32), rng.integers(0, 10, B, np.int32))
            for _ in range(8)
        ]
        params0 = init(jax.random.PRNGKey(0))
        jj = jax.jit(step)
        compiled = jj.lower(params0, *pool[0]).compile()
        Hand._dummy = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in pool[0])
        rx, ry = Ring((B, 784), np.float32), Ring((B,), np.int32)
        dev_pool = [(jax.device_put(x, dev), jax.device_put(y, dev)) for x, y in pool]
        dev_index = {id(x): i for i, (x, _) in enumerate(pool)}
        nx = B * 784
        packed_jit = jax.jit(packed_step, static_argnums=(2, 3))
        pbuf = jnp.zeros(nx + B, jnp.uint32)
        packed_c = packed_jit.lower(params0, pbuf, nx, (B, 784)).compile()
        packed_exe = packed_c._executable.xla_executable
        rp = Ring((nx + B,), np.uint32)
        p_out = jax.eval_shape(step, params0, *Hand._dummy)
        p_tree = jax.tree.structure(p_out)
        p_handlers = [
            pxla.global_aval_to_result_handler(jcore.ShapedArray(o.shape, o.dtype), S, True)
            for o in jax.tree.leaves(p_out)
        ]
        avp = jcore.ShapedArray((nx + B,), np.uint32)

        def packed(params, x, y):
            b = rp.get()
            b[:nx] = x.reshape(-1).view(np.uint32)
            b[nx:] = y.view(np.uint32)
            d = X.batched_device_put(avp, S, [b], [dev], False, False, UNTIL)
            outs = packed_exe.execute_sharded([*jax.tree.leaves(params), d]).consume_with_handlers(
                p_handlers
            )
            return p_tree.unflatten(outs)

        def ring_until(flat, x, y):
            bx, by = rx.get(), ry.get()
            np.copyto(bx, x)
            np.copyto(by, y)
            return [*flat, bdp(bx, UNTIL), bdp(by, UNTIL)]

        variants = {
            "jax.jit": jj,
            "hand_dev": Hand(
                compiled, params0, lambda flat, x, y: [*flat, *dev_pool[dev_index[id(x)]]]
            ),
            "hand_during": Hand(
                compiled, params0, lambda flat, x, y: [*flat, bdp(x, DURING), bdp(y, DURING)]
            ),
            "hand_until_caller": Hand(
                compiled, params0, lambda flat, x, y: [*flat, bdp(x, UNTIL), bdp(y, UNTIL)]
            ),
            "hand_until_fresh": Hand(
                compiled,
                params0,
                lambda flat, x, y: [*flat, bdp(x.copy(), UNTIL), bdp(y.copy(), UNTIL)],
            ),
            "hand_ring_until": Hand(compiled, params0, ring_until),
            "hand_packed_until": packed,
        }
        try:
            sys.path.insert(0, os.getcwd())
            import nbjit

            variants["nbjit"] = nbjit.jit(step)
        except Exception as e:  # noqa: BLE001
            log("nbjit import failed", repr(e))

        def run(f, n):
            p = params0
            calls = 0.0
            losses = []
            t0 = time.perf_counter()
            for i in range(n):
                x, y = pool[i % 8]
                c0 = time.perf_counter()
                p, l = f(p, x, y)
                calls += time.perf_counter() - c0
                losses.append(l)
            jax.block_until_ready((p, losses))
            return (time.perf_counter() - t0) / n, calls / n, [float(v) for v in losses[:5]]

        ref_losses = None
        for name, f in variants.items():
            _, _, losses = run(f, 10)
            if ref_losses is None:
                ref_losses = losses
            if not np.allclose(losses, ref_losses, rtol=1e-5):
                log("LOSSES DIFFER", name, losses, ref_losses)
        names = list(variants)
        per = {n: [] for n in names}
        ret = {n: [] for n in names}
        gc.disable()
        for r in range(rounds):
            for j in range(len(names)):
                n = names[(r + j) % len(names)]
                s, c, _ = run(variants[n], steps)
                per[n].append(s)
                ret[n].append(c)
        gc.enable()
        row = {}
        for n in names:
            ratio = np.array(per[n]) / np.array(per["jax.jit"])
            row[n] = dict(
                step_us=round(med(per[n]), 1),
                call_us=round(med(ret[n]), 1),
                ratio=round(float(np.median(ratio)), 3),
                p10_p90=[round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
            )
        out[B] = row
        log("loop", B, json.dumps(row, indent=1))
    results["loop"] = out


# ---------------------------------------------------------------- mutate
def section_mutate():
    f = jax.jit(lambda a: jnp.sum(jnp.sin(a) * 2.0))
    out = {}
    for name, n in (
        ("8K", 2048),
        ("64K", 16384),
        ("1M", 262144),
        ("4M", 1 << 20),
        ("25M", 25 << 18),
    ):
        ring = Ring((n,), np.float32)
        changed = {"jax.jit": 0, "ring_until": 0}
        busy = jax.jit(lambda a: jnp.linalg.matrix_power(a, 40))
        big = jnp.eye(1024) * 1.0001
        for t in range(12):
            x = np.full(n, 1.0, np.float32)
            want = float(f(np.full(n, 1.0, np.float32)))
            bb = busy(big)
            r1 = f(x)
            x[:] = 5.0
            x2 = np.full(n, 1.0, np.float32)
            bb2 = busy(big)
            b = ring.get()
            np.copyto(b, x2)
            d = bdp(b, UNTIL)
            r2 = f(d)
            x2[:] = 5.0
            jax.block_until_ready((bb, bb2))
            changed["jax.jit"] += float(r1) != want
            changed["ring_until"] += float(r2) != want
        out[name] = changed
    log("mutate", json.dumps(out))
    results["mutate"] = out


if __name__ == "__main__":
    for name, fn in (
        ("puts", section_puts),
        ("refs", section_refs),
        ("loop", section_loop),
        ("mutate", section_mutate),
    ):
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            results[name + "_error"] = repr(e)
        log(f"[{name} took {time.time() - t0:.1f}s]")
        with open(os.path.join(OUT, "probe47.json"), "w") as fh:
            json.dump(results, fh, indent=1)
