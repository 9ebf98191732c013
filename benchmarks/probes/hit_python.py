"""Probe: where nbjit's Python goes in a launch record's hit, piece by piece
(run on a TPU or GPU; on the CPU the accelerator's strategy is plugged in).

    python benchmarks/probes/hit_python.py [--calls N] [--rounds R]

One function, ``f(w, x) = sum(x) * w``: w a device scalar, x a float32 host
array of 16 KiB (a new one of a pool of 8 each call). Per variant, us a call
(median of interleaved rounds, no block until a round ends): jax.jit on
read-only arrays; nbjit on read-only and on writeable arrays; the record's
launcher called directly (jaxlib's C++ alone); nbjit with the launcher
replaced by a builtin (its Python alone: keying, lookup, staging); the
record's stager alone; the launcher with one piece of other work before
each call (the hit path's pieces, 3, 10 and 30 us of unrelated Python, a
16 or 64 KiB copy into memory no put reads), to tell nbjit's own cost from
the runtime's per-call work growing when anything runs between launches,
and whether that growth follows the time between launches or what the work
touches; and the pieces of the hit path's Python one by one.
A plain Python call and loop calibrate the host against other machines.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import nbjit
from nbjit import _jax
from nbjit.core.inputs import platforms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import interleaved  # noqa: E402


def log(*a) -> None:
    print(*a, flush=True)


def main() -> None:
    args = sys.argv[1:]
    n = int(args[args.index("--calls") + 1]) if "--calls" in args else 5000
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 5
    log(f"hit_python: backend {jax.default_backend()}, jax {jax.__version__}, nbjit "
        f"{os.environ.get('NBJIT_COMMIT', '?')}, {n} calls x {rounds} rounds")
    if jax.default_backend() == "cpu":
        platforms.plug_in("cpu", platforms.STAGED)
    rng = np.random.default_rng(0)
    w = jax.device_put(np.float32(0.5))
    pool = [rng.standard_normal(4096).astype(np.float32) for _ in range(8)]
    ro = []
    for x in pool:
        y = x.copy()
        y.flags.writeable = False
        ro.append(y)

    def fn(w, x):
        return jnp.sum(x) * w

    jf, nf, bare = jax.jit(fn), nbjit.jit(fn), nbjit.jit(lambda w, x: jnp.sum(x) * w)
    jax.block_until_ready((jf(w, ro[0]), nf(w, pool[0]), bare(w, pool[0])))
    node, _ = nf._entry_for((w, pool[0]), {})
    record = node.record
    if record is None or record.launch is None:
        log("no launch record here: nothing to take apart")
        return
    launch, stage = record.launch, record.stage
    bare_node, _ = bare._entry_for((w, pool[0]), {})
    object.__setattr__(bare_node.record, "launch", slice)  # its Python only
    lookup_key = (w.aval, w._committed)
    context = _jax.trace_context
    collect = _jax.collect_garbage

    scratch = np.empty_like(pool[0])

    def noop(a, b):
        return None

    def spin_for(turns):
        def spin():
            total = 0
            for k in range(turns):
                total += k
            return total
        return spin

    def spin_of(us):  # a loop of about `us` microseconds on this host
        turns = 1
        while turns < 1 << 22:
            spin = spin_for(turns)
            t0 = time.perf_counter()
            for _ in range(200):
                spin()
            if (time.perf_counter() - t0) / 200 > us * 1e-6:
                break
            turns *= 2
        return spin

    spin, spin10, spin30 = spin_of(3), spin_of(10), spin_of(30)
    big = [rng.standard_normal(4 * 4096).astype(np.float32) for _ in range(8)]
    scratch64 = np.empty_like(big[0])

    variants = {
        "jax.jit, read-only": lambda i: jf(w, ro[i & 7]),
        "nbjit, read-only": lambda i: nf(w, ro[i & 7]),
        "nbjit, writeable": lambda i: nf(w, pool[i & 7]),
        "launcher alone, read-only": lambda i: launch(w, ro[i & 7]),
        "launcher alone, ring copy": lambda i: launch(*stage((w, pool[i & 7]))),
        "nbjit's Python alone, read-only": lambda i: bare(w, ro[i & 7]),
        "nbjit's Python alone, writeable": lambda i: bare(w, pool[i & 7]),
        # The launcher with one piece of other work before each call: which of
        # them makes the runtime's own per-call work grow?
        "launcher + collect_garbage()": lambda i: (collect(), launch(w, ro[i & 7]))[1],
        "launcher + trace_context()": lambda i: (context(), launch(w, ro[i & 7]))[1],
        "launcher + 3 us of other Python": lambda i: (spin(), launch(w, ro[i & 7]))[1],
        # Does the runtime's extra grow with the time between launches (its
        # threads going idle), or with what that work touches?
        "launcher + 10 us of other Python": lambda i: (spin10(), launch(w, ro[i & 7]))[1],
        "launcher + 30 us of other Python": lambda i: (spin30(), launch(w, ro[i & 7]))[1],
        "launcher + a 64 KiB copy elsewhere": lambda i: (np.copyto(scratch64, big[i & 7]),
                                                         launch(w, ro[i & 7]))[1],
        "launcher + a 16 KiB copy elsewhere": lambda i: (np.copyto(scratch, pool[i & 7]),
                                                         launch(w, ro[i & 7]))[1],
        "launcher + the stager, read-only": lambda i: launch(*stage((w, ro[i & 7]))),
        "stager alone, writeable": lambda i: stage((w, pool[i & 7])),
        "stager alone, read-only": lambda i: stage((w, ro[i & 7])),
        "collect_garbage()": lambda i: collect(),
        "trace_context()": lambda i: context(),
        "x.aval, x._committed, x._sharding": lambda i: (w.aval, w._committed, w._sharding),
        "key tuple + dict get": lambda i: {lookup_key: 1}.get(lookup_key),
        "np.copyto 16 KiB": lambda i: np.copyto(scratch, pool[i & 7]),
        "np.copyto 64 KiB": lambda i: np.copyto(scratch64, big[i & 7]),
        "3 us of other Python alone": lambda i: spin(),
        "10 us of other Python alone": lambda i: spin10(),
        "30 us of other Python alone": lambda i: spin30(),
        "a Python call (calibration)": lambda i: noop(i, i),
    }
    def measure(f):
        out = None
        t0 = time.perf_counter()
        for i in range(n):
            out = f(i)
        if isinstance(out, jax.Array):
            jax.block_until_ready(out)
        return (time.perf_counter() - t0) / n * 1e6

    def empty_loop(_):
        t0 = time.perf_counter()
        for _ in range(n):
            pass
        return (time.perf_counter() - t0) / n * 1e6

    per = interleaved(variants, measure, rounds)
    per["an empty loop turn (calibration)"] = interleaved({"": None}, empty_loop, rounds)[""]
    for name, times in per.items():
        log(f"{name:>36}: {float(np.median(times)):8.2f} us  "
            f"({min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main()
