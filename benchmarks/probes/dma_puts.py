"""Probe: does host memory registered with the runtime for DMA (jaxlib's
``client.dma_map``) make a zero-copy put of it cheaper (run on a TPU or GPU;
the CPU only to try it).

    python benchmarks/probes/dma_puts.py [--steps N] [--rounds R] [--json FILE]

A zero-copy put of unregistered memory is not read in place on an
accelerator: the runtime copies it into memory of its own on its threads,
then transfers that. If registering nbjit's staging rings moves that copy
off the runtime, the private copy nbjit makes (its guarantee) would take the
place of the runtime's instead of coming beside it. Tried once at 2fda112,
where a failed registration was silent and the loop did not move; this
probe says whether the registration succeeds at all.

1. ``dma_map`` of page-aligned anonymous memory: succeeded or the error.
2. One put of 400 KiB and 3 MiB, zero copy, us until it returns / until the
   device array is ready (median of 40): unregistered aligned memory,
   registered memory.
3. The no-block loop (MLP 784-512-512-10, SGD, a pool of 8 batches, a new
   one each step), per-step time against jax.jit on the pool's arrays:
   jax.jit on a pool living in registered memory (the mechanism alone), a
   ring copy into unregistered buffers then jax.jit (nbjit's way), the same
   ring registered. Losses of every variant compared with jax.jit's.
"""

from __future__ import annotations

import json
import mmap
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src.lib import _jax as X

from nbjit.core.inputs.pools import BufferPool

dev = jax.devices()[0]
client = dev.client
S = jax.sharding.make_single_device_sharding(dev)
ZC = X.HostBufferSemantics.ZERO_COPY
PAGE = 4096
KEEP: list = []  # mappings kept alive for the whole probe (never unmapped while registered)


def log(*a) -> None:
    print(*a, flush=True)


def raw(nbytes: int, register: bool) -> np.ndarray:
    size = -(-nbytes // PAGE) * PAGE
    memory = mmap.mmap(-1, size)
    array = np.frombuffer(memory, np.uint8)
    array[:] = 0  # fault the pages in
    if register:
        client.dma_map(array.__array_interface__["data"][0], size)
    KEEP.append((memory, array))
    return array[:nbytes]


def buffer(shape, dtype, register: bool) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return raw(nbytes, register).view(dtype).reshape(shape)


def put(x):
    return X.batched_device_put(jcore.ShapedArray(x.shape, x.dtype), S, [x], [dev],
                                False, False, ZC)


class Ring:
    def __init__(self, shape, dtype, register: bool, n: int = 8):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.pool = BufferPool(nbytes, lambda: buffer(shape, dtype, register), n)

    def stage(self, x):
        b = self.pool.claim()
        self.pool.release(b)
        np.copyto(b, x)
        return b


def init(rng, sizes):
    params = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        params.append((jnp.asarray(rng.standard_normal((a, b)).astype(np.float32) / np.sqrt(a)),
                       jnp.zeros(b, jnp.float32)))
    return params


def step(params, x, y):
    def loss(p):
        h = x
        for w, b in p[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = p[-1]
        logp = jax.nn.log_softmax(h @ w + b)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def main() -> None:
    args = sys.argv[1:]
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 200
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 5
    path = args[args.index("--json") + 1] if "--json" in args else None
    out: dict = {"device": f"{dev.platform} {dev.device_kind}", "jax": jax.__version__}
    log(f"dma_puts: {out['device']}, jax {jax.__version__}")
    probe = mmap.mmap(-1, 1 << 20)
    parray = np.frombuffer(probe, np.uint8)
    try:
        client.dma_map(parray.__array_interface__["data"][0], 1 << 20)
        client.dma_unmap(parray.__array_interface__["data"][0])
        out["dma_map"] = "ok"
    except Exception as error:
        out["dma_map"] = f"{type(error).__name__}: {str(error)[:300]}"
    log("dma_map:", out["dma_map"])
    registered = out["dma_map"] == "ok"

    out["puts"] = {}
    for label, shape in (("400K", (128, 784)), ("3M", (1024, 784))):
        for reg in ((False, True) if registered else (False,)):
            x = buffer(shape, np.float32, reg)
            x[:] = 1.0
            ret, rdy = [], []
            for _ in range(40):
                t0 = time.perf_counter()
                d = put(x)
                t1 = time.perf_counter()
                d.block_until_ready()
                t2 = time.perf_counter()
                ret.append((t1 - t0) * 1e6)
                rdy.append((t2 - t0) * 1e6)
            key = f"{label} {'registered' if reg else 'plain'}"
            out["puts"][key] = [round(statistics.median(ret), 1), round(statistics.median(rdy), 1)]
            log(f"put {key}: returns {out['puts'][key][0]} us, ready {out['puts'][key][1]} us")

    out["loops"] = []
    rng = np.random.default_rng(0)
    for batch in (128, 1024):
        params = init(rng, [784, 512, 512, 10])
        pool = [(rng.standard_normal((batch, 784)).astype(np.float32),
                 rng.integers(0, 10, batch).astype(np.int32)) for _ in range(8)]
        jitted = jax.jit(step)
        variants = {"jax.jit": lambda b: b}
        if registered:
            mapped_pool = []
            for x, y in pool:
                mx, my = buffer(x.shape, x.dtype, True), buffer(y.shape, y.dtype, True)
                mx[:], my[:] = x, y
                mapped_pool.append((mx, my))
            index = {id(b): i for i, b in enumerate(pool)}
            variants["jax.jit, pool registered"] = (
                lambda b, m=mapped_pool, ix=index: m[ix[id(b)]])
        rx, ry = Ring((batch, 784), np.float32, False), Ring((batch,), np.int32, False)
        variants["ring copy"] = lambda b, rx=rx, ry=ry: (rx.stage(b[0]), ry.stage(b[1]))
        if registered:
            gx, gy = Ring((batch, 784), np.float32, True), Ring((batch,), np.int32, True)
            variants["ring copy, registered"] = (
                lambda b, gx=gx, gy=gy: (gx.stage(b[0]), gy.stage(b[1])))
        times: dict = {k: [] for k in variants}
        losses: dict = {}
        jax.block_until_ready(jitted(params, *pool[0]))
        for r in range(rounds):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in names:
                feed = variants[name]
                p = params
                vals = []
                t0 = time.perf_counter()
                for i in range(steps):
                    p, v = jitted(p, *feed(pool[i % 8]))
                    vals.append(v)
                jax.block_until_ready((p, vals))
                times[name].append((time.perf_counter() - t0) / steps * 1e6)
                if r == 0:
                    losses[name] = np.asarray(vals)
        base = statistics.median(times["jax.jit"])
        row = {"batch": batch, "jax_us": round(base, 1)}
        for name in variants:
            med = statistics.median(times[name])
            row[name] = {"us": round(med, 1), "ratio": round(med / base, 3),
                         "losses_equal": bool(np.array_equal(losses[name], losses["jax.jit"]))}
        out["loops"].append(row)
        log(json.dumps(row))
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
