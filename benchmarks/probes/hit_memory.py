"""Probe: what a cache hit with two jax.Arrays leaves behind, nbjit.jit beside
jax.jit (tests/test_memory.py's `jax_arrays` workload; on a TPU its hits grew
RSS by a few MB where jax.jit's did not).

    python benchmarks/probes/hit_memory.py [--calls N] [--rounds R] [--json FILE]

Per round and side: RSS growth over N hits (no gc in the loop), the change
in the number of objects the gc tracks, and, for nbjit, tracemalloc's top
allocation sites that grew over a further N hits (Python-level memory only:
growth that shows in RSS but not there is the runtime's). Rounds alternate
the sides, so growth that comes once lands in whichever runs first, and a
leak grows every round of its side.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tracemalloc

import jax
import jax.numpy as jnp

import nbjit

MB = 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def growth(f, args, calls: int) -> tuple[float, int]:
    """(RSS growth in MB, gc-tracked objects added) over `calls` hits."""
    gc.collect()
    before, objects = rss(), len(gc.get_objects())
    for _ in range(calls):
        out = f(*args)
    jax.block_until_ready(out)
    after = rss()
    return (after - before) / MB, len(gc.get_objects()) - objects - 1


def top_sites(f, args, calls: int, limit: int = 8) -> list[str]:
    tracemalloc.start(8)
    gc.collect()
    first = tracemalloc.take_snapshot()
    for _ in range(calls):
        out = f(*args)
    jax.block_until_ready(out)
    gc.collect()
    second = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return [str(s) for s in second.compare_to(first, "lineno")[:limit]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    a = parser.parse_args(argv)
    x, y = jnp.ones(3), jnp.arange(3.0)

    def fn(p, q):
        return p * q + 1

    sides = {"nbjit": nbjit.jit(fn), "jax.jit": jax.jit(fn)}
    for f in sides.values():
        for _ in range(20_000):
            f(x, y)
    print(f"backend {jax.default_backend()}, jax {jax.__version__}, {a.calls} hits a round",
          flush=True)
    rows = []
    for r in range(a.rounds):
        for name, f in sides.items():
            mb, objs = growth(f, (x, y), a.calls)
            rows.append({"round": r, "side": name, "rss_mb": mb, "gc_objects": objs})
            print(f"round {r} {name:8s} RSS {mb:+.2f} MB  gc objects {objs:+d}", flush=True)
    sites = top_sites(sides["nbjit"], (x, y), a.calls)
    print("nbjit: tracemalloc's top sites that grew:", *sites, sep="\n  ")
    stats = sides["nbjit"].stats() if hasattr(sides["nbjit"], "stats") else None
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"rows": rows, "sites": sites, "stats": repr(stats)}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
