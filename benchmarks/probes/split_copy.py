"""Probe: the streamed copy of one batch split over a few threads, against one thread.

    python benchmarks/probes/split_copy.py [--mib 0.8 1.6 3] [--threads 2 3 4] [--reps 300]

A writeable host batch on an accelerator costs nbjit one private copy on the
calling thread before it returns (docs/host-inputs.md, "Accelerators"); at
0.8-1.6 MB that copy is what separates nbjit's step from jax.jit's. The
streamed copy (`nbjit.core.inputs.stream`) is called through ctypes, which
lets go of the GIL, so copy threads of the process's own can each take a
part while the calling thread copies its own: the question is whether
waking them costs less than the part they take, on this host.

The crew: persistent daemon threads, each blocked on a lock of its own; the
calling thread hands each its part (addresses and a block count), releases
their locks, copies the first part itself, then waits for each one's done
lock. For each size it prints the median microseconds of a copy of one of 8
source batches into one 64-byte-aligned buffer: one thread, then split over
each crew size; alone, and while `jax.device_put` transfers of two other
batches of that size are in flight. Every copy's bytes are checked once.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading

import jax
import numpy as np

from nbjit.core.inputs import stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_kinds import aligned, median_us  # noqa: E402  (the same buffer and timing)

BLOCK = 64


class Crew:
    """`n - 1` copy threads beside the caller's: ``copy(dst, src)`` splits in `n` parts."""

    def __init__(self, n: int, loop) -> None:
        self.loop, self.n = loop, n
        self.jobs: list = [None] * n
        self.go = [threading.Lock() for _ in range(n)]
        self.done = [threading.Lock() for _ in range(n)]
        for k in range(1, n):
            self.go[k].acquire()
            self.done[k].acquire()
            threading.Thread(target=self._work, args=(k,), daemon=True).start()

    def _work(self, k: int) -> None:
        go, done, loop = self.go[k], self.done[k], self.loop
        while True:
            go.acquire()
            d, s, blocks = self.jobs[k]
            loop(d, s, blocks)
            done.release()

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        d, s = dst.ctypes.data, src.ctypes.data
        blocks = src.nbytes // BLOCK
        per = -(-blocks // self.n)
        for k in range(1, self.n):
            first = min(blocks, k * per)
            self.jobs[k] = (d + first * BLOCK, s + first * BLOCK, min(per, blocks - first))
            self.go[k].release()
        self.loop(d, s, min(per, blocks))
        for k in range(1, self.n):
            self.done[k].acquire()


def raw_loop():
    copy = stream.stream_copy()
    if copy is None:
        sys.exit("split_copy: no streamed copy here (llvmlite missing?)")
    engine = copy.engine
    address = engine.get_function_address("nbjit_stream_copy")
    loop = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
    loop.engine = engine
    return loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[0.8, 1.6, 3])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--reps", type=int, default=300)
    a = parser.parse_args(argv)
    loop = raw_loop()
    one = Crew(1, loop)
    crews = {n: Crew(n, loop) for n in a.threads}
    device = jax.devices()[0]
    print(f"{device.platform} {device.device_kind}, jax {jax.__version__}, median us of "
          f"{a.reps} copies; columns: one thread, then split over n threads")
    head = ["1"] + [str(n) for n in crews]
    print("| MiB | puts in flight | " + " | ".join(head) + " |")
    print("|---:|:---|" + "---:|" * len(head))
    rng = np.random.default_rng(0)
    for mib in a.mib:
        nbytes = int(mib * 1e6) // BLOCK * BLOCK
        pool = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(8)]
        others = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(2)]
        dst = aligned(nbytes)
        for crew in (one, *crews.values()):
            dst[:] = 0
            crew.copy(dst, pool[3])
            assert np.array_equal(dst, pool[3]), f"crew of {crew.n} copied other bytes"
        for busy in (None, others):
            cells = [median_us(c.copy, pool, dst, a.reps, busy) for c in (one, *crews.values())]
            print(f"| {mib:g} | {'yes' if busy else 'no'} | "
                  + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
