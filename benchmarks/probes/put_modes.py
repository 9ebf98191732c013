"""Probe: a writeable leaf's two safe ways to an accelerator, for calls that are
waited on and for a no-block loop, and whether the ring itself can tell the
two apart (run on a TPU or GPU; the CPU only to try it).

    python benchmarks/probes/put_modes.py [--kib K ...] [--reps N] [--json FILE]

`big_puts.py` on the TPU v5e: a put read during the call (``during``) had
the result ready sooner than a copy into nbjit's ring put zero copy
(``ring``) at 2-24.5 MiB (0.83-1.02 of jax.jit's time against 1.13-1.31),
while in a no-block loop the ring's calls came sooner (436 against 519 us
at 2 MiB, 963 against 1,141 at 8 MiB). Per size: us until the result is
ready (each call waited on) and a no-block loop's us a call, for jax.jit,
``during`` and ``ring``; and the signals a call could read before it
chooses: how often the ring's last buffer was already let go by the runtime
(its transfer done) at the next call, waited-on calls against the loop,
and how often the last ``during`` put's array was ready at the next call.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from big_puts import DURING, ZC, dev, g, put, write_rows  # noqa: E402

from nbjit.core.inputs import pools as _pools  # noqa: E402
from nbjit.core.inputs import stream as _stream  # noqa: E402
from nbjit.core.inputs.staging import StagingRing  # noqa: E402


class Ways:
    """jax.jit, `during` and `ring` for one shape, with their signals counted."""

    def __init__(self, shape):
        self.ring = StagingRing(shape, np.dtype(np.float32), 16)
        self.last = None  # the last `during` put's device array
        self.seen = {"ring_free": 0, "ring_asked": 0, "during_ready": 0, "during_asked": 0}

    def jax(self, x):
        return g(x)

    def during(self, x):
        if self.last is not None:
            self.seen["during_asked"] += 1
            self.seen["during_ready"] += bool(self.last.is_ready())
        d = self.last = put(x, DURING)
        return g(d)

    def ring_free(self):
        free = self.ring.pool.free
        if free:
            self.seen["ring_asked"] += 1
            self.seen["ring_free"] += _pools._getrefcount(free[-1]) == _pools._FREE

    def ring_way(self, x):
        self.ring_free()
        return g(put(self.ring.stage(x), ZC))

    def reset(self):
        for k in self.seen:
            self.seen[k] = 0


def main() -> None:
    args = sys.argv[1:]

    def many(name, default):
        if name not in args:
            return default
        i, out = args.index(name) + 1, []
        while i < len(args) and not args[i].startswith("--"):
            out.append(args[i])
            i += 1
        return out

    kibs = [int(v) for v in many("--kib", ["16", "64", "256", "512", "1024", "2048", "4096"])]
    reps = int(many("--reps", ["15"])[0])
    path = many("--json", [None])[0]
    print(f"put_modes: {dev.platform} {dev.device_kind}, jax {jax.__version__}", flush=True)
    _stream.start()
    _stream.stream_copy()
    rows = []
    print("KiB: way, ready us (waited on), loop us a call, ready / jax's, loop / jax's; signals",
          flush=True)
    for kib in kibs:
        x = np.ones(kib * 256, np.float32)
        w = Ways(x.shape)
        fs = {"jax": w.jax, "during": w.during, "ring": w.ring_way}
        for f in fs.values():
            for _ in range(20):
                jax.block_until_ready(f(x))
        ready = {k: [] for k in fs}
        loop = {k: [] for k in fs}
        signals = {}
        for phase in ("sync", "loop"):
            w.reset()
            for r in range(reps):
                names = list(fs) if r % 2 == 0 else list(reversed(fs))
                for name in names:
                    f = fs[name]
                    if phase == "sync":
                        for _ in range(4):
                            t0 = time.perf_counter()
                            f(x).block_until_ready()
                            ready[name].append((time.perf_counter() - t0) * 1e6)
                    else:
                        t0 = time.perf_counter()
                        for _ in range(16):
                            out = f(x)
                        out.block_until_ready()
                        loop[name].append((time.perf_counter() - t0) * 1e6 / 16)
            signals[phase] = dict(w.seen)
        row = {"kib": kib}
        for name in fs:
            row[name] = {"ready_us": round(statistics.median(ready[name]), 1),
                         "loop_us": round(statistics.median(loop[name]), 1)}
        row["signals"] = signals
        rows.append(row)
        for name in fs:
            c = row[name]
            print(f"{kib:6d} {name:7s} {c['ready_us']:9.1f} {c['loop_us']:9.1f} "
                  f"{c['ready_us'] / row['jax']['ready_us']:6.3f} "
                  f"{c['loop_us'] / row['jax']['loop_us']:6.3f}", flush=True)
        for phase, s in signals.items():
            print(f"       {phase}: ring's last buffer free at the next call "
                  f"{s['ring_free']}/{s['ring_asked']}, last during put ready "
                  f"{s['during_ready']}/{s['during_asked']}", flush=True)
    write_rows(path, rows)


if __name__ == "__main__":
    main()
