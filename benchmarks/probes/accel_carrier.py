"""Probe: host inputs on an accelerator through jaxlib's own C++ put, with
jax.jit's executable, against per-leaf puts from Python (run on a TPU or GPU;
any backend works, the CPU only to try it).

    python benchmarks/probes/accel_carrier.py [loop] [safety] [copies] [small]
                                              [--steps N] [--rounds R] [--json FILE]

The candidate ("carrier"): a C++ `PjitFunction` over a call's flat leaves
(`jax._src.lib._jax.pjit`, what `jax._src.pjit._pjit_call_impl` itself
makes), whose miss hands back jax.jit's own fast-path data: its hits put
numpy leaves in C++ (zero copy, as jax.jit does) and run jax.jit's own
executable. Writeable leaves go in as private copies from a staging ring
(`nbjit.core.inputs.staging.StagingRing`: a buffer is written again only
once the runtime let go of it), read-only ones as they are.

loop: the no-block training loop (a new batch from a pool of 8 each step,
  nothing blocks until a round ends), per-step time against jax.jit on the
  caller's writeable arrays, interleaved rounds; losses compared with
  jax.jit's at every step. Models: benchmarks/training_loop.py's MLP
  (784-W-W-10) at batch 128 and 1024 (W 512) and 1024 (W 4096), and a
  token model (int32 tokens and targets, 32x128 each: 32 KB a step).
  Variants:
    jax.jit        jax.jit on the caller's writeable arrays (racy there)
    jax.jit_ro     jax.jit on read-only arrays
    nbjit          nbjit.jit as it is in this checkout
    carrier        ring copies, then the carrier (C++ puts, jax.jit's executable)
    carrier_nt     the same with non-temporal copies (copy_kinds.py's kernel)
    carrier_par    the same with the copy split over 4 threads (batch 1024)
    carrier_ro     read-only arrays straight to the carrier
    perleaf_py     ring copies, one batched_device_put each from Python, then
                   the carrier on device arrays (nbjit's per-leaf staged way)
    split_launch   both leaves copied into one flat buffer, one put, a jitted
                   split program (bitcasts), then the carrier on its outputs
    nbjit_ro       nbjit.jit on read-only arrays
    device_floor   the batch already on the device
safety: a write to the caller's array right after the call while the device
  is busy, 60 calls (8 KiB to 25 MiB): results changed, jax.jit and carrier.
copies: a 3 MiB copy into a warm buffer, alone and with puts in flight:
  np.copyto, non-temporal, 2 and 4 threads.
small: compare's host-value rows, per call (each call new values from a
  pool of 64, no block until a round ends): ``a + b`` on two float32[8]
  (numpy_args_2_new_values) and a 392 KiB batch with 4 params (the mnist
  row's shapes). Variants as loop's, plus carrier_bytes (a copy that owns
  its memory as an immutable bytes object), carrier_off16 (ring copies 16
  bytes past a 64-byte boundary: does the runtime's put of an aligned
  buffer cost more?) and the top of a cProfile of nbjit's calls (where
  Python spends them).
"""

# ruff: noqa: E731, B023  (a probe: small lambdas name the variants)

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import tree_util
from jax._src.interpreters import pxla
from jax._src.lib import _jax as X

import nbjit
from nbjit.core.inputs.pools import BufferPool, aligned_empty
from nbjit.core.inputs.staging import StagingRing, immutable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from _rounds import interleaved  # noqa: E402
from training_loop import init, step  # noqa: E402

try:
    from copy_kinds import stream_copy  # noqa: E402  (needs numba and llvmlite)
except Exception as e:  # noqa: BLE001
    print("no non-temporal copy:", type(e).__name__, e)
    stream_copy = None

dev = jax.devices()[0]
S = jax.sharding.make_single_device_sharding(dev)
ZC = X.HostBufferSemantics.ZERO_COPY
RESULTS: dict = {"jax": jax.__version__, "device": f"{dev.platform} {dev.device_kind}"}
CACHE = X.PjitFunctionCache(capacity=64)
POOL = concurrent.futures.ThreadPoolExecutor(4)


