"""Probe: what writing a fresh host buffer costs, against a warm one (run on
the TPU host; any machine to try it).

    python benchmarks/probes/fresh_pages.py [--mib 0.4 1.6 3] [--reps 40]

A process's first calls write fresh buffers: a miss's private copies of the
host leaves (`values.private_host_copies`) and each staging ring's first
buffers (`staging.StagingRing`). On the TPU host a miss's two copies of the
MLP's batch took 1.6 ms under cProfile (`first_miss.py`), where a copy into
a warm buffer takes under 0.1. Per size, median microseconds of: numpy's
copy into a new array (``x.copy()``, every one kept alive, so each is
fresh memory), the same into `pools.aligned_empty`'s buffer (pages mapped
at once from `POPULATE_MIN_BYTES`), that buffer's allocation alone, and a
copy into one warm buffer.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from nbjit.core.inputs import pools


def median_us(make, reps: int) -> float:
    kept, times = [], []
    for _ in range(reps):
        start = time.perf_counter()
        kept.append(make())
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[0.4, 1.6, 3])
    parser.add_argument("--reps", type=int, default=40)
    a = parser.parse_args(argv)
    print(f"fresh_pages: median us of {a.reps}; POPULATE_MIN_BYTES "
          f"{pools.POPULATE_MIN_BYTES}, MAP_POPULATE {bool(pools._MAP_POPULATE)}")
    print("| MiB | x.copy() (fresh) | aligned_empty + copy | aligned_empty alone | warm copy |")
    print("|---:|---:|---:|---:|---:|")
    for mib in a.mib:
        n = int(mib * 1e6) // 64 * 64
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        warm = pools.aligned_empty(n)
        warm[:] = x

        def populated(x=x, n=n):
            y = pools.aligned_empty(n)
            np.copyto(y, x)
            return y

        def warm_copy(x=x, warm=warm):
            np.copyto(warm, x)

        cells = [median_us(x.copy, a.reps), median_us(populated, a.reps),
                 median_us(lambda n=n: pools.aligned_empty(n), a.reps),
                 median_us(warm_copy, a.reps)]
        print(f"| {mib:g} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
