"""Probe: what a process's first nbjit miss pays that a later one does not
(run on a TPU or GPU; the CPU only to try it).

    python benchmarks/probes/first_miss.py [--runs R] [--top K] [--read-only]

`accel_runs.py` on the TPU: the first run's miss took 7.4 ms and a later
run's 1.5 (JAX's program compiled before either). Here the MLP of that
probe (784-2048-2048-10, batch 512, writeable batches): jax.jit compiles
its step once, then `--runs` times a new ``nbjit.jit(step)`` makes its first
call under cProfile, then 9 more calls unprofiled. Per run it prints that
first call's milliseconds, and those of an unprofiled first call of another
new ``nbjit.jit(step)`` right after (a later function finds the record the
first one built: no miss). Then the functions whose cumulative time the
first run spent most beyond the second's (what only a process's first
miss pays), and the first run's own time per function. `--read-only`:
batches no one can write (the pool's arrays' flags cleared).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

import jax
import numpy as np

import nbjit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accel_runs import build  # noqa: E402  (that probe's models and step)


def main() -> None:
    args = sys.argv[1:]
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else 3
    top = int(args[args.index("--top") + 1]) if "--top" in args else 25
    params, step, make = build("mlp 2048 b512")
    rng = np.random.default_rng(0)
    pool = [make(rng) for _ in range(8)]
    if "--read-only" in args:
        for batch in pool:
            for a in batch:
                a.flags.writeable = False
    dev = jax.devices()[0]
    kind = "read-only" if "--read-only" in args else "writeable"
    print(f"first_miss: {dev.platform} {dev.device_kind}, jax {jax.__version__}, {kind} batches",
          flush=True)
    jax.block_until_ready(jax.jit(step)(params, *pool[0]))  # the compile, once
    stats = []
    for r in range(runs):
        f = nbjit.jit(step)
        prof = cProfile.Profile()
        begin = time.perf_counter()
        prof.enable()
        p, value = f(params, *pool[0])
        prof.disable()
        profiled = time.perf_counter() - begin
        for i in range(1, 10):
            p, value = f(p, *pool[i % 8])
        jax.block_until_ready((p, value))
        g = nbjit.jit(step)
        begin = time.perf_counter()
        q, value = g(params, *pool[1])
        plain = time.perf_counter() - begin
        jax.block_until_ready((q, value))
        print(f"run {r + 1}: first call {profiled * 1e3:.2f} ms under cProfile; a new function's "
              f"first call right after, unprofiled, {plain * 1e3:.2f} ms", flush=True)
        stats.append(pstats.Stats(prof).stats)
    if len(stats) < 2:
        return
    first, second = stats[0], stats[1]
    extra = []
    for fn, (_cc, nc, tt, ct, _) in first.items():
        later = second.get(fn, (0, 0, 0.0, 0.0, None))
        extra.append((ct - later[3], tt - later[2], nc, later[1], fn))
    extra.sort(reverse=True)
    print(f"\nthe first run's cumulative ms beyond the second's (top {top}): "
          "extra cum, extra own, calls in run 1 / run 2, function")
    for dct, dtt, n1, n2, (path, line, name) in extra[:top]:
        print(f"{dct * 1e3:8.2f} {dtt * 1e3:8.2f} {n1:6d}/{n2:<6d} "
              f"{'/'.join(path.split('/')[-2:])}:{line} {name}")
    print(f"\nthe first run's own time, top {top}:")
    own = sorted(first.items(), key=lambda kv: -kv[1][2])[:top]
    for (path, line, name), (_cc, nc, tt, ct, _) in own:
        where = "/".join(path.split("/")[-2:])
        print(f"{tt * 1e3:8.2f} {ct * 1e3:8.2f} {nc:6d} {where}:{line} {name}")


if __name__ == "__main__":
    main()
