"""Probe, sequel to staged_puts.py: zero-copy puts of private staging buffers
(run on a TPU or GPU).

    python benchmarks/probes/staged_puts_zero_copy.py [refs2|copy|loop2|big ...]

refs2: when jaxlib lets go of a staging buffer given with ZERO_COPY.
copy: parallel copy speed by threads.
loop2: the MLP loop with staged zero-copy variants.
big: one 25 MiB numpy input, time to ready.
"""

# ruff: noqa: B007, B023, B905, E741, F841  (a probe: closures read the loop's variables on purpose)

import gc
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src.interpreters import pxla
from jax._src.lib import _jax as X

sys.path.insert(0, os.path.dirname(__file__))
import staged_puts as P  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
results = {}
dev, S = P.dev, P.S
ZC, UNTIL = P.ZC, P.UNTIL
cg = X.collect_garbage
only = set(sys.argv[1:])


def log(*a):
    print(*a, flush=True)


def bdp(x, sem=ZC):
    return X.batched_device_put(
        jcore.ShapedArray(x.shape, x.dtype), S, [x], [dev], False, False, sem
    )


def refs2():
    out = {}
    for name, n in (("64K", 16384), ("4M", 1 << 20)):
        b = P.aligned(n * 4).view(np.float32)
        b[:] = 1
        rec = {"base": sys.getrefcount(b)}
        y = bdp(b)
        rec["put"] = sys.getrefcount(b)
        y.block_until_ready()
        rec["ready"] = sys.getrefcount(b)
        cg()
        rec["ready_cg"] = sys.getrefcount(b)
        time.sleep(0.005)
        cg()
        rec["ready_5ms_cg"] = sys.getrefcount(b)
        # aliasing? write the staging buffer after ready, read the device array
        b[:] = 7
        rec["alias_after_ready"] = float(np.asarray(y)[0]) == 7.0
        del y
        rec["del"] = sys.getrefcount(b)
        cg()
        rec["del_cg"] = sys.getrefcount(b)
        time.sleep(0.005)
        cg()
        rec["del_5ms_cg"] = sys.getrefcount(b)
        out[name] = rec
    # a loop: 200 ZC puts from a ring with collect_garbage each call; ring size at the end
    ring = P.Ring((16384,), np.float32)
    f = jax.jit(lambda a: a * 2)
    for i in range(200):
        cg()
        b = ring.get()
        b[:] = i
        r = f(bdp(b))
    r.block_until_ready()
    out["ring_size_after_200"] = len(ring.bufs)
    log("refs2", json.dumps(out))
    results["refs2"] = out


_pool = ThreadPoolExecutor(12)