def log(*a) -> None:
    print(*a, flush=True)


def carrier_of(jf, treedef, name):
    """A C++ PjitFunction over flat leaves whose miss returns jax.jit's fast-path data."""
    miss = jax.jit(lambda *a: a)  # placeholder so `fun` is a distinct object
    cache_miss_of_jf = jf._cache_miss

    def cache_miss(*leaves):
        outs, fastpath, _ = cache_miss_of_jf(*tree_util.tree_unflatten(treedef, leaves))
        return outs, fastpath, False

    return X.pjit(name, miss, cache_miss, [], [], ("nbjit-carrier-probe", id(miss)),
                  tree_util.dispatch_registry, pxla.cc_shard_arg, CACHE)


class Ring:
    """A staging ring with another copy (non-temporal, threaded)."""

    def __init__(self, shape, dtype, copy):
        self.pool = StagingRing(shape, np.dtype(dtype), 8).pool
        self.copy = copy

    def stage(self, x):
        b = self.pool.claim()
        self.pool.release(b)  # (held here until the put holds it)
        self.copy(b, x)
        return b


def nt_copy(dst, src):
    stream_copy(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))


def par_copy(dst, src, parts=4):
    d, s = dst.reshape(-1), src.reshape(-1)
    n = d.shape[0]
    cut = [n * k // parts for k in range(parts + 1)]
    futs = [POOL.submit(np.copyto, d[a:b], s[a:b])
            for a, b in zip(cut[1:-1], cut[2:], strict=True)]
    np.copyto(d[cut[0]:cut[1]], s[cut[0]:cut[1]])
    for f in futs:
        f.result()


def put(x):
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    return X.batched_device_put(aval, S, [x], [dev], False, False, ZC)


def splitter(example):
    """(put, split) for one flat buffer holding every leaf of `example`:
    ``split(put(leaves))`` gives the leaves as device arrays, through one put
    and one launch of a jitted program of bitcasts."""
    sizes = [a.nbytes for a in example]
    total = sum(sizes)
    ring = StagingRing((total,), np.dtype(np.uint8), 8)
    aval = jax.core.ShapedArray((total,), np.uint8)

    def put_flat(leaves):
        buf = ring.pool.claim()
        ring.pool.release(buf)
        at = 0
        for a in leaves:
            buf[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
            at += a.nbytes
        return X.batched_device_put(aval, S, [buf], [dev], False, False, ZC)

    def split(flat):
        out, at = [], 0
        for a in example:
            piece = flat[at:at + a.nbytes].reshape(*a.shape, a.dtype.itemsize)
            out.append(jax.lax.bitcast_convert_type(piece, a.dtype))
            at += a.nbytes
        return out

    return put_flat, jax.jit(split)


# --- models -----------------------------------------------------------------

def mlp(batch, width):
    rng = np.random.default_rng(0)
    pool = [(rng.standard_normal((batch, 784), np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(8)]
    return init(jax.random.PRNGKey(0), (784, width, width, 10)), pool, step


def tok_step(params, tokens, targets):
    def loss_fn(p):
        h = p["emb"][tokens]  # (32, 128, 64)
        h = jnp.tanh(h @ p["w1"])
        logits = h @ p["w2"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))
    loss, g = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda a, b: a - 0.01 * b, params, g), loss


def tokens():
    rng = np.random.default_rng(1)
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"emb": jax.random.normal(k[0], (1000, 64)) * 0.1,
              "w1": jax.random.normal(k[1], (64, 128)) * 0.1,
              "w2": jax.random.normal(k[2], (128, 1000)) * 0.1}
    pool = [(rng.integers(0, 1000, (32, 128)).astype(np.int32),
             rng.integers(0, 1000, (32, 128)).astype(np.int32)) for _ in range(8)]
    return params, pool, tok_step


def readonly(a):
    b = np.array(a, copy=True)
    b.flags.writeable = False
    assert immutable(b)
    return b


def section_loop(steps=200, rounds=5) -> None:
    out = []
    cases = [("mlp b128 w512", lambda: mlp(128, 512)), ("mlp b1024 w512", lambda: mlp(1024, 512)),
             ("mlp b1024 w4096", lambda: mlp(1024, 4096)), ("tokens 32x128", tokens)]
    if dev.platform == "cpu":
        cases = cases[:1] + cases[-1:]
    for label, make in cases:
        params0, pool, fn = make()
        ro_pool = [tuple(readonly(a) for a in xy) for xy in pool]
        dpool = [tuple(jax.device_put(a) for a in xy) for xy in pool]
        jf, nf = jax.jit(fn), nbjit.jit(fn)
        treedef = tree_util.tree_structure((params0, *pool[0]))
        carrier = carrier_of(jf, treedef, fn.__name__)
        shapes = [(a.shape, a.dtype) for a in pool[0]]
        rings = [StagingRing(s, d, 8) for s, d in shapes]
        nt_rings = [Ring(s, d, nt_copy) for s, d in shapes] if stream_copy else None
        par_rings = [Ring(s, d, par_copy) for s, d in shapes]
        flat = lambda p: tree_util.tree_leaves(p)
        variants = {
            "jax.jit": lambda p, i: jf(p, *pool[i]),
            "jax.jit_ro": lambda p, i: jf(p, *ro_pool[i]),
            "nbjit": lambda p, i: nf(p, *pool[i]),
            "carrier": lambda p, i: carrier(*flat(p), *[r.stage(a) for r, a in
                                                        zip(rings, pool[i], strict=True)]),
            "carrier_ro": lambda p, i: carrier(*flat(p), *[r.stage(a) for r, a in
                                                           zip(rings, ro_pool[i], strict=True)]),
            "perleaf_py": lambda p, i: carrier(*flat(p), *[put(r.stage(a)) for r, a in
                                                           zip(rings, pool[i], strict=True)]),
            "device_floor": lambda p, i: carrier(*flat(p), *dpool[i]),
            "nbjit_ro": lambda p, i: nf(p, *ro_pool[i]),
        }
        split_put, split = splitter(pool[0])
        variants["split_launch"] = lambda p, i: carrier(*flat(p), *split(split_put(pool[i])))
        if nt_rings and all(a.nbytes % 64 == 0 for a in pool[0]):
            variants["carrier_nt"] = lambda p, i: carrier(
                *flat(p), *[r.stage(a) for r, a in zip(nt_rings, pool[i], strict=True)])
        if pool[0][0].nbytes >= 1 << 20:
            variants["carrier_par"] = lambda p, i: carrier(
                *flat(p), *[r.stage(a) for r, a in zip(par_rings, pool[i], strict=True)])

        def run(f, n):
            p, losses, calls = params0, [], 0.0
            t0 = time.perf_counter()
            for i in range(n):
                c0 = time.perf_counter()
                p, loss = f(p, i % 8)
                calls += time.perf_counter() - c0
                losses.append(loss)
            jax.block_until_ready((p, losses))
            return (time.perf_counter() - t0) / n, calls / n, losses

        ok = {}
        for name, f in variants.items():
            try:
                run(f, 24)
                ok[name] = f
            except Exception as e:  # noqa: BLE001
                log("loop", label, name, "failed:", type(e).__name__, str(e)[:300])
        ref = run(ok["jax.jit"], 300)
        ref_losses = [float(v) for v in ref[2]]
        ref_params = jax.tree.map(np.asarray, run(ok["jax.jit"], 1)[2])  # (warm)
        del ref_params
        same = {}
        for name, f in ok.items():
            losses = [float(v) for v in run(f, 300)[2]]
            same[name] = sum(a != b for a, b in zip(losses, ref_losses, strict=True))
        results = interleaved(ok, lambda f: run(f, steps), rounds)
        per = {k: [r[0] for r in v] for k, v in results.items()}
        ret = {k: [r[1] for r in v] for k, v in results.items()}
        base = np.array(per["jax.jit"])
        row = {"case": label, "jax_step_us": round(float(np.median(base)) * 1e6, 1),
               "variants": {}}
        for k in ok:
            ratio = np.array(per[k]) / base
            row["variants"][k] = {
                "step_us": round(float(np.median(per[k])) * 1e6, 1),
                "ratio": round(float(np.median(ratio)), 3),
                "p10_p90": [round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
                "call_us": round(float(np.median(ret[k])) * 1e6, 1),
                "losses_differing_of_300": same[k]}
        out.append(row)
        log("loop", json.dumps(row))
        log(f"  {label}: " + ", ".join(f"{k} {v['ratio']:.2f}" for k, v in
                                       row["variants"].items()))
    RESULTS["loop"] = out


def section_safety() -> None:
    fn = lambda a: jnp.sum(jnp.sin(a) * 2.0)
    jf = jax.jit(fn)
    busy = jax.jit(lambda a: jnp.linalg.matrix_power(a, 40))
    big = jnp.eye(1024) * 1.0001
    changed = {"jax.jit": 0, "carrier": 0}
    calls = 0
    for n in (2048, 16384, 262144, 1 << 20, 25 << 18):
        carrier = carrier_of(jf, tree_util.tree_structure((np.zeros(n, np.float32),)), "fn")
        ring = StagingRing((n,), np.dtype(np.float32), 8)
        want = float(jf(np.full(n, 1.0, np.float32)))
        for _ in range(12):
            for name in changed:
                x = np.full(n, 1.0, np.float32)
                pending = busy(big)
                out = jf(x) if name == "jax.jit" else carrier(ring.stage(x))
                x[:] = 5.0
                jax.block_until_ready(pending)
                changed[name] += float(out) != want
            calls += 1
    RESULTS["safety"] = {"calls": calls, "changed": changed}
    log("safety", json.dumps(RESULTS["safety"]))


def section_copies(reps=150) -> None:
    nbytes = 3 << 20
    rng = np.random.default_rng(0)
    pool = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(8)]
    others = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(2)]
    dst = aligned_empty(nbytes)
    kinds = {"np.copyto": np.copyto, "2 threads": lambda d, s: par_copy(d, s, 2),
             "4 threads": par_copy}
    if stream_copy is not None:
        kinds["non-temporal"] = stream_copy
    row = {}
    for name, copy in kinds.items():
        copy(dst, pool[1])
        assert np.array_equal(dst, pool[1])
        for busy in (False, True):
            ts = []
            for i in range(reps):
                pending = [put(o) for o in others] if busy else None
                t0 = time.perf_counter()
                copy(dst, pool[i % 8])
                ts.append(time.perf_counter() - t0)
                if pending:
                    jax.block_until_ready(pending)
            row[f"{name}{', puts in flight' if busy else ''}"] = round(
                statistics.median(ts) * 1e6, 1)
    RESULTS["copies_3MiB_us"] = row
    log("copies 3 MiB us", json.dumps(row))


