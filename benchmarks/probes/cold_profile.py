"""Probe: a profiled hit's time outside its five phases when the calling
thread's caches are cold between calls, as on a TPU (run on any machine).

    python benchmarks/probes/cold_profile.py [--calls N] [--evict-mib M] [--collect]
                                             [--json FILE]

On a TPU v5e every piece of Python in a profiled call ran 5-8x slower than
in the tight loop that measures the profile's overhead (`Profile.overhead_ns`):
after ~100 us inside the runtime's execute the thread's caches are cold.
This probe makes that condition on a CPU: before each timed call it reads
and writes a buffer of `--evict-mib` MiB (default 16). On a 2-core AMD EPYC
with 32 MiB of L3, with the binder's own first and last stamps, 16 MiB made
the time outside the phases 4-6x the warm one, 20 MiB 5x, 24-32 MiB 13-15x
(the TPU: 7x); 64 MiB made everything 20-30x slower. It runs the
loop of `tests/test_profile.py::test_phases_sum_to_the_call_within_the_stated_overhead`
(f = x * 2 + 1 on a float32[8,128] device array, gc off, the outputs kept;
`--collect`: the runtime's released buffers freed before each call, as that
test did before the call's entry was stamped) twice, warm (no eviction) and
cold, and prints per condition the stated overhead, the median time outside
the phases (and its parts before the first stamp and after the last), each
phase's median, and whether the test's bound (2 x overhead + 1 us) holds.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import jax.numpy as jnp
import numpy as np

import nbjit
from nbjit import _jax
from nbjit.observe import profile as _profile


def run(calls: int, evict: np.ndarray | None, collect: bool) -> dict:
    f = nbjit.jit(lambda x: x * 2.0 + 1.0)
    a = jnp.ones((8, 128))
    f(a)
    starts, ends, outs = [], [], []
    clock = time.perf_counter_ns
    with nbjit.profile() as prof:
        for _ in range(20):  # builds the timed binder
            f(a)
        overheads = [prof.overhead_ns]
        gc.disable()
        try:
            for _ in range(3):
                overheads.append(_profile._measure_overhead(200))
                for _ in range(calls // 3):
                    if evict is not None:
                        evict += 1  # every cache line of the buffer read and written
                    if collect:
                        _jax.collect_garbage()
                    start = clock()
                    out = f(a)
                    end = clock()
                    outs.append(out)
                    starts.append(start)
                    ends.append(end)
            overheads.append(_profile._measure_overhead(200))
        finally:
            gc.enable()
    stamps = np.asarray(prof._hits[f], dtype=np.int64).reshape(-1, 6)[20:]
    starts_a, ends_a = np.asarray(starts), np.asarray(ends)
    phases = np.diff(stamps, axis=1)
    outside = (ends_a - starts_a) - phases.sum(axis=1)
    overhead = max(overheads)
    bound = 2 * overhead + 1000
    return {
        "overhead_ns": round(overhead), "outside_median_ns": float(np.median(outside)),
        "before_first_stamp_ns": float(np.median(stamps[:, 0] - starts_a)),
        "after_last_stamp_ns": float(np.median(ends_a - stamps[:, 5])),
        "phases_median_ns": dict(zip(_profile.PHASES,
                                     (float(v) for v in np.median(phases, axis=0)), strict=True)),
        "bound_ns": round(bound), "holds": bool(np.median(outside) <= bound),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--evict-mib", type=int, default=16)
    parser.add_argument("--collect", action="store_true")
    parser.add_argument("--json")
    opts = parser.parse_args()
    buffer = np.zeros(opts.evict_mib << 18, dtype=np.float32)  # MiB -> float32 count
    results = {}
    for label, evict in (("warm", None), ("cold", buffer)):
        results[label] = run(opts.calls, evict, opts.collect)
        print(label, json.dumps(results[label]), flush=True)
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
