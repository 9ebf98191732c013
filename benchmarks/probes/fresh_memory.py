"""Probe: what a new host buffer's first writes cost (its pages fault in),
against writes into a warm one, and what buffers made ahead on another
thread leave to the calling thread (run on a TPU or GPU host; anywhere to
try it).

    python benchmarks/probes/fresh_memory.py [--sizes KIB ...]

Per size: a copy of a random batch into a new 64-byte-aligned buffer (as a
staging ring makes one), kept alive so the next is new memory too, against
the same copy into a buffer written before; the same into memory mapped
with its pages faulted in by the mapping itself (`MAP_POPULATE`: one
system call instead of a fault a page); into memory advised for
transparent huge pages (`madvise(MADV_HUGEPAGE)`, 2 MiB aligned), and the
host's kernel and huge-page settings; and a claim-and-copy right after another
thread was asked to make 3 buffers and write them (memset through ctypes,
which lets go of the GIL, as a staging ring's pool could have them made
ahead), with that thread given 0, 1 and 5 ms first: a buffer it has not
finished is made by the claim itself. Medians of 8, microseconds.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import sys
import threading
import time

import numpy as np

from nbjit.core.inputs import pools

HUGE = 2 << 20


def _huge_empty(nbytes: int) -> np.ndarray:
    size = -(-nbytes // HUGE) * HUGE
    area = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(area, np.uint8)
    skip = -raw.__array_interface__["data"][0] % HUGE
    area.madvise(mmap.MADV_HUGEPAGE, skip, size)
    return raw[skip:skip + nbytes]


def _populated_empty(nbytes: int) -> np.ndarray:
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    return np.frombuffer(area, np.uint8)


def _setting(name: str) -> str:
    try:
        with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as fh:
            return fh.read().strip()
    except OSError as error:
        return f"unreadable ({error.strerror})"


def _copies(make, src: np.ndarray) -> tuple[float, float]:
    fresh, warm, kept = [], [], []
    for _ in range(8):
        t0 = time.perf_counter()
        buffer = make(src.nbytes)
        np.copyto(buffer, src)
        t1 = time.perf_counter()
        np.copyto(buffer, src)
        t2 = time.perf_counter()
        fresh.append(t1 - t0)
        warm.append(t2 - t1)
        kept.append(buffer)
    return float(np.median(fresh)) * 1e6, float(np.median(warm)) * 1e6


def _made_ahead(src: np.ndarray, head_start_s: float) -> float:
    times, kept = [], []  # (every buffer kept alive: its memory is not reused)
    for _ in range(8):
        ready: collections.deque = collections.deque()

        def make_ahead(ready: collections.deque = ready, n: int = 3) -> None:
            for _ in range(n):
                buffer = pools.aligned_empty(src.nbytes)
                ctypes.memset(buffer.ctypes.data, 0, buffer.nbytes)
                ready.append(buffer)

        maker = threading.Thread(target=make_ahead)
        maker.start()
        time.sleep(head_start_s)
        t0 = time.perf_counter()
        try:
            buffer = ready.popleft()
        except IndexError:  # none ready yet: made here
            buffer = pools.aligned_empty(src.nbytes)
        np.copyto(buffer, src)
        times.append(time.perf_counter() - t0)
        maker.join()
        kept.append((buffer, ready))
    return float(np.median(times)) * 1e6


def main() -> None:
    args = sys.argv[1:]
    sizes = [int(a) for a in args[args.index("--sizes") + 1:]] if "--sizes" in args else [
        400, 1600, 3072]
    with open("/proc/version") as fh:
        kernel = fh.read().strip()
    print(f"fresh_memory: {kernel}; transparent huge pages {_setting('enabled')!r}, "
          f"defrag {_setting('defrag')!r}")
    print("KiB | new buffer | warm | new, MAP_POPULATE | new, huge pages | warm, huge pages | "
          "made ahead: 0 ms / 1 ms / 5 ms first")
    rng = np.random.default_rng(0)
    for kib in sizes:
        src = rng.integers(0, 255, kib << 10, dtype=np.uint8)
        new, warm = _copies(pools.aligned_empty, src)
        populated, _ = _copies(_populated_empty, src)
        huge_new, huge_warm = _copies(_huge_empty, src)
        ahead = [_made_ahead(src, s) for s in (0.0, 0.001, 0.005)]
        cells = [new, warm, populated, huge_new, huge_warm]
        print(f"{kib} | " + " | ".join(f"{t:.0f}" for t in cells) + " | "
              + " / ".join(f"{t:.0f}" for t in ahead), flush=True)


if __name__ == "__main__":
    main()