class OffsetRing:
    """A staging ring whose buffers start 16 bytes past a 64-byte boundary
    (the ring's own are 64-byte aligned): whether the runtime's put of a
    small host buffer costs more when it is aligned."""

    def __init__(self, shape, dtype, offset=16):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        make = lambda: aligned_empty(nbytes + 64)[offset:offset + nbytes].view(dtype).reshape(shape)
        self.pool = BufferPool(nbytes, make, 64)

    def stage(self, x):
        b = self.pool.claim()
        self.pool.release(b)  # (held here until the put holds it)
        np.copyto(b, x)
        return b


def _frozen_copy(x):
    """A read-only copy whose memory a bytes object owns (`immutable` holds)."""
    return np.frombuffer(x.tobytes(), x.dtype).reshape(x.shape)


def section_small(steps=2000, rounds=5) -> None:
    import cProfile
    import io
    import pstats

    rng = np.random.default_rng(1)
    w = jax.device_put(rng.standard_normal((784, 128)).astype(np.float32) / 28)
    cases = {
        "add 2x f32[8]": (lambda a, b: a + b, (), [
            (rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32))
            for _ in range(64)]),
        "mnist 392 KiB": (lambda w, x, y: jnp.mean((jnp.tanh(x @ w) - y[:, None]) ** 2), (w,), [
            (rng.standard_normal((128, 784)).astype(np.float32),
             rng.standard_normal(128).astype(np.float32)) for _ in range(64)]),
    }
    out = []
    for label, (fn, consts, pool) in cases.items():
        ro_pool = [tuple(readonly(a) for a in xy) for xy in pool]
        dpool = [tuple(jax.device_put(a) for a in xy) for xy in pool]
        jf, nf = jax.jit(fn), nbjit.jit(fn)
        treedef = tree_util.tree_structure((*consts, *pool[0]))
        carrier = carrier_of(jf, treedef, "small")
        rings = [StagingRing(a.shape, a.dtype, 64) for a in pool[0]]
        off_rings = [OffsetRing(a.shape, a.dtype) for a in pool[0]]
        variants = {
            "jax.jit": lambda i: jf(*consts, *pool[i]),
            "jax.jit_ro": lambda i: jf(*consts, *ro_pool[i]),
            "nbjit": lambda i: nf(*consts, *pool[i]),
            "nbjit_ro": lambda i: nf(*consts, *ro_pool[i]),
            "carrier": lambda i: carrier(*consts, *[r.stage(a) for r, a in
                                                    zip(rings, pool[i], strict=True)]),
            "carrier_ro": lambda i: carrier(*consts, *ro_pool[i]),
            "carrier_bytes": lambda i: carrier(*consts, *[_frozen_copy(a) for a in pool[i]]),
            "carrier_off16": lambda i: carrier(*consts, *[r.stage(a) for r, a in
                                                          zip(off_rings, pool[i], strict=True)]),
            "device_floor": lambda i: carrier(*consts, *dpool[i]),
        }

        def run(f, n):
            t0 = time.perf_counter()
            for i in range(n):
                r = f(i % 64)
            jax.block_until_ready(r)
            return (time.perf_counter() - t0) / n, r

        want = np.asarray(run(variants["jax.jit"], 64)[1])
        ok = {}
        for name, f in variants.items():
            try:
                got = np.asarray(run(f, 64)[1])
                ok[name] = f
                if not np.array_equal(got, want):
                    log("small", label, name, "differs from jax.jit")
            except Exception as e:  # noqa: BLE001
                log("small", label, name, "failed:", type(e).__name__, str(e)[:300])
        per = {k: [r[0] for r in v]
               for k, v in interleaved(ok, lambda f: run(f, steps), rounds).items()}
        base = np.array(per["jax.jit"])
        row = {"case": label, "jax_call_us": round(float(np.median(base)) * 1e6, 1),
               "variants": {k: {"call_us": round(float(np.median(v)) * 1e6, 1),
                                "ratio": round(float(np.median(np.array(v) / base)), 3)}
                            for k, v in per.items()}}
        prof = cProfile.Profile()
        prof.enable()
        run(ok["nbjit"], steps)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
        row["nbjit_profile_top"] = [ln for ln in text.getvalue().splitlines()
                                    if ln.strip()][-13:]
        out.append(row)
        log("small", json.dumps({k: row[k] for k in ("case", "jax_call_us", "variants")}))
        log(f"  {label}: " + ", ".join(f"{k} {v['ratio']:.2f}" for k, v in
                                       row["variants"].items()))
        log("\n".join(row["nbjit_profile_top"]))
    RESULTS["small"] = out


def main() -> None:
    args = sys.argv[1:]
    path = None
    if "--json" in args:
        i = args.index("--json")
        path = args[i + 1]
        del args[i:i + 2]
    kw = {}
    for flag in ("--steps", "--rounds"):
        if flag in args:
            i = args.index(flag)
            kw[flag[2:]] = int(args[i + 1])
            del args[i:i + 2]
    log("accel_carrier:", RESULTS)
    for name in args or ["loop", "safety", "copies"]:
        t0 = time.perf_counter()
        globals()["section_" + name](**(kw if name in ("loop", "small") else {}))
        log(f"[{name}: {time.perf_counter() - t0:.0f} s]")
    if path:
        with open(path, "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
