"""Probe: staged copies with non-temporal stores or numpy's, by batch size, in a training loop.

    python benchmarks/probes/stream_threshold.py [--batches 128 256 512] [--rounds 7]
                                                  [--steps 200] [--json FILE]

A launch record copies each writeable host batch into a staging ring; from
`STREAM_MIN_BYTES` (256 KiB) with non-temporal stores (`nbjit.core.inputs.stream`),
below it with numpy. Whether 256 KiB is where the streamed copy starts to
win is the host's to say: on the 2-core CPU machine here a 392 KiB batch
staged in 42 us streamed and 21 us with numpy. This runs
benchmarks/training_loop.py's MLP 784-512-512-10 (a new batch from a pool
of 8 each step, no block until a round ends) under three jits in
alternating rounds: jax.jit, nbjit as it is, and nbjit with every ring
copying with numpy (a function of its own, whose rings are made while the
threshold is set above the batch). Per batch size: the median per-step
ratio of each nbjit to jax.jit, and whether every loss equals jax.jit's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

import nbjit
from nbjit.core.inputs import staging

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from training_loop import init, step  # noqa: E402  (the benchmark's model)


def streamed_rings(f, args) -> list[bool]:
    """Per staging ring of `f`'s record: whether it copies with non-temporal stores."""
    node, _ = f._entry_for(args, {})
    if node is None or node.record is None:
        return []
    return [stage.__self__.stream is not None for s in node.record.step_objects()
            if (stage := getattr(getattr(s, "transfer", None), "stage", None)) is not None
            and hasattr(stage, "__self__")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json")
    a = parser.parse_args(argv)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; per-step ratio to jax.jit "
          f"(median of {a.rounds} rounds of {a.steps} steps)", flush=True)
    rows = []
    for batch in a.batches:
        rng = np.random.default_rng(0)
        pool = [(rng.standard_normal((batch, 784), np.float32),
                 rng.integers(0, 10, batch).astype(np.int32)) for _ in range(8)]
        params0 = init(jax.random.PRNGKey(0), (784, 512, 512, 10))

        def numpy_step(p, x, y):  # (a function of its own: a record of its own)
            return step(p, x, y)

        fs = {"jax.jit": jax.jit(step), "nbjit": nbjit.jit(step),
              "nbjit, numpy copies": nbjit.jit(numpy_step)}

        def run(f, n, params0=params0, pool=pool):
            p, losses = params0, []
            t0 = time.perf_counter()
            for i in range(n):
                x, y = pool[i % 8]
                p, loss = f(p, x, y)
                losses.append(loss)
            jax.block_until_ready((p, losses))
            return (time.perf_counter() - t0) / n, [float(v) for v in losses]

        saved = staging.STREAM_MIN_BYTES
        for name, f in fs.items():  # the compiles, and the rings
            staging.STREAM_MIN_BYTES = 1 << 62 if name == "nbjit, numpy copies" else saved
            try:
                run(f, 40)
            finally:
                staging.STREAM_MIN_BYTES = saved
        want = run(fs["jax.jit"], a.steps)[1]
        same = {k: run(f, a.steps)[1] == want for k, f in fs.items() if k != "jax.jit"}
        per: dict = {k: [] for k in fs}
        for r in range(a.rounds):
            names = list(fs)
            for k in names[r % 3:] + names[:r % 3]:
                per[k].append(run(fs[k], a.steps)[0])
        jax_s = np.array(per["jax.jit"])
        row = {"batch": batch, "input_bytes": int(sum(v.nbytes for v in pool[0])),
               "jax_step_us": round(float(np.median(jax_s)) * 1e6, 1)}
        for k in fs:
            if k != "jax.jit":
                ratio = np.array(per[k]) / jax_s
                row[k] = {"ratio": round(float(np.median(ratio)), 3),
                          "p10_p90": [round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
                          "losses_equal": same[k],
                          "streamed_rings": streamed_rings(fs[k], (params0, *pool[0]))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
