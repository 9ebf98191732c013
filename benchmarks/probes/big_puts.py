"""Probe: how a big writeable numpy input (from `Staged.DIRECT_MIN_BYTES`)
should reach an accelerator without a later write reaching the transfer (run
on a TPU or GPU; the CPU only to try it).

    python benchmarks/probes/big_puts.py [--mib M ...] [--reps N] [--json FILE]

compare's `jit_dispatch_with_transfer` (a 25 MB numpy array into ``x + 1``,
each call waited on) read 1.29 on the TPU: nbjit reads such an array during
the call (`IMMUTABLE_ONLY_DURING_CALL`), and the call returned after 1.9 ms
where jax.jit's returned after 0.2, its result ready 2 ms later than
jax.jit's. The ways, each the same ``jax.jit(x + 1)`` executable on the
device array the way put:

    jax          jax.jit on the caller's array (its C++ put, zero copy; racy)
    during       a put that reads the array during the call, then the run (nbjit's way)
    zc_run_wait  a zero-copy put, the run, then a wait for the put's own array
                 (the call returns once the transfer has read the host bytes)
    zc_wait_run  a zero-copy put, a wait for it, then the run
    ring         a copy into a warm buffer of nbjit's own `StagingRing` (the
                 streamed copy), put zero copy (what a leaf below
                 `Staged.DIRECT_MIN_BYTES` gets), then the run
    nbjit        nbjit.jit itself

Per size and way, us: median time until the call returns and until its
result is ready (each call waited on, the ways interleaved), the per-call
time of a no-block loop of 8 calls, and, for the ways that claim it, how
many of 15 results a write into the array right after the call changed.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import numpy as np
from jax._src import core as jcore
from jax._src.lib import _jax as X

import nbjit
from nbjit.core.inputs import stream as _stream
from nbjit.core.inputs.staging import StagingRing

dev = jax.devices()[0]
S = jax.sharding.make_single_device_sharding(dev)
ZC = X.HostBufferSemantics.ZERO_COPY
DURING = X.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL


def put(x, sem):
    return X.batched_device_put(jcore.ShapedArray(x.shape, x.dtype), S, [x], [dev],
                                False, False, sem)


def plus_one(x):
    return x + 1


g = jax.jit(plus_one)
nb = nbjit.jit(plus_one)


def way_jax(x):
    return g(x)


def way_during(x):
    return g(put(x, DURING))


def way_zc_run_wait(x):
    d = put(x, ZC)
    out = g(d)
    d.block_until_ready()
    return out


def way_zc_wait_run(x):
    d = put(x, ZC)
    d.block_until_ready()
    return g(d)


def way_nbjit(x):
    return nb(x)


_rings: dict = {}


def way_ring(x):
    ring = _rings.get(x.shape)
    if ring is None:
        ring = _rings[x.shape] = StagingRing(x.shape, x.dtype, 16)
    return g(put(ring.stage(x), ZC))


WAYS = {"jax": way_jax, "during": way_during, "zc_run_wait": way_zc_run_wait,
        "zc_wait_run": way_zc_wait_run, "ring": way_ring, "nbjit": way_nbjit}
SAFE = ("during", "zc_run_wait", "zc_wait_run", "ring", "nbjit", "jax")


def main() -> None:
    args = sys.argv[1:]

    def opt(name, default, many=False):
        if name not in args:
            return default
        i = args.index(name) + 1
        if not many:
            return args[i]
        out = []
        while i < len(args) and not args[i].startswith("--"):
            out.append(args[i])
            i += 1
        return out

    mibs = [float(v) for v in opt("--mib", ["8", "24.5", "64"], many=True)]
    reps = int(opt("--reps", "15"))
    path = opt("--json", None)
    print(f"big_puts: {dev.platform} {dev.device_kind}, jax {jax.__version__}", flush=True)
    _stream.start()
    stream = _stream.stream_copy()  # waits for the streamed copy's compile
    print("streamed copy:", "yes" if stream is not None else "no (numpy's copy)", flush=True)
    rows = []
    for mib in mibs:
        n = int(mib * (1 << 20)) // 4
        x = np.ones(n, np.float32)
        for f in WAYS.values():  # compile, warm the paths
            jax.block_until_ready(f(x))
        ret = {w: [] for w in WAYS}
        ready = {w: [] for w in WAYS}
        loop = {w: [] for w in WAYS}
        for r in range(reps):
            names = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
            for w in names:
                f = WAYS[w]
                t0 = time.perf_counter()
                out = f(x)
                t1 = time.perf_counter()
                out.block_until_ready()
                t2 = time.perf_counter()
                ret[w].append((t1 - t0) * 1e6)
                ready[w].append((t2 - t0) * 1e6)
            for w in names:
                f = WAYS[w]
                t0 = time.perf_counter()
                for _ in range(8):
                    out = f(x)
                out.block_until_ready()
                loop[w].append((time.perf_counter() - t0) * 1e6 / 8)
        changed = {}
        for w in SAFE:
            f, bad = WAYS[w], 0
            for k in range(15):
                x.fill(float(k))
                out = f(x)
                x.fill(-1000.0)  # right after the call returns
                got = np.asarray(out)
                bad += int(not (got == k + 1).all())
            changed[w] = bad
        row = {"mib": mib}
        for w in WAYS:
            row[w] = {"return_us": round(statistics.median(ret[w]), 1),
                      "ready_us": round(statistics.median(ready[w]), 1),
                      "loop_us": round(statistics.median(loop[w]), 1),
                      "changed_of_15": changed.get(w)}
        rows.append(row)
        print(f"\n{mib} MiB: way, return us, ready us, no-block loop us a call, "
              "ready / jax's, writes that changed a result (of 15)")
        for w in WAYS:
            c = row[w]
            print(f"  {w:12s} {c['return_us']:9.1f} {c['ready_us']:9.1f} {c['loop_us']:9.1f}"
                  f" {c['ready_us'] / row['jax']['ready_us']:6.3f} {c['changed_of_15']}",
                  flush=True)
    write_rows(path, rows)


def write_rows(path, rows) -> None:
    """The probe's rows, with the device and jax version, as JSON (None: nothing)."""
    if path:
        with open(path, "w") as fh:
            json.dump({"device": f"{dev.platform} {dev.device_kind}", "jax": jax.__version__,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