def par_copy(dst, src, threads):
    if threads <= 1:
        np.copyto(dst, src)
        return
    n = src.shape[0]
    step = -(-n // threads)
    futs = [
        _pool.submit(np.copyto, dst[i : i + step], src[i : i + step]) for i in range(step, n, step)
    ]
    np.copyto(dst[:step], src[:step])
    for f in futs:
        f.result()


def copy():
    out = {}
    for name, n in (("b128", 128 * 784), ("b1024", 1024 * 784), ("4M", 1 << 20), ("25M", 25 << 18)):
        src = [np.random.rand(n).astype(np.float32) for _ in range(4)]
        dst = P.aligned(n * 4).view(np.float32)
        row = {}
        for t in (1, 2, 4, 8, 12):
            ts = []
            for i in range(25):
                t0 = time.perf_counter()
                par_copy(dst, src[i % 4], t)
                ts.append(time.perf_counter() - t0)
            row[t] = round(P.med(ts[5:]), 1)
        out[name] = row
        log("copy", name, row)
    results["copy"] = out


def loop2(rounds=7, steps=100):
    out = {}
    for B in (128, 1024):
        rng = np.random.default_rng(0)
        pool = [
            (rng.standard_normal((B, 784), np.float32), rng.integers(0, 10, B, np.int32))
            for _ in range(8)
        ]
        params0 = P.init(jax.random.PRNGKey(0))
        jj = jax.jit(P.step)
        compiled = jj.lower(params0, *pool[0]).compile()
        P.Hand._dummy = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in pool[0])
        rx, ry = P.Ring((B, 784), np.float32), P.Ring((B,), np.int32)
        nx = B * 784
        packed_jit = jax.jit(P.packed_step, static_argnums=(2, 3))
        packed_c = packed_jit.lower(params0, jnp.zeros(nx + B, jnp.uint32), nx, (B, 784)).compile()
        packed_exe = packed_c._executable.xla_executable
        rp = P.Ring((nx + B,), np.uint32)
        p_out = jax.eval_shape(P.step, params0, *P.Hand._dummy)
        p_tree = jax.tree.structure(p_out)
        p_handlers = [
            pxla.global_aval_to_result_handler(jcore.ShapedArray(o.shape, o.dtype), S, True)
            for o in jax.tree.leaves(p_out)
        ]
        avp = jcore.ShapedArray((nx + B,), np.uint32)
        thr = 4 if B >= 1024 else 1

        def packed(params, x, y, threads=1):
            cg()
            b = rp.get()
            par_copy(b[:nx], x.reshape(-1).view(np.uint32), threads)
            b[nx:] = y.view(np.uint32)
            d = X.batched_device_put(avp, S, [b], [dev], False, False, ZC)
            outs = packed_exe.execute_sharded([*jax.tree.leaves(params), d]).consume_with_handlers(
                p_handlers
            )
            return p_tree.unflatten(outs)

        def ring_zc(flat, x, y, threads=1):
            cg()
            bx, by = rx.get(), ry.get()
            par_copy(bx, x, threads)
            np.copyto(by, y)
            return [*flat, bdp(bx), bdp(by)]

        variants = {
            "jax.jit": jj,
            "hand_dev": None,
            "caller_zc": P.Hand(compiled, params0, lambda flat, x, y: [*flat, bdp(x), bdp(y)]),
            "ring_zc": P.Hand(compiled, params0, ring_zc),
            "ring_zc_par": P.Hand(compiled, params0, lambda f, x, y: ring_zc(f, x, y, 4)),
            "packed_zc": packed,
            "packed_zc_par": lambda p, x, y: packed(p, x, y, 4),
        }
        dev_pool = [(jax.device_put(x, dev), jax.device_put(y, dev)) for x, y in pool]
        dev_index = {id(x): i for i, (x, _) in enumerate(pool)}
        variants["hand_dev"] = P.Hand(
            compiled, params0, lambda flat, x, y: [*flat, *dev_pool[dev_index[id(x)]]]
        )

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
            return (time.perf_counter() - t0) / n, calls / n, [float(v) for v in losses[:20]]

        ref = None
        for name, f in variants.items():
            _, _, losses = run(f, 20)
            ref = losses if ref is None else ref
            if losses != ref:
                log("LOSSES DIFFER", B, name, losses[:3], ref[:3])
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
            row[n] = [
                round(P.med(per[n]), 1),
                round(P.med(ret[n]), 1),
                round(float(np.median(ratio)), 3),
                [round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
            ]
        row["ring_sizes"] = [len(rx.bufs), len(ry.bufs), len(rp.bufs)]
        out[B] = row
        log("loop2", B, "[step_us, call_us, ratio, p10-p90]", json.dumps(row, indent=0))
    results["loop2"] = out


def big():
    n = 25 << 18
    xs = [np.random.rand(n).astype(np.float32) for _ in range(4)]
    f = jax.jit(lambda a: a + 1)
    ring = P.Ring((n,), np.float32)
    out = {}

    def staged(x, t):
        cg()
        b = ring.get()
        par_copy(b, x, t)
        return f(bdp(b))

    cands = {
        "jax.jit": lambda x: f(x),
        "staged1": lambda x: staged(x, 1),
        "staged4": lambda x: staged(x, 4),
        "staged8": lambda x: staged(x, 8),
    }
    for name, c in cands.items():
        c(xs[0]).block_until_ready()
    ret = {k: [] for k in cands}
    rdy = {k: [] for k in cands}
    for i in range(12):
        for k, c in cands.items():
            t0 = time.perf_counter()
            y = c(xs[i % 4])
            t1 = time.perf_counter()
            y.block_until_ready()
            t2 = time.perf_counter()
            ret[k].append(t1 - t0)
            rdy[k].append(t2 - t0)
            del y
    for k in cands:
        out[k] = [round(P.med(ret[k]), 1), round(P.med(rdy[k]), 1)]
    out["ring"] = len(ring.bufs)
    log("big 25MiB [return_us, ready_us]", json.dumps(out))
    results["big"] = out


for name, fn in (("refs2", refs2), ("copy", copy), ("loop2", loop2), ("big", big)):
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
    with open(os.path.join(OUT, "probe47b.json"), "w") as fh:
        json.dump(results, fh, indent=1)
